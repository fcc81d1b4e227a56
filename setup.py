"""Build flashattn: one torch extension, ``flashattn._C``, holding every CUDA kernel.

The extension is built only when a CUDA toolkit and a CUDA build of torch are
present. Otherwise the package installs without it and runs on CPU tensors;
CUDA tensors then get an error that says how to build the kernels.

Each kernel family (csrc/sm80/, later csrc/sm90/) is compiled only for the
archs of TORCH_CUDA_ARCH_LIST that it targets (FAMILY_ARCHS below); the
binding (csrc/api/) is host code.

Environment:
  CUDA_HOME                 the toolkit (default: /usr/local/cuda if it exists)
  TORCH_CUDA_ARCH_LIST      archs to compile for (default "8.0+PTX;9.0a")
  MAX_JOBS                  parallel compile jobs for ninja (default: all cores)
  FLASHATTN_SKIP_CUDA_BUILD=1  install the Python package only
"""
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
DEFAULT_ARCH_LIST = "8.0+PTX;9.0a"


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


def _family_build_ext(base):
    """BuildExtension whose compile step runs once per family, each with that
    family's -gencode flags (torch adds its own only when none are given)."""

    class FamilyBuildExtension(base):
        def build_extension(self, ext):
            compile_all = self.compiler.compile  # BuildExtension's ninja compile

            def compile_by_family(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                                  extra_preargs=None, extra_postargs=None, depends=None):
                objects = []
                for family in [None, *FAMILY_ARCHS]:
                    group = [src for src in sources if source_family(src) == family]
                    if not group:
                        continue
                    postargs = dict(extra_postargs)
                    if family is not None:
                        postargs["nvcc"] = list(postargs["nvcc"]) + gencode_flags(
                            os.environ["TORCH_CUDA_ARCH_LIST"], family)
                    objects += compile_all(group, output_dir, macros, include_dirs, debug, extra_preargs, postargs,
                                           depends)
                return objects

            self.compiler.compile = compile_by_family
            try:
                super().build_extension(ext)
            finally:
                self.compiler.compile = compile_all

    return FamilyBuildExtension


def _write_build_info(**info):
    lines = ['"""Written by setup.py at build time: what the extension was built against."""']
    lines += [f"{key} = {value!r}" for key, value in info.items()]
    (ROOT / "flashattn" / "_build_info.py").write_text("\n".join(lines) + "\n")


def _extension_kwargs():
    import torch

    skip = os.environ.get("FLASHATTN_SKIP_CUDA_BUILD", "0") == "1"
    cuda_home = None if skip else _find_cuda_home()
    if skip or cuda_home is None or torch.version.cuda is None:
        reason = ("FLASHATTN_SKIP_CUDA_BUILD=1" if skip else
                  "no CUDA toolkit found" if cuda_home is None else
                  f"torch {torch.__version__} is a CPU-only build")
        print(f"flashattn: building without CUDA kernels ({reason})", file=sys.stderr)
        _write_build_info(WITH_CUDA=False, TORCH_VERSION=torch.__version__,
                          CUDA_VERSION=None, ARCH_LIST=None, REASON=reason)
        return {}

    os.environ["CUDA_HOME"] = cuda_home  # read by cpp_extension at import
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCH_LIST)
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    csrc = ROOT / "csrc"
    arch_list = os.environ["TORCH_CUDA_ARCH_LIST"]
    families = [family for family in FAMILY_ARCHS if gencode_flags(arch_list, family)]
    sources = ["csrc/api/flash_api.cpp"]
    sources += sorted(str(p.relative_to(ROOT)) for p in csrc.rglob("*.cu") if source_family(str(p)) in families)
    nvcc_flags = [
        "-O3",
        "-lineinfo",                 # source lines in profiles, no runtime cost
        "--expt-relaxed-constexpr",
        "-Xptxas=-warn-spills",      # a spill in the main loop is a bug: make it loud
        "-DNDEBUG",
    ]
    _write_build_info(WITH_CUDA=True, TORCH_VERSION=torch.__version__,
                      CUDA_VERSION=torch.version.cuda,
                      ARCH_LIST=os.environ["TORCH_CUDA_ARCH_LIST"], REASON=None)
    ext = CUDAExtension(
        name="flashattn._C",
        sources=sources,
        include_dirs=[str(csrc)],
        extra_compile_args={"cxx": ["-O3"], "nvcc": nvcc_flags},
    )
    return {"ext_modules": [ext],
            "cmdclass": {"build_ext": _family_build_ext(BuildExtension).with_options(use_ninja=True)}}


if __name__ == "__main__":
    setup(**_extension_kwargs())
