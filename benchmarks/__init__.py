"""flashattn's benchmarks: one package, one runner (`python -m benchmarks COMMAND`, from the
repository root; benchmarks/__main__.py lists the commands).

The measurements, shared by every command:
- shapes.py: dtypes, passes, the sweep's sizes, a result Row, a Shape, the Sweep;
- backends.py: flashattn, SDPA's flash, cuDNN and efficient backends, naive attention;
- checks.py: the correctness check before timing, with the tests' bound (flashattn.testing);
- timing.py: triton's do_bench (CUDA events without triton), CPU timing, progress;
- speed.py, peak_memory.py: the speed rows and the peak-memory rows;
- environment.py: the device, the results header (GPU, torch, CUDA, commit, date), the folder;
- tables.py: CSV and Markdown of the rows.

The commands: suite/ (`suite`, scripts/suite.sh: the report with plots; `plots` redraws
them), sweep.py (`sweep`, scripts/bench.sh), features.py, families.py, fp8.py (the FP8
forward against bf16), decode.py, decode_layouts.py, decode_overhead.py, paged.py, parallel.py
(context parallelism over N GPUs). The FLOP formula and the
error bound are flashattn.testing's.
"""
