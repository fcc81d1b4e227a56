# shellcheck shell=bash
# Sourced by scripts/test.sh, scripts/suite.sh, scripts/bench.sh and scripts/gpu_round.sh:
# picks the Python, makes sure the build and test tools are there, builds and
# installs flashattn (editable), and exports what the callers need.
#
#   source scripts/env.sh || exit $?     # returns non-zero on failure
#
# Python: ${PYTHON:-python3} when it already imports torch (the GPU machine:
# torch preinstalled, no network; torch is never installed there), else the
# repo's .venv, created on first use with torch==2.14.1 (taken from local disk
# on the dev and CI machines; a CUDA build that also runs on the CPU).
#
# Environment read:
#   PYTHON                     interpreter to try first (default python3)
#   CUDA_HOME                  CUDA toolkit (default /usr/local/cuda when it has bin/nvcc)
#   TORCH_CUDA_ARCH_LIST       archs to compile (default "8.0+PTX;9.0a")
#   MAX_JOBS                   parallel compile jobs (default: nproc)
#   FLASHATTN_SKIP_CUDA_BUILD  1: install the Python package without compiling the kernels
#   FLASHATTN_KERNELS_WANTED   always (default: CI compiles them without a GPU); if-gpu: compile
#                              them only where torch sees a GPU (suite.sh: a CPU run needs none);
#                              no: never compile (suite.sh --help)
#   FLASHATTN_EXTRA_PACKAGES   packages the caller needs besides the tools (suite.sh: matplotlib);
#                              installed with pip when missing, else reported
#   FLASHATTN_BUILD_LOG        pip's output of this build (default build/logs/env-DATE.log, a new
#                              file per build; the compiler's own log is beside it, compile-DATE.log)
#   FLASHATTN_FORCE_BUILD      1: rebuild even when the sources are unchanged
#   FLASHATTN_KERNELS_ONLY     kernel work: build only the instantiations it names (setup.py)
# Exported: PY (absolute path of the interpreter), CUDA_HOME (when found),
# TORCH_CUDA_ARCH_LIST, MAX_JOBS; FLASHATTN_KERNELS ("built", "not built: why");
# FLASHATTN_BUILD ("skipped", "built in N s"); FLASHATTN_BUILD_SUMMARY (the last
# kernel build's summary line: files, time, register spills, log).
#
# The build is skipped when build/.stamp holds the hash of csrc/, setup.py,
# pyproject.toml, the interpreter, torch version, CUDA_HOME, arch list,
# FLASHATTN_SKIP_CUDA_BUILD and FLASHATTN_KERNELS_ONLY of the last successful build, and that install
# still imports from this tree (with its compiled extension, if it had one).
# The terminal shows the build's progress (setup.py's "flashattn build:" lines).

_fa_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

_fa_log() { printf 'flashattn env: %s\n' "$*"; }
_fa_err() { printf 'flashattn env: ERROR: %s\n' "$*" >&2; }

# pip flags for installing into $PY's environment: a distro Python marked
# externally managed (PEP 668) needs --break-system-packages.
_fa_pip_flags() {
    "$PY" - <<'EOF'
import os, sys, sysconfig
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
print("--break-system-packages" if managed and sys.prefix == sys.base_prefix else "")
EOF
}

_fa_pick_python() {
    local cand="${PYTHON:-python3}"
    if "$cand" -c "import torch" >/dev/null 2>&1; then
        PY="$("$cand" -c 'import sys; print(sys.executable)')"
        return 0
    fi
    local venv="$_fa_root/.venv"
    if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -c "" >/dev/null 2>&1; then
        _fa_log "$venv is broken; recreating it"
        "$cand" -m venv --clear "$venv" || { _fa_err "could not recreate $venv with $cand"; return 1; }
    elif [ ! -x "$venv/bin/python" ]; then
        _fa_log "$cand has no torch; creating $venv"
        "$cand" -m venv "$venv" || { _fa_err "could not create $venv with $cand"; return 1; }
    fi
    PY="$venv/bin/python"
    if ! "$PY" -c "import torch" >/dev/null 2>&1; then
        _fa_log "installing torch==2.14.1 numpy pytest hypothesis ninja setuptools into $venv"
        "$PY" -m pip install torch==2.14.1 numpy pytest hypothesis ninja setuptools ||
            { _fa_err "pip could not install torch into $venv"; return 1; }
    fi
    # Like `activate`: ninja and other console scripts of the venv on PATH.
    export PATH="$venv/bin:$PATH"
}

# numpy, pytest, setuptools>=64 (PEP 660 editable installs; plus wheel for a
# setuptools older than 70.1) importable and a ninja binary on PATH (torch's
# cpp_extension runs `ninja`); pip only for what is missing. hypothesis and
# transformers (pinned: tests/test_transformers.py builds its models from
# transformers' own modeling code, which changes between releases) are
# installed into the repo's .venv; elsewhere (no network) they are only
# reported. transformers without extras requires no torch: the venv's stays.
_fa_ensure_tools() {
    local ninja_dir missing transformers_pin=5.17.0
    if ! command -v ninja >/dev/null 2>&1; then
        ninja_dir="$("$PY" -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null ||
                     "$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
        [ -n "$ninja_dir" ] && export PATH="$ninja_dir:$PATH"
    fi
    missing="$("$PY" - <<'EOF'
import importlib.metadata as md
import importlib.util as iu
missing = [m for m in ("numpy", "pytest") if iu.find_spec(m) is None]
try:
    setuptools = tuple(int(x) for x in md.version("setuptools").split(".")[:2])
except Exception:
    setuptools = (0, 0)
if setuptools < (64, 0):
    missing.append("setuptools>=64")
if setuptools < (70, 1) and iu.find_spec("wheel") is None:
    missing.append("wheel")
print(" ".join(missing))
EOF
)"
    command -v ninja >/dev/null 2>&1 || missing="$missing ninja"
    if [ "$PY" = "$_fa_root/.venv/bin/python" ] && ! "$PY" -c "import hypothesis" >/dev/null 2>&1; then
        missing="$missing hypothesis"
    fi
    if [ "$PY" = "$_fa_root/.venv/bin/python" ] &&
       [ "$("$PY" -c 'import importlib.metadata as md; print(md.version("transformers"))' 2>/dev/null)" != "$transformers_pin" ]; then
        missing="$missing transformers==$transformers_pin"
    fi
    if [ -n "${missing// /}" ]; then
        _fa_log "installing missing tools: $missing"
        # shellcheck disable=SC2046,SC2086  # word splitting is wanted
        "$PY" -m pip install $(_fa_pip_flags) $missing ||
            { _fa_err "could not install $missing for $PY"; return 1; }
        if ! command -v ninja >/dev/null 2>&1; then
            ninja_dir="$("$PY" -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null)"
            [ -n "$ninja_dir" ] && export PATH="$ninja_dir:$PATH"
        fi
    fi
    "$PY" -c "import hypothesis" >/dev/null 2>&1 ||
        _fa_log "note: hypothesis is not installed for $PY; tests that need it will skip"
    "$PY" -c 'import importlib.util as iu, sys; sys.exit(iu.find_spec("transformers") is None)' ||
        _fa_log "note: transformers is not installed for $PY; tests/test_transformers.py will skip"
    local package
    for package in ${FLASHATTN_EXTRA_PACKAGES:-}; do
        "$PY" -c "import $package" >/dev/null 2>&1 && continue
        _fa_log "installing $package into $PY's environment"
        # shellcheck disable=SC2046
        "$PY" -m pip install $(_fa_pip_flags) "$package" ||
            _fa_log "note: could not install $package for $PY (offline?); what needs it is skipped"
    done
}

_fa_cuda_env() {
    if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
        # Else torch guesses CUDA_HOME from an nvcc wrapper on PATH (e.g.
        # /usr/local/bin/nvcc -> /usr/local) and the link fails on -lcudart.
        export CUDA_HOME=/usr/local/cuda
    fi
    export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0+PTX;9.0a}"
    export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
}

# Everything a rebuild depends on, hashed.
_fa_build_hash() {
    (
        cd "$_fa_root" || exit 1
        printf '%s\n' "$PY" "$1" "${CUDA_HOME:-}" "$TORCH_CUDA_ARCH_LIST" "${FLASHATTN_SKIP_CUDA_BUILD:-0}" "${FLASHATTN_KERNELS_ONLY:-}"
        find csrc setup.py pyproject.toml -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 2>/dev/null |
            LC_ALL=C sort -z | xargs -0 -r sha256sum
    ) | sha256sum | cut -d' ' -f1
}

# Prints "built" or "not built: <reason>" for the installed package; fails if it
# does not import from this tree. Runs from / so the source tree is not on sys.path.
_fa_installed_kernels() {
    (
        cd / && "$PY" - "$_fa_root/flashattn" <<'EOF'
import os, sys
import flashattn
where = os.path.realpath(os.path.dirname(flashattn.__file__))
if where != os.path.realpath(sys.argv[1]):
    sys.exit(f"flashattn imports from {where}, not from {sys.argv[1]}")
print("built" if flashattn.HAS_CUDA_KERNELS else f"not built: {flashattn.NOT_BUILT_REASON}")
EOF
    )
}

# Whether torch sees a GPU (for FLASHATTN_KERNELS_WANTED=if-gpu).
_fa_has_gpu() {
    "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1
}

_fa_build() {
    local stamp="$_fa_root/build/.stamp" log hash kernels started flags rc wanted="${FLASHATTN_KERNELS_WANTED:-always}"
    mkdir -p "$_fa_root/build/logs"
    FLASHATTN_BUILD_SUMMARY="$(sed -n 2p "$stamp" 2>/dev/null)"
    if [ "$wanted" != always ] && { [ "$wanted" = no ] || ! _fa_has_gpu; }; then
        if kernels="$(_fa_installed_kernels 2>/dev/null)"; then
            # Installed (editable: the Python code is current) and no kernel can run here or
            # none is wanted: nothing to compile.
            FLASHATTN_KERNELS="$kernels" FLASHATTN_BUILD=skipped
            _fa_log "build skipped: flashattn is installed from this tree and this run needs no kernels ($([ "$wanted" = no ] && echo "FLASHATTN_KERNELS_WANTED=no" || echo "no GPU"))"
            return 0
        fi
        export FLASHATTN_SKIP_CUDA_BUILD=1  # the Python package only: seconds
    fi
    hash="$(_fa_build_hash "$_fa_torch")"
    if [ "${FLASHATTN_FORCE_BUILD:-0}" != 1 ] && [ -f "$stamp" ] &&
       [ "$(head -n 1 "$stamp")" = "$hash" ] && kernels="$(_fa_installed_kernels 2>/dev/null)" &&
       { [ "$kernels" != built ] || compgen -G "$_fa_root/flashattn/_C*.so" >/dev/null; }; then
        FLASHATTN_KERNELS="$kernels" FLASHATTN_BUILD=skipped
        _fa_log "build skipped: csrc/, setup.py and the toolchain are unchanged since the last build${FLASHATTN_BUILD_SUMMARY:+ (which $FLASHATTN_BUILD_SUMMARY)}"
        return 0
    fi
    log="${FLASHATTN_BUILD_LOG:-$_fa_root/build/logs/env-$(date +%Y%m%d-%H%M%S).log}"
    mkdir -p "$(dirname "$log")"
    rm -f "$stamp"
    flags="$(_fa_pip_flags)"
    _fa_log "building flashattn (MAX_JOBS=$MAX_JOBS, TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST${FLASHATTN_SKIP_CUDA_BUILD:+, FLASHATTN_SKIP_CUDA_BUILD=$FLASHATTN_SKIP_CUDA_BUILD}); log: $log"
    started=$SECONDS
    # pip -v streams the build's output: all of it to the log, setup.py's own lines
    # (progress, summary) to the terminal.
    # shellcheck disable=SC2086
    (cd "$_fa_root" && "$PY" -m pip install -v --no-build-isolation --no-deps $flags -e .) 2>&1 |
        tee "$log" | sed -un 's/^ *\(flashattn build: \)/  \1/p'
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        _fa_err "build failed after $((SECONDS - started)) s; last lines of $log:"
        tail -n 40 "$log" >&2
        return 1
    fi
    if ! kernels="$(_fa_installed_kernels 2>>"$log")"; then
        _fa_err "flashattn was installed but does not import; last lines of $log:"
        tail -n 20 "$log" >&2
        return 1
    fi
    FLASHATTN_KERNELS="$kernels" FLASHATTN_BUILD="built in $((SECONDS - started)) s"
    FLASHATTN_BUILD_SUMMARY="$(sed -n 's/^ *flashattn build: \(compiled .*\)/\1/p' "$log" | tail -n 1)"
    printf '%s\n%s\n' "$hash" "$FLASHATTN_BUILD_SUMMARY" >"$stamp"
    _fa_log "built in $((SECONDS - started)) s"
}

_fa_main() {
    _fa_pick_python || return 1
    _fa_ensure_tools || return 1
    _fa_torch="$("$PY" -c 'import torch; print(torch.__version__)')" ||
        { _fa_err "$PY cannot import torch"; return 1; }
    _fa_cuda_env
    _fa_build || return 1
    export PY FLASHATTN_KERNELS FLASHATTN_BUILD FLASHATTN_BUILD_SUMMARY
    _fa_log "python $PY, torch $_fa_torch, CUDA_HOME=${CUDA_HOME:-none}, TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST, MAX_JOBS=$MAX_JOBS, CUDA kernels: $FLASHATTN_KERNELS"
}

_fa_rc=0
_fa_main || _fa_rc=$?
unset -f _fa_log _fa_err _fa_pip_flags _fa_pick_python _fa_ensure_tools _fa_cuda_env \
    _fa_build_hash _fa_installed_kernels _fa_has_gpu _fa_build _fa_main
unset _fa_root _fa_torch
if [ "$_fa_rc" -ne 0 ]; then
    unset _fa_rc
    # shellcheck disable=SC2317  # exit is reached when run instead of sourced
    return 1 2>/dev/null || exit 1
fi
unset _fa_rc
