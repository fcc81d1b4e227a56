"""Round 28, call 6: where the dequantising route's time goes. The FP8 benchmark's "FP8 dequantised"
column (fp8.dequantize, then the bf16 call) costs ~0.7-0.8 ms more than the bf16 call on 3 x 33.5M
e4m3 elements, with the three-pass dequantisation (call 3) and with the two-pass one (call 5)
alike. Times each step on those tensors (triton do_bench medians), a few ways of converting e4m3 to
bf16, and the kernels of one whole dequantising call (torch.profiler)."""
import torch
from triton.testing import do_bench

from flashattn import flash_attn_func, fp8

torch.manual_seed(0)
shape = (8, 2048, 16, 128)
elements = 3 * torch.Size(shape).numel()
stored = [(torch.randn(shape, device="cuda") * 4).to(torch.float8_e4m3fn) for _ in range(3)]
scales = {n: torch.rand(8, 16, device="cuda") * 0.4 + 0.05 for n in ("q_descale", "k_descale", "v_descale")}
q_scale = scales["q_descale"][:, None, :, None]
lut = torch.arange(256, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn).to(torch.bfloat16)


def report(name, fn, bytes_per_element):
    ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
    print(f"{name:58s} {ms:7.3f} ms  {bytes_per_element * elements / ms / 1e6:7.0f} GB/s", flush=True)


report("three tensors: t.to(bf16)", lambda: [t.to(torch.bfloat16) for t in stored], 3)
report("three tensors: t.float()", lambda: [t.float() for t in stored], 5)
report("three tensors: lut[t.view(uint8).int()]", lambda: [lut[t.view(torch.uint8).int()] for t in stored], 3)
report("three tensors: t.view(uint8).to(int16) (no conversion)", lambda: [t.view(torch.uint8).to(torch.int16) for t in stored], 3)
b16 = [t.to(torch.bfloat16) for t in stored]
report("three tensors: bf16 x fp32 (B,1,H,1) in place", lambda: [torch.mul(b, q_scale, out=b) for b in b16], 4)
report("three tensors: bf16 x bf16 (B,1,H,1) in place", lambda: [b.mul_(q_scale.to(torch.bfloat16)) for b in b16], 4)
report("fp8.dequantize (three tensors)", lambda: fp8.dequantize(*stored, scales, torch.bfloat16), 7)
q, k, v = fp8.dequantize(*stored, scales, torch.bfloat16)
report("bf16 flash_attn_func", lambda: flash_attn_func(q, k, v), 0)
report("FP8 route: dequantize + bf16 call", lambda: flash_attn_func(*fp8.dequantize(*stored, scales, torch.bfloat16)), 0)

with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        flash_attn_func(*fp8.dequantize(*stored, scales, torch.bfloat16))
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))
