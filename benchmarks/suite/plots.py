"""The suite's PNG plots. matplotlib is optional: without it the report says the plots were skipped."""
import importlib.util
import sys

from benchmarks.shapes import BACKEND_LABELS, GPU_BACKENDS

COLORS = {"flashattn": "tab:red", "flash": "tab:blue", "cudnn": "tab:green", "fa4": "tab:orange", "efficient": "tab:purple",
          "naive": "tab:gray"}
PASS_NAMES = {"fwd": "one forward", "fwdbwd": "a training step (forward + backward)"}


def missing():
    """Why plots cannot be drawn here, or None."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"matplotlib is not installed for this Python ({sys.executable} -m pip install matplotlib)"
    return None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def _seqlen_axis(ax, seqlens):
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqlens, [f"{s // 2**20}M" if s >= 2**20 else f"{s // 1024}k" if s >= 1024 else str(s)
                            for s in seqlens])
    ax.minorticks_off()
    ax.grid(alpha=0.3)


def speed(rows, dtype, pass_, path, title, unit="TFLOP/s", scale=1.0):
    """Speed against sequence length of one dtype and pass: a subplot per (causal, head
    dim), a line per backend; points that did not run (OOM, n/a) are left out.

    The subplots share one y range, from 0 to above the fastest point of any of them:
    set once all are drawn, since a limit set on one shared axis freezes the others'."""
    plt = _pyplot()
    rows = [r for r in rows if r.kind == "speed" and r.dtype == dtype and r.pass_ == pass_]
    causals = sorted({r.causal for r in rows})
    headdims = sorted({r.headdim for r in rows})
    seqlens = sorted({r.seqlen for r in rows})
    fig, axes = plt.subplots(len(causals), len(headdims), squeeze=False, sharey=True,
                             figsize=(max(4.2 * len(headdims), 6.4), 3.4 * len(causals)), layout="constrained")
    top = 0.0
    for ax_row, causal in zip(axes, causals):
        for ax, headdim in zip(ax_row, headdims):
            for backend in GPU_BACKENDS:
                points = sorted((r.seqlen, r.tflops * scale) for r in rows if r.backend == backend and
                                r.causal == causal and r.headdim == headdim and r.status == "ok")
                if points:
                    ax.plot(*zip(*points), marker="o", color=COLORS[backend], label=BACKEND_LABELS[backend])
                    top = max(top, *(speed for _, speed in points))
            _seqlen_axis(ax, seqlens)
            ax.set_title(f"D={headdim}, {'causal' if causal else 'non-causal'}", fontsize=10)
        ax_row[0].set_ylabel(unit)
    axes[0][0].set_ylim(0, top * 1.08 or 1.0)  # shared: every subplot, with room for the top marker
    for ax in axes[-1]:
        ax.set_xlabel("sequence length S")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=max(1, len(labels)))
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def memory(rows, path, title, capacity=None):
    """Peak memory against sequence length, log-log, one subplot per pass: a line per
    backend, a dotted line where a backend first ran out of memory, grey guides
    growing as S and S^2, and the card's memory (capacity, bytes) where given."""
    plt = _pyplot()
    rows = [r for r in rows if r.kind == "memory"]
    passes = [p for p in PASS_NAMES if any(r.pass_ == p for r in rows)]
    seqlens = sorted({r.seqlen for r in rows})
    unit, size = ("GB", 1e9) if max(r.peak_mem_bytes or 0 for r in rows) >= 1e9 else ("MB", 1e6)
    fig, axes = plt.subplots(1, len(passes), squeeze=False, figsize=(6.4 * len(passes), 4.6),
                             layout="constrained")
    for ax, pass_ in zip(axes[0], passes):
        for backend in GPU_BACKENDS:
            mine = [r for r in rows if r.pass_ == pass_ and r.backend == backend]
            points = sorted((r.seqlen, r.peak_mem_bytes / size) for r in mine if r.status == "ok")
            if not points:
                continue
            ax.plot(*zip(*points), marker="o", color=COLORS[backend], label=BACKEND_LABELS[backend])
            first_oom = min((r.seqlen for r in mine if r.status == "OOM"), default=None)
            if first_oom:
                ax.axvline(first_oom, color=COLORS[backend], linestyle=":",
                           label=f"{BACKEND_LABELS[backend]}: out of memory")
            if backend in ("flashattn", "naive"):
                _guide(ax, points, power=1 if backend == "flashattn" else 2)
        if capacity:
            ax.axhline(capacity / size, color="black", linewidth=0.8, linestyle="--",
                       label=f"the card: {capacity / size:.0f} {unit}")
        _seqlen_axis(ax, seqlens)
        ax.set_yscale("log")
        ax.set_title(PASS_NAMES[pass_], fontsize=10)
        ax.set_xlabel("sequence length S")
        ax.set_ylabel(f"peak memory, inputs included ({unit})")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _guide(ax, points, power):
    """A grey line from a backend's first point to its last S, growing as S^power."""
    (s0, m0), s1 = points[0], points[-1][0]
    ax.plot([s0, s1], [m0, m0 * (s1 / s0) ** power], color="0.6", linewidth=0.8, linestyle="--",
            label="grows as S" if power == 1 else f"grows as S^{power}")
