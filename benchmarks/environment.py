"""Where a run happens: the device it picks, the header every result file starts with
(GPU or CPU, torch and CUDA versions, git commit, date), and its results folder."""
import datetime as dt
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.timing import cuda_timers

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_ROOT = REPO_ROOT / "benchmarks" / "results"


def pick_device(requested, prog):
    """('cuda' | 'cpu', why not cuda); exits, naming prog, where the requested device cannot run."""
    from flashattn import _extension
    has_kernels = bool(getattr(_extension, "HAS_CUDA_KERNELS", False))
    has_gpu = torch.cuda.is_available()
    if requested == "cpu":
        return "cpu", "CPU run requested with --device cpu"
    if has_gpu and has_kernels:
        return "cuda", ""
    if has_gpu:
        sys.exit(f"{prog}: a GPU is present but flashattn's CUDA kernels are not loaded "
                 f"({_extension.NOT_BUILT_REASON}); or pass --device cpu for the CPU run.")
    if requested == "cuda":
        sys.exit(f"{prog}: --device cuda, but torch sees no CUDA GPU here.")
    return "cpu", "no CUDA GPU visible to torch"


def start_gpu_run(prog, settings):
    """(timers, header) of a command that needs a GPU (settings: as cuda_timers'); None,
    said on stderr naming prog, where torch sees no CUDA GPU."""
    if not torch.cuda.is_available():
        print(f"{prog}: needs a CUDA GPU", file=sys.stderr)
        return None
    timers, timing = cuda_timers(settings)
    return timers, gpu_header(timing)


def gpu_header(timing):
    """The header of a GPU result file; timing says how calls were timed."""
    props = torch.cuda.get_device_properties(0)
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    return {
        "GPU": props.name,
        "SMs": props.multi_processor_count,
        "GPU memory": f"{props.total_memory} bytes ({props.total_memory / 2**30:.1f} GiB)",
        "torch": torch.__version__,
        "CUDA": torch.version.cuda,
        "triton": triton_version,
        "flashattn build": build_info(),
        "python": platform.python_version(),
        "git commit": git_commit(),
        "date (UTC)": utc_now().strftime("%Y-%m-%d %H:%M"),
        "timing": timing,
    }


def cpu_header(reason):
    """The header of a CPU result file; reason says why it is no GPU run."""
    return {
        "device": f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
        "CUDA": f"{torch.version.cuda} (torch build; {reason})",
        "flashattn build": build_info(),
        "python": platform.python_version(),
        "git commit": git_commit(),
        "date (UTC)": utc_now().strftime("%Y-%m-%d %H:%M"),
        "timing": "time.perf_counter, median of 3-7 calls after one warm-up",
    }


def header_lines(header):
    """The header as Markdown list items."""
    return [f"- {key}: {value}" for key, value in header.items()]


def build_info():
    from flashattn import _extension
    info = _extension.BUILD_INFO
    if info is None:
        return "no CUDA kernels"
    return f"arch list {info['arch_list']}, CUDA {info['cuda_version']}"


def git_commit():
    """The short commit of the checkout, marked where it has uncommitted changes;
    FLASHATTN_COMMIT where the tree is no git checkout."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return os.environ.get("FLASHATTN_COMMIT", "unknown")
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        suffix = " (+ uncommitted changes)" if dirty.stdout.strip() else ""
        return sha.stdout.strip() + suffix
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("FLASHATTN_COMMIT", "unknown")


def utc_now():
    return dt.datetime.now(dt.timezone.utc)


def slug(name):
    """A folder name for a device: 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    name = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def dated_folder(name):
    """benchmarks/results/<YYYY-MM-DD>-<name>, the default results folder of a run."""
    return RESULTS_ROOT / f"{utc_now():%Y-%m-%d}-{name}"


def results_folder(out, default):
    """out (--out), or else default; created."""
    folder = out or default
    folder.mkdir(parents=True, exist_ok=True)
    return folder
