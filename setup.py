"""Build flashattn: one torch extension, ``flashattn._C``, holding every CUDA kernel.

The extension is built only when a CUDA toolkit and a CUDA build of torch are
present. Otherwise the package installs without it and runs on CPU tensors;
CUDA tensors then get an error that says how to build the kernels.

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
    sources = ["csrc/flash_api.cpp", "csrc/dispatch.cu", "csrc/kvcache.cu"]
    sources += sorted(str(p.relative_to(ROOT)) for p in (csrc / "instantiations").glob("*.cu"))
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
            "cmdclass": {"build_ext": BuildExtension.with_options(use_ninja=True)}}


setup(**_extension_kwargs())
