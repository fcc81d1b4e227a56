"""Loads the compiled CUDA kernels, ``flashattn._C``, or says why they are absent.

Importing ``flashattn._C`` registers the CUDA implementations of the operators
(``TORCH_LIBRARY_IMPL`` in csrc/api/flash_api.cpp) for the schemas that
flashattn.ops defines, so flashattn.ops is imported first. ``import flashattn``
always succeeds and CPU tensors always work; the kernels are loaded only when
they can be, and otherwise ``NOT_BUILT_REASON`` says why and gives the one
command that builds them (it is the error a CUDA tensor gets):

* no ``_C``: installed without kernels (a CPU-only torch, no torch, no CUDA
  toolkit, no GPU to build for: setup.py's ``kernel_plan``);
* ``_C`` built against another torch than the installed one (the build facts
  setup.py writes next to it, ``_C.<python tag>.json``, say which): not loaded,
  since a C++ extension is tied to the exact torch ABI and loading it anyway
  fails with an undefined symbol or, worse, a crash;
* ``_C`` present but failing to load: the error, chained in the reason.
"""

import importlib
import importlib.metadata
import importlib.util
import json
import urllib.parse
from pathlib import Path

import torch

from . import ops  # noqa: F401  defines the schemas that flashattn._C registers CUDA kernels for

__all__ = [
    "BUILD_INFO",
    "HAS_CUDA_KERNELS",
    "NOT_BUILT_REASON",
    "cuda_available",
    "check_faults",
    "cuda_unavailable_reason",
    "kernel_family",
    "unsupported_gpu_reason",
]

DEFAULT_ARCH_LIST = "8.0+PTX;9.0a"
MIN_COMPUTE_CAPABILITY = (8, 0)  # the kernels use Ampere instructions (mma.sync, ldmatrix, cp.async)


def _installed_from() -> tuple[str, bool]:
    """(what flashattn was installed from, editable?): a path or git+URL from pip's
    direct_url.json (PEP 610), else a placeholder."""
    try:
        direct = json.loads(importlib.metadata.distribution("flashattn").read_text("direct_url.json") or "")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return "<the flashattn checkout or git+URL>", False
    url = direct.get("url", "")
    if "vcs_info" in direct:
        vcs = direct["vcs_info"]
        return f"{vcs.get('vcs', 'git')}+{url}@{vcs.get('commit_id', '')}".rstrip("@"), False
    if url.startswith("file://"):
        url = urllib.parse.unquote(urllib.parse.urlparse(url).path)
    return url, bool(direct.get("dir_info", {}).get("editable"))


def build_command() -> str:
    """The one command that builds the kernels against the installed torch (setup.py picks
    the archs of the visible GPU's default list; TORCH_CUDA_ARCH_LIST chooses others)."""
    source, editable = _installed_from()
    if editable:  # a checkout: its own tools, no download (scripts/env.sh builds the same way)
        return f"pip install -v --no-build-isolation --no-deps -e {source}"
    return f"pip install -v --force-reinstall --no-deps --no-cache-dir {source}"


def _describe_build(info: dict | None) -> str:
    if info is None:
        return "an unknown torch (no build record beside flashattn._C)"
    return f"torch {info['torch_version']} (CUDA {info['cuda_version']}, archs {info['arch_list']})"


def _read_build_info(origin: str | None) -> dict | None:
    """The build facts setup.py wrote beside the extension, or None."""
    if origin is None:
        return None
    try:
        return json.loads(Path(origin).with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None


def _not_built_reason() -> str:
    if torch.version.cuda is None:
        return (
            f"torch {torch.__version__} is a CPU-only build, so flashattn has no CUDA kernels (CPU tensors "
            f"work); for CUDA tensors install a CUDA build of torch, then build them with: {build_command()}"
        )
    return (
        "flashattn was installed without its CUDA kernels (pip install -v shows why: no CUDA toolkit, no GPU "
        "and no TORCH_CUDA_ARCH_LIST, no torch yet at install time, or FLASHATTN_SKIP_CUDA_BUILD=1); CPU tensors "
        "work. Build them against "
        f"torch {torch.__version__} with: {build_command()} (CUDA_HOME: the toolkit; TORCH_CUDA_ARCH_LIST: "
        f"the GPU architectures, default {DEFAULT_ARCH_LIST!r})"
    )


def _load_extension() -> tuple[str | None, dict | None]:
    """Imports ``flashattn._C`` when it matches the installed torch. Returns (None, build facts)
    once loaded, else (why the kernels are unavailable, build facts or None)."""
    spec = importlib.util.find_spec("flashattn._C")
    if spec is None:
        return _not_built_reason(), None
    info = _read_build_info(getattr(spec, "origin", None))
    installed = f"torch {torch.__version__} (CUDA {torch.version.cuda})"
    rebuild = f"CPU tensors work; rebuild the kernels with: {build_command()}"
    if info is None or (info["torch_version"], info["cuda_version"]) != (torch.__version__, torch.version.cuda):
        return (
            f"flashattn's CUDA kernels were built against {_describe_build(info)} but {installed} is "
            f"installed, so they are not loaded; {rebuild}"
        ), info
    try:
        importlib.import_module("flashattn._C")
    except (ImportError, OSError) as err:
        return f"flashattn's CUDA kernels (built against {_describe_build(info)}) failed to load ({err}); {rebuild}", info
    return None, info


NOT_BUILT_REASON: str | None
BUILD_INFO: dict | None  # what the kernels were built against (setup.py's record), or None
NOT_BUILT_REASON, BUILD_INFO = _load_extension()
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
