#!/usr/bin/env bash
# The whole GPU round on the GPU machine in one run: build with all cores, the
# GPU tests, compute-sanitizer, the long-context check, the benchmark; logs and
# results go to OUTDIR, a short summary is printed last.
#
#   bash scripts/gpu_round.sh OUTDIR [--all] [--quick] [--no-bench] [--no-sanitize] [--no-long] [-k EXPR]
#
#   --all          run the whole test suite, not only the tests marked gpu
#   --quick        pass --quick to the benchmark (a small subset of the sweep)
#   --no-bench     build and test only
#   --no-sanitize  skip compute-sanitizer (scripts/sanitize.py: four tools, every kernel)
#   --no-long      skip the long-context check (scripts/long_context.py, about a minute)
#   -k EXPR        passed to pytest
#
# OUTDIR gets these files and no subfolders: build.log, tests.log,
# sanitize.log, sanitize.md, long_context.log, long_context.md, bench.log,
# results.csv, results.md, features.csv, env.txt. Tests marked slow are left out of the
# pytest run: the long-context step runs what they wrap. The benchmark runs
# whenever the build succeeded, even after failed tests (with a warning).
# Exit status: non-zero if the build, the tests, the sanitizer, the
# long-context check or the benchmark failed.
set -uo pipefail

usage() { sed -n '2,23s/^# \{0,1\}//p' "$0" >&2; exit 2; }

[ $# -ge 1 ] || usage
case "$1" in -*) usage ;; esac
outdir=$1
shift
all=0 quick=() bench=1 sanitize=1 long=1 kexpr=()
while [ $# -gt 0 ]; do
    case "$1" in
        --all) all=1 ;;
        --quick) quick=(--quick) ;;
        --no-bench) bench=0 ;;
        --no-sanitize) sanitize=0 ;;
        --no-long) long=0 ;;
        -k) [ $# -ge 2 ] || usage; kexpr=(-k "$2"); shift ;;
        -h|--help) usage ;;
        *) echo "gpu_round.sh: unknown argument '$1'" >&2; usage ;;
    esac
    shift
done

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
mkdir -p "$outdir" && outdir="$(cd "$outdir" && pwd)" || exit 1

export PYTHONUNBUFFERED=1
export MAX_JOBS="${MAX_JOBS:-16}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0a}"
export FLASHATTN_BUILD_LOG="$outdir/build.log"

banner() { printf '\n==== %s ====\n' "$*"; }

# ---- build ------------------------------------------------------------------
banner "build (MAX_JOBS=$MAX_JOBS, TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
build_started=$SECONDS
build_rc=0
# shellcheck source=scripts/env.sh
source scripts/env.sh || build_rc=$?
build_s=$((SECONDS - build_started))
if [ "$build_rc" -eq 0 ]; then
    if [ "${FLASHATTN_BUILD:-}" = skipped ]; then
        build_summary="ok, skipped (sources unchanged), set-up ${build_s} s"
    else
        build_summary="ok in ${build_s} s (CUDA kernels: ${FLASHATTN_KERNELS:-?}; ${FLASHATTN_BUILD_SUMMARY:-})"
    fi
else
    build_summary="FAILED after ${build_s} s (see build.log)"
fi
echo "build: $build_summary"

# ---- machine ------------------------------------------------------------------
banner "GPU"
{
    echo "date (UTC): $(date -u '+%Y-%m-%d %H:%M:%S')"
    echo "host: $(uname -a)"
    echo "git commit: $(git rev-parse --short HEAD 2>/dev/null || echo "${FLASHATTN_COMMIT:-unknown}")"
    echo "MAX_JOBS=$MAX_JOBS TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST CUDA_HOME=${CUDA_HOME:-unset}"
    echo "python: ${PY:-none}"
    echo "build: $build_summary"
    echo
    if [ -n "${PY:-}" ]; then
        "$PY" - <<'EOF' 2>&1
import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, "SMs", p.multi_processor_count, "memory", f"{p.total_memory / 2**30:.1f} GiB")
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton not installed")
EOF
    fi
    echo
    "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version 2>&1 || echo "nvcc not found"
    echo
    if command -v nvidia-smi >/dev/null; then nvidia-smi 2>&1; else echo "nvidia-smi not found"; fi
} >"$outdir/env.txt" 2>&1
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit,temperature.gpu,utilization.gpu \
        --format=csv 2>&1
else
    echo "nvidia-smi not found"
fi

# ---- tests ------------------------------------------------------------------
tests_summary="not run (build failed)"
tests_rc=1
if [ "$build_rc" -eq 0 ]; then
    pytest_args=(tests -q -ra)
    if [ "$all" -eq 1 ]; then pytest_args+=(-m "not slow"); else pytest_args+=(-m "gpu and not slow"); fi
    pytest_args+=("${kexpr[@]}")
    banner "tests: pytest ${pytest_args[*]}"
    tests_started=$SECONDS
    "$PY" -m pytest "${pytest_args[@]}" 2>&1 | tee "$outdir/tests.log"
    tests_rc=${PIPESTATUS[0]}
    counts="$(grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected)' "$outdir/tests.log" | tail -n 1 |
              sed -E 's/=+//g; s/^ +| +$//g')"
    tests_summary="${counts:-no pytest summary line} (exit $tests_rc, $((SECONDS - tests_started)) s)"
    [ "$tests_rc" -eq 5 ] && tests_summary="$tests_summary: NO TESTS COLLECTED"
fi

# ---- memory safety --------------------------------------------------------------
sanitize_summary="not run (--no-sanitize)"
sanitize_rc=0
if [ "$build_rc" -ne 0 ]; then
    sanitize_summary="not run (build failed)"
elif [ "$sanitize" -eq 1 ]; then
    banner "compute-sanitizer: memcheck, initcheck, racecheck, synccheck over every kernel"
    sanitize_started=$SECONDS
    "$PY" scripts/sanitize.py "$outdir"
    sanitize_rc=$?
    clean="$(grep -E '^[0-9]+ of [0-9]+ runs clean' "$outdir/sanitize.md" 2>/dev/null)"
    sanitize_summary="${clean:-no sanitize.md} (exit $sanitize_rc, $((SECONDS - sanitize_started)) s); sanitize.md"
fi

# ---- long contexts ----------------------------------------------------------------
long_summary="not run (--no-long)"
long_rc=0
if [ "$build_rc" -ne 0 ]; then
    long_summary="not run (build failed)"
elif [ "$long" -eq 1 ]; then
    banner "long contexts: S = 256k forward + backward, 1M forward"
    long_started=$SECONDS
    "$PY" scripts/long_context.py "$outdir" 2>&1 | tee "$outdir/long_context.log"
    long_rc=${PIPESTATUS[0]}
    verdict="$(grep -oE 'all checks pass|SOME CHECKS FAIL' "$outdir/long_context.md" 2>/dev/null)"
    long_summary="${verdict:-no long_context.md} (exit $long_rc, $((SECONDS - long_started)) s); long_context.md"
fi

# ---- benchmark ----------------------------------------------------------------
bench_summary="not run (--no-bench)"
bench_rc=0
if [ "$build_rc" -ne 0 ]; then
    bench_summary="not run (build failed)"
elif [ "$bench" -eq 1 ]; then
    if [ "$tests_rc" -ne 0 ]; then
        banner "WARNING: TESTS FAILED (exit $tests_rc): the benchmark runs anyway; do not trust its numbers"
    fi
    banner "benchmark"
    bench_started=$SECONDS
    "$PY" -m benchmarks sweep --out "$outdir" --features "${quick[@]}" 2>&1 | tee "$outdir/bench.log"
    bench_rc=${PIPESTATUS[0]}
    bench_summary="exit $bench_rc in $((SECONDS - bench_started)) s; results.csv, results.md"
fi

# ---- summary (last, so it is what the tail of the output shows) ---------------
if [ "$bench" -eq 1 ] && [ -f "$outdir/results.md" ] && [ "$build_rc" -eq 0 ]; then
    banner "results.md"
    cat "$outdir/results.md"
fi
banner "GPU round summary ($outdir)"
printf '%-10s %s\n' "build:" "$build_summary" "tests:" "$tests_summary" "sanitize:" "$sanitize_summary" \
    "long ctx:" "$long_summary" "bench:" "$bench_summary"
[ "$build_rc" -eq 0 ] && [ "$tests_rc" -ne 0 ] && echo "WARNING: tests failed; see tests.log"
[ "$sanitize_rc" -ne 0 ] && echo "WARNING: compute-sanitizer reported errors; see sanitize.md and sanitize.log"
[ "$long_rc" -ne 0 ] && echo "WARNING: the long-context check failed; see long_context.md"
[ "$bench_rc" -ne 0 ] && echo "WARNING: the benchmark failed or flashattn mismatched; see bench.log"

[ "$build_rc" -eq 0 ] && [ "$tests_rc" -eq 0 ] && [ "$sanitize_rc" -eq 0 ] && [ "$long_rc" -eq 0 ] &&
    [ "$bench_rc" -eq 0 ]
