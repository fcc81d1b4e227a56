"""flashattn's benchmark suite: one command, one report folder.

    python -m benchmarks suite [--quick] [--out DIR] [--sections speed,memory,regimes,profile] [--device cpu]

(scripts/suite.sh sets up the environment, builds flashattn, then runs it.)
It writes benchmarks/results/<date>-<gpu-slug>/ (or --out): report.md, a CSV
per section and PNG plots (where matplotlib is installed), with a progress
bar while it runs (a line per measurement where stderr is no terminal or tqdm
is missing). The sections, one module each:

- speed.py: TFLOP/s of the forward, backward and forward + backward over the
  sweep, against SDPA's flash, cuDNN and efficient backends and naive attention;
- memory.py: peak memory against sequence length, where naive attention runs
  out of memory, the longest sequence flashattn runs on the card;
- regimes.py: batch x sequence length, speedup and memory side by side;
- launches.py: CUDA kernel launches and time per kernel (torch.profiler).

The measurements themselves are the benchmarks package's (benchmarks/__init__.py
says where each is); plan.py holds every size, report.py the report, plots.py the
plots (`python -m benchmarks plots DIR` redraws them from the CSVs). On a CPU-only
machine the suite runs flashattn's CPU path against the naive reference and
lists what needs a GPU.
"""
