# One 16-bit forward call shape for ncu (run from the repository root): D S causal [B H];
# B * S = 16384 and H * D = 2048 unless given. Three calls; ncu profiles the one it is told to.
import sys, torch
from flashattn import flash_attn_func
D, S, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
B = int(sys.argv[4]) if len(sys.argv) > 4 else 16384 // S
H = int(sys.argv[5]) if len(sys.argv) > 5 else 2048 // D
q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    flash_attn_func(q, k, v, causal=causal)
torch.cuda.synchronize()
