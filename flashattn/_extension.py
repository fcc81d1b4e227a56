"""Loads the compiled CUDA kernels, ``flashattn._C``, or says why they are absent.

Importing ``flashattn._C`` registers the CUDA implementations of the operators
(``TORCH_LIBRARY_IMPL`` in csrc/api/flash_api.cpp) for the schemas that
flashattn.ops defines, so flashattn.ops is imported first. Three outcomes, none
silent:

* no ``_C`` at all: the package was installed without a CUDA toolkit or with a
  CPU-only torch. Everything works on CPU tensors; ``NOT_BUILT_REASON`` says
  how to build the kernels and is the error a CUDA tensor gets.
* ``_C`` built against another torch than the installed one: ImportError. A
  C++ extension is tied to the exact torch ABI, and loading it anyway fails
  later with an undefined symbol or, worse, a crash.
* ``_C`` present but failing to load: ImportError with the same build facts
  and the original error chained.
"""

import importlib
import importlib.util
import sys
from types import ModuleType

import torch

from . import ops  # noqa: F401  defines the schemas that flashattn._C registers CUDA kernels for

__all__ = [
    "HAS_CUDA_KERNELS",
    "NOT_BUILT_REASON",
    "cuda_available",
    "check_faults",
    "cuda_unavailable_reason",
    "kernel_family",
    "unsupported_gpu_reason",
]

BUILD_COMMAND = "CUDA_HOME=/usr/local/cuda pip install --no-build-isolation -e ."
DEFAULT_ARCH_LIST = "8.0+PTX;9.0a"
MIN_COMPUTE_CAPABILITY = (8, 0)  # the kernels use Ampere instructions (mma.sync, ldmatrix, cp.async)

_BUILD_HINT = (
    f"{BUILD_COMMAND} (TORCH_CUDA_ARCH_LIST picks the GPU architectures, default {DEFAULT_ARCH_LIST!r})"
)


def _read_build_info() -> ModuleType | None:
    """flashattn/_build_info.py, written by setup.py, or None when it is missing."""
    try:
        return importlib.import_module("flashattn._build_info")
    except ImportError:
        return None


def _describe_build(info: ModuleType | None) -> str:
    if info is None:
        return "an unknown torch (flashattn/_build_info.py is missing)"
    if not info.WITH_CUDA:
        return f"torch {info.TORCH_VERSION} without CUDA"
    return f"torch {info.TORCH_VERSION} (CUDA {info.CUDA_VERSION}, archs {info.ARCH_LIST})"


def _not_built_reason(info: ModuleType | None) -> str:
    if info is not None and info.WITH_CUDA:
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        problem = (
            f"flashattn's CUDA kernels are missing (flashattn/_build_info.py records a build against "
            f"{_describe_build(info)}, but there is no flashattn._C for this Python {python}: a build "
            "for another Python, or a build that failed)"
        )
    else:
        why = getattr(info, "REASON", None) or "no CUDA toolkit or a CPU-only torch at install time"
        problem = f"flashattn's CUDA kernels were not built ({why})"
    return f"{problem}; CPU tensors work, CUDA tensors need the kernels; build them with: {_BUILD_HINT}"


def _matches_installed_torch(info: ModuleType | None) -> bool:
    """Whether the build info describes a CUDA build against exactly the installed torch."""
    return (
        info is not None
        and info.WITH_CUDA
        and (info.TORCH_VERSION, info.CUDA_VERSION) == (torch.__version__, torch.version.cuda)
    )


def _load_extension() -> str | None:
    """Imports ``flashattn._C``. Returns None once loaded, or why the kernels were not built."""
    if importlib.util.find_spec("flashattn._C") is None:
        return _not_built_reason(_read_build_info())
    info = _read_build_info()
    installed = f"torch {torch.__version__} (CUDA {torch.version.cuda})"
    mismatch = (
        f"flashattn's CUDA extension was built against {_describe_build(info)} but {installed} "
        f"is installed; rebuild with: {_BUILD_HINT}"
    )
    if not _matches_installed_torch(info):
        raise ImportError(mismatch)
    try:
        importlib.import_module("flashattn._C")
    except (ImportError, OSError) as err:
        raise ImportError(f"flashattn's CUDA extension failed to load ({err}). {mismatch}") from err
    return None


NOT_BUILT_REASON: str | None = _load_extension()
HAS_CUDA_KERNELS: bool = NOT_BUILT_REASON is None


def unsupported_gpu_reason(device: torch.device) -> str | None:
    """Why the kernels cannot run on this CUDA device, or None when they can.

    Reads ``get_device_properties``, which torch.compile folds to a constant,
    so the check costs nothing in a compiled graph.
    """
    props = torch.cuda.get_device_properties(device)
    if (props.major, props.minor) >= MIN_COMPUTE_CAPABILITY:
        return None
    return (
        f"flashattn needs a GPU of compute capability sm_80 (Ampere) or newer; {device} is a "
        f"{props.name} (sm_{props.major}{props.minor})"
    )


def cuda_unavailable_reason() -> str | None:
    """Why flashattn cannot run on CUDA tensors here (kernels not built, no GPU, GPU too old),
    or None when it can. The GPU tests print it when they skip."""
    if not HAS_CUDA_KERNELS:
        return NOT_BUILT_REASON
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch"
    return unsupported_gpu_reason(torch.device("cuda", torch.cuda.current_device()))


def cuda_available() -> bool:
    """Whether flash_attn_func can run on the current CUDA device."""
    return cuda_unavailable_reason() is None


def kernel_family(device: torch.device | int | str | None = None) -> str:
    """The kernel family that serves calls on a CUDA device (default: the current
    one): "sm80" today (csrc/sm80/, mma.sync). The binding picks it from the
    compute capability; FLASHATTN_FAMILY forces one (README, "Kernel families")."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    index = torch.cuda.current_device() if device is None else torch.cuda._get_device_index(device)
    return importlib.import_module("flashattn._C").kernel_family(index)


def check_faults(device: torch.device | int | str | None = None) -> None:
    """Raises RuntimeError if a kernel on this CUDA device (default: the current one) met an index
    out of range (cache_seqlens, cache_leftpad, cache_batch_idx, block_table entries, rotary
    positions: values only the GPU reads) since the last check. Such a kernel clamps the index, so
    nothing is read or written out of bounds and the CUDA context stays usable, but that call's
    outputs and appended cache rows are not valid. The next flashattn call on the device raises the
    same error; calling this after synchronising tells which request it was. No-op without CUDA."""
    if not HAS_CUDA_KERNELS or not torch.cuda.is_available():
        return
    index = torch.cuda.current_device() if device is None else torch.cuda._get_device_index(device)
    importlib.import_module("flashattn._C").check_faults(index)
