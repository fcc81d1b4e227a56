"""Build flashattn: one torch extension, ``flashattn._C``, holding every CUDA kernel.

The kernels are compiled against the torch that will import them: the one this
build imports, or, in pip's isolated build environment (which hides the target
environment's packages), the torch of the interpreter pip installs into
(sys.executable), found by a subprocess and appended to sys.path. The build
never installs a torch of its own (pyproject.toml does not require one).

They are compiled only when it can help (`kernel_plan`): a CUDA build of torch,
a CUDA toolkit, and a GPU to build for (a visible one, or TORCH_CUDA_ARCH_LIST
set, e.g. on a login node). Otherwise the package installs without them, in
seconds, works on CPU tensors, and the build says why and the one command that
gets the kernels (`pip install -v` shows it; so does the error a CUDA tensor
gets).

Each kernel family (csrc/sm80/, csrc/sm90/) is compiled only for the archs of
TORCH_CUDA_ARCH_LIST that it targets (FAMILY_ARCHS below); the binding
(csrc/api/) is host code, told which families are in (FLASHATTN_HAS_SM90).

What the extension was built against is written next to it, as
``_C.<python tag>.json`` (in the wheel, or beside the .so of an editable
install), never into the package's sources. The compiler's full output (ptxas
register-spill warnings included) goes to a new log per build under
build/logs/; the terminal (pip -v) gets one line per compiled file (k of n,
elapsed, an estimate of what is left) and a summary that lists the spills.

Environment:
  CUDA_HOME                 the toolkit (default: /usr/local/cuda if it exists)
  TORCH_CUDA_ARCH_LIST      archs to compile for (default "8.0+PTX;9.0a" when a GPU is
                            visible; without a GPU the kernels are built only when it is set)
  MAX_JOBS                  parallel compile jobs for ninja (default: all cores)
  FLASHATTN_SKIP_CUDA_BUILD=1  install the Python package only
  FLASHATTN_LOG_DIR         where the compiler log goes (default: build/logs next to setup.py)
  FLASHATTN_KERNELS_ONLY    for kernel work only: comma-separated patterns (fnmatch) of the
                            instantiations to compile, e.g. "sm90_fwd_bf16_hdim128*"; every
                            other instantiation becomes a stub whose call fails with
                            cudaErrorNotSupported ("operation not supported"). Cuts a build
                            of one kernel from minutes to about one; never for an install.
"""
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
DEFAULT_ARCH_LIST = "8.0+PTX;9.0a"
PREFIX = "flashattn build:"  # every line this build prints for the terminal starts with it
# The one command that (re)builds the kernels against the torch installed where
# pip installs; SOURCE is what was installed (this checkout, or git+URL).
REINSTALL = "pip install -v --force-reinstall --no-deps --no-cache-dir SOURCE"


def say(message: str) -> None:
    """A line for the terminal (pip shows the build's output with -v; scripts/env.sh shows these lines)."""
    print(f"{PREFIX} {message}", flush=True)


def _find_cuda_home():
    """The toolkit root, or None. Prefer an explicit CUDA_HOME; an `nvcc`
    wrapper on PATH would make torch guess the wrong root."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    for candidate in ("/usr/local/cuda",):
        if Path(candidate, "bin", "nvcc").exists():
            return candidate
    nvcc = shutil.which("nvcc")
    if nvcc:
        return str(Path(os.path.realpath(nvcc)).parent.parent)
    return None


def _find_torch():
    """(torch, None) for the torch the kernels must be built against, or (None, why there is none).

    With --no-build-isolation torch imports here. In pip's isolated build
    environment it does not (pyproject.toml requires no torch, so pip never
    downloads one): the torch that will import the kernels is the one of the
    environment pip installs into, whose interpreter runs this build. A
    subprocess of that interpreter, without pip's overlay, finds it; its
    directory goes to the end of sys.path, behind the isolated packages.
    """
    try:
        import torch
        return torch, None
    except ImportError:
        pass
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and "pip-build-env" not in p)
    env.pop("PYTHONNOUSERSITE", None)
    probe = subprocess.run(
        [sys.executable, "-c", "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))"],
        capture_output=True, text=True, env=env, cwd="/")
    if probe.returncode != 0:
        return None, f"no torch in {sys.executable}'s environment at build time"
    sys.path.append(probe.stdout.strip().splitlines()[-1])
    try:
        import torch
    except ImportError as err:
        return None, f"the torch of {sys.executable} does not import in the build environment ({err})"
    return torch, None


def kernel_plan(*, skip: bool, torch_version: str | None, torch_cuda: str | None, cuda_home: str | None,
                arch_list: str | None, gpu_count: int) -> tuple[bool, str]:
    """(build the kernels?, why not and how to get them). Pure, for tests."""
    if skip:
        return False, "FLASHATTN_SKIP_CUDA_BUILD=1"
    if torch_version is None:
        return False, ("no torch was installed when flashattn was built (pip installs it afterwards, as a "
                       f"dependency); build the kernels against it with: {REINSTALL}")
    if torch_cuda is None:
        return False, (f"torch {torch_version} is a CPU-only build (no CUDA tensors, so no kernels to run); "
                       f"for CUDA tensors install a CUDA build of torch, then: {REINSTALL}")
    if cuda_home is None:
        return False, f"no CUDA toolkit found (nvcc); with one: CUDA_HOME=/path/to/cuda {REINSTALL}"
    if not arch_list and gpu_count == 0:
        return False, ("no GPU visible and TORCH_CUDA_ARCH_LIST unset; to build for a GPU from here: "
                       f"TORCH_CUDA_ARCH_LIST=9.0a {REINSTALL}  (8.0 for A100, 8.6 / 8.9 for RTX 30xx / 40xx)")
    return True, ""


# Which entries of TORCH_CUDA_ARCH_LIST each kernel family is compiled for
# ("8.0", "8.6+PTX", "9.0a", ...): sm80 runs on every GPU from sm_80 on; a
# family of Hopper-only instructions (wgmma, TMA: "9.0a") takes that entry alone.
FAMILY_ARCHS = {
    "sm80": lambda arch: float(arch.removesuffix("+PTX").removesuffix("a")) >= 8.0,
    "sm90": lambda arch: arch.removesuffix("+PTX") == "9.0a",
}


def source_family(path: str) -> str | None:
    """The family a source belongs to (csrc/<family>/..., or a generated
    instantiation named <family>_...), or None for host code."""
    parts = Path(path).parts
    for family in FAMILY_ARCHS:
        if family in parts or Path(path).name.startswith(family + "_"):
            return family
    return None


def build_order(sources) -> list[str]:
    """The sources in the order ninja is given them, which is the order it starts them in on a fresh
    build: the slowest first, so that on many cores the build does not end waiting for one long file
    started last. Measured (CI's sm_80 build, round 17): the backward kernels with dropout and ALiBi
    (_extras) take the longest, 9-21 s a file, then the other backward kernels (6-9 s), the forward
    _extras (4-8 s), the other forward kernels (2-4 s); the head dim does not order them. The rest
    (each family's dispatch and tensor-map files, and the binding) last; compile_groups then puts
    the binding at the head of the first family's run. Applied in the compile step (_family_build_ext): distutils
    sorts an extension's sources by name before it compiles them."""
    def cost(path: str):
        name = Path(path).stem
        kind = 0 if "_bwd_" in name else 1 if "_fwd" in name else 2
        return kind, "_extras" not in name, path
    return sorted(sources, key=cost)


def compile_groups(sources) -> list[tuple[str | None, list[str]]]:
    """The compile steps of a build, one ninja run each: (family, its sources) per kernel family,
    which takes that family's -gencode flags, with the host sources (the binding) in the first
    family's run. In a run of their own the binding's one long file (about 20 s: torch's headers)
    held every other core idle."""
    host = [src for src in sources if source_family(src) is None]
    groups = [(family, [src for src in sources if source_family(src) == family]) for family in FAMILY_ARCHS]
    groups = [(family, group) for family, group in groups if group]
    if not groups:
        return [(None, host)] if host else []
    return [(groups[0][0], host + groups[0][1]), *groups[1:]]


def gencode_flags(arch_list: str, family: str) -> list[str]:
    """nvcc -gencode flags for the entries of `arch_list` that `family` targets."""
    flags = []
    for arch in (a.strip() for a in arch_list.replace(" ", ";").split(";")):
        if not arch or not FAMILY_ARCHS[family](arch):
            continue
        name = arch.removesuffix("+PTX").replace(".", "")
        flags.append(f"-gencode=arch=compute_{name},code=sm_{name}")
        if arch.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{name},code=compute_{name}")
    return flags


STUB_INSTANTIATION = re.compile(r"^template (cudaError_t \w+<[^>]*>\([^)]*\));$", re.M)


def stub_unwanted_instantiations(sources: list[str], patterns: str, stub_dir: Path) -> list[str]:
    """FLASHATTN_KERNELS_ONLY: `sources` with the generated instantiations (csrc/instantiations/)
    whose stem matches none of `patterns` taken out, and in their place one stub file per launch
    header that defines each of them as an explicit specialization returning cudaErrorNotSupported.
    The binding links as before and an unbuilt kernel's call fails cleanly instead of running."""
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    kept, stubs = [], {}
    for source in sources:
        path = Path(source)
        if path.parent.name != "instantiations" or any(fnmatch.fnmatch(path.stem, p) for p in wanted):
            kept.append(source)
            continue
        text = (ROOT / path).read_text()
        header = re.search(r'^#include "[^"]+"$', text, re.M)[0]
        namespace = re.search(r"^namespace ([\w:]+) \{$", text, re.M)[1]
        body = stubs.setdefault((path.name.split("_")[0], header, namespace), [])
        body += [f"template <> {m} {{ return cudaErrorNotSupported; }}" for m in STUB_INSTANTIATION.findall(text)]
    stub_dir.mkdir(parents=True, exist_ok=True)
    for old in stub_dir.glob("*.cu"):
        old.unlink()
    for index, ((family, header, namespace), body) in enumerate(sorted(stubs.items())):
        stub = stub_dir / f"{family}_stubs_{index}.cu"  # named for its family: compiled for its archs
        stub.write_text("// Written by setup.py for FLASHATTN_KERNELS_ONLY; not built kernels.\n"
                        f"{header}\n\nnamespace {namespace} {{\n" + "\n".join(body)
                        + f"\n}}  // namespace {namespace}\n")
        kept.append(os.path.relpath(stub, ROOT))
    built = sum(Path(s).parent.name == "instantiations" for s in kept)
    say(f"FLASHATTN_KERNELS_ONLY={patterns!r}: {built} instantiations built, the rest stubs that fail their calls"
        + ("" if built else " (the patterns match no file of csrc/instantiations/)"))
    return kept


def _build_info_path(extension_path: str) -> Path:
    """flashattn/_C.cpython-311-x86_64-linux-gnu.so -> flashattn/_C.cpython-311-x86_64-linux-gnu.json:
    the build facts live with the binary they describe, one file per Python ABI."""
    return Path(extension_path).with_suffix(".json")


SPILL = re.compile(r"Registers are spilled to local memory in function '([^']+)'")
NINJA_STATUS = re.compile(r"^\[(\d+)/(\d+)\] ")
SOURCE_ARG = re.compile(r"(\S+\.(?:cu|cpp))(?:\s|$)")


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class CompileMonitor:
    """Reads what ninja prints (ninja writes to this process's fd 1, as torch runs it) while a
    compile step runs: every line goes to the log; the terminal gets a line per compiled file,
    "[k/n] file, elapsed, about ... left", and compiler errors. Spill warnings are counted per
    file for the summary."""

    def __init__(self, log, label: str):
        self.log, self.label = log, label
        self.compiled = 0
        self.spills: dict[str, list[str]] = {}  # source file -> spilling kernels (mangled names)

    def __enter__(self):
        sys.stdout.flush()
        self.terminal = os.dup(1)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 1)
        os.close(write_end)
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._pump, args=(read_end,), daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        sys.stdout.flush()
        os.dup2(self.terminal, 1)  # the pipe's last writer closes: the reader sees its end
        self.thread.join()
        os.close(self.terminal)
        return False

    def _print(self, line: str) -> None:
        os.write(self.terminal, (line + "\n").encode())

    def _pump(self, read_end: int) -> None:
        current = "?"
        with os.fdopen(read_end, "r", errors="replace") as stream:
            for line in stream:
                self.log.write(line)
                self.log.flush()
                status = NINJA_STATUS.match(line)
                if status:
                    done, total = int(status[1]), int(status[2])
                    sources = SOURCE_ARG.findall(line)
                    current = os.path.relpath(sources[-1], ROOT) if sources else "?"
                    self.compiled += 1
                    elapsed = time.monotonic() - self.started
                    left = elapsed / done * (total - done)
                    self._print(f"{PREFIX} {self.label} [{done}/{total}] {current}, {_minutes(elapsed)} elapsed"
                                + (f", about {_minutes(left)} left" if done < total else ""))
                elif (spill := SPILL.search(line)):
                    self.spills.setdefault(current, []).append(spill[1])
                elif re.search(r"\berror\b|FAILED", line):
                    self._print(line.rstrip("\n"))


def _family_build_ext(base):
    """BuildExtension whose compile step runs once per family, each with that
    family's -gencode flags (torch adds its own only when none are given), that
    reports progress, keeps the compiler's output in a log and writes the build
    facts next to the extension."""

    class FamilyBuildExtension(base):
        def build_extension(self, ext):
            import torch

            compile_all = self.compiler.compile  # BuildExtension's ninja compile
            log_dir = Path(os.environ.get("FLASHATTN_LOG_DIR") or ROOT / "build" / "logs")
            log_dir.mkdir(parents=True, exist_ok=True)
            log_path = log_dir / time.strftime("compile-%Y%m%d-%H%M%S.log")
            spills: dict[str, list[str]] = {}
            compiled = 0
            started = time.monotonic()

            def compile_by_family(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                                  extra_preargs=None, extra_postargs=None, depends=None):
                nonlocal compiled
                objects = []
                for family, group in compile_groups(build_order(sources)):
                    postargs = dict(extra_postargs)
                    if family is not None:
                        postargs["nvcc"] = list(postargs["nvcc"]) + gencode_flags(
                            os.environ["TORCH_CUDA_ARCH_LIST"], family)
                    host = any(source_family(src) is None for src in group)
                    label = (f"{family} kernels" + (" and the binding" if host else "")) if family else "binding"
                    with CompileMonitor(log, label) as monitor:
                        objects += compile_all(group, output_dir, macros, include_dirs, debug, extra_preargs,
                                               postargs, depends)
                    compiled += monitor.compiled
                    for source, kernels in monitor.spills.items():
                        spills.setdefault(source, []).extend(kernels)
                return objects

            say(f"compiling against torch {torch.__version__} (CUDA {torch.version.cuda}) for "
                f"TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']} with MAX_JOBS={os.environ['MAX_JOBS']}; "
                f"compiler output: {log_path}")
            self.compiler.compile = compile_by_family
            try:
                with open(log_path, "w") as log:
                    super().build_extension(ext)
            except Exception:
                say(f"FAILED after {_minutes(time.monotonic() - started)}; the compiler's output: {log_path}")
                raise
            finally:
                self.compiler.compile = compile_all
            summary = f"compiled {compiled} files in {_minutes(time.monotonic() - started)}; "
            if spills:
                count = sum(len(kernels) for kernels in spills.values())
                summary += (f"ptxas: {count} register-spill warnings in {len(spills)} files "
                            f"({', '.join(Path(s).stem for s in sorted(spills))}); details: {log_path}")
            else:
                summary += f"no register spills; compiler output: {log_path}"
            say(summary)
            info = {"torch_version": torch.__version__, "cuda_version": torch.version.cuda,
                    "arch_list": os.environ["TORCH_CUDA_ARCH_LIST"], "python": sys.version.split()[0],
                    "spills": summary}
            if os.environ.get("FLASHATTN_KERNELS_ONLY", "").strip():
                info["kernels_only"] = os.environ["FLASHATTN_KERNELS_ONLY"].strip()
            _build_info_path(self.get_ext_fullpath(ext.name)).write_text(json.dumps(info, indent=1) + "\n")

        def copy_extensions_to_source(self):
            """Editable installs: the build facts go beside the .so in the source tree, as the .so does."""
            super().copy_extensions_to_source()
            build_py = self.get_finalized_command("build_py")
            for ext in self.extensions:
                inplace, regular = self._get_inplace_equivalent(build_py, ext)
                if _build_info_path(regular).exists():
                    shutil.copyfile(_build_info_path(regular), _build_info_path(inplace))

    return FamilyBuildExtension


def _license_kwargs() -> dict:
    """The license as the installed setuptools accepts it without a deprecation warning: an
    SPDX expression from setuptools 77 on (PEP 639), the License field before (the build
    environment's setuptools is the user's own with --no-build-isolation)."""
    import setuptools
    major = int(setuptools.__version__.split(".")[0])
    return {"license_expression": "BSD-3-Clause"} if major >= 77 else {"license": "BSD-3-Clause"}


def _extension_kwargs():
    """setup() arguments: the extension and its build command, or none, with the reason said."""
    skip = os.environ.get("FLASHATTN_SKIP_CUDA_BUILD", "0") == "1"
    torch, no_torch = (None, None) if skip else _find_torch()
    cuda_home = None if skip or torch is None else _find_cuda_home()
    gpu_count = torch.cuda.device_count() if torch is not None and torch.version.cuda and cuda_home else 0
    build, why_not = kernel_plan(
        skip=skip, torch_version=None if torch is None else torch.__version__,
        torch_cuda=None if torch is None else torch.version.cuda, cuda_home=cuda_home,
        arch_list=os.environ.get("TORCH_CUDA_ARCH_LIST"), gpu_count=gpu_count)
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    if not build:
        if no_torch and not why_not.startswith("no torch"):
            why_not = f"{no_torch}; {why_not}"
        if not {"egg_info", "dist_info"} & set(sys.argv):  # said once, by the step that builds
            say(f"installing the Python package without CUDA kernels (CPU tensors work): {why_not}")
        # Its own build directory: setuptools packs whatever lies in build/lib*, and a
        # kernel build's _C*.so left there must not ride along.
        return {"options": {"build": {"build_base": f"build/{tag}-python-only"}}}

    os.environ["CUDA_HOME"] = cuda_home  # read by cpp_extension at import
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCH_LIST)
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    csrc = ROOT / "csrc"
    arch_list = os.environ["TORCH_CUDA_ARCH_LIST"]
    families = [family for family in FAMILY_ARCHS if gencode_flags(arch_list, family)]
    sources = ["csrc/api/flash_api.cpp"]
    sources += sorted(str(p.relative_to(ROOT)) for p in csrc.rglob("*.cu") if source_family(str(p)) in families)
    only = os.environ.get("FLASHATTN_KERNELS_ONLY", "").strip()
    if only:
        sources = stub_unwanted_instantiations(sources, only, ROOT / "build" / "stubs")
    nvcc_flags = [
        "-O3",
        "-lineinfo",                 # source lines in profiles, no runtime cost
        "--expt-relaxed-constexpr",
        "-Xptxas=-warn-spills",      # a spill in the main loop is a bug: make it loud
        "-DNDEBUG",
    ]
    # The binding's family table (csrc/api/family.h) names a family's entry points
    # only when the family is compiled in.
    family_defines = [f"-DFLASHATTN_HAS_{family.upper()}" for family in families if family != "sm80"]
    ext = CUDAExtension(
        name="flashattn._C",
        sources=sources,
        include_dirs=[str(csrc)],
        extra_compile_args={"cxx": ["-O3", *family_defines], "nvcc": nvcc_flags},
    )
    # One build directory per torch: ninja's objects of one torch never meet another's.
    build_base = f"build/{tag}-torch{torch.__version__}"
    return {"ext_modules": [ext],
            "cmdclass": {"build_ext": _family_build_ext(BuildExtension).with_options(use_ninja=True)},
            "options": {"build": {"build_base": build_base}}}


if __name__ == "__main__":
    setup(**_license_kwargs(), **_extension_kwargs())
