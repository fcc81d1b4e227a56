"""Round 32, call 4: the FP8 calls of scripts/sanitize_driver.py (fp8_calls: head dims 64-256, causal,
windows, GQA, varlen), run under compute-sanitizer from a kernels-only tree (every FP8 kernel built)."""
import sys

import torch

sys.path.insert(0, sys.argv[1])  # the repository's scripts/
from sanitize_driver import fp8_calls  # noqa: E402

print(f"fp8 calls completed: {fp8_calls(torch.bfloat16)}", flush=True)
