# One variant's FP8 rows (run from the repository root, with the variant's tree first on
# PYTHONPATH): correctness cases of the FP8 kernel alone against the fp32 reference on the
# dequantised values (fp8_quick.ref; no 16-bit kernel: a kernels-only build has none), then
# d128 / d256 TFLOP/s, best of 3 x 10 calls, the V^T copy included. AB_DEVICE=cpu: a dry run.
import os, sys
sys.argv = [sys.argv[0], "none"]
exec(open("benchmarks/results/2026-11-28-h200-round14/fp8_quick.py").read())
dev = os.environ.get("AB_DEVICE", "cuda")
import flashattn as _fa
print("flashattn from", _fa.__file__, flush=True)

def check(B, Sq, Sk, H, Hk, D, causal=False, window=(-1, -1)):
    q, k, v = (torch.randn(B, S_, h, D, device=dev) * 2 for S_, h in ((Sq, H), (Sk, Hk), (Sk, Hk)))
    qd, kd, vd = (torch.rand(B, Hk, device=dev) * 0.5 + 0.25 for _ in range(3))
    q8, k8, v8 = (t.to(FP8) for t in (q, k, v))
    hq = torch.arange(H, device=dev) // (H // Hk)
    qf = q8.float() * qd[:, None, hq, None]; kf = k8.float() * kd[:, None, :, None]; vf = v8.float() * vd[:, None, :, None]
    scale = 1 / math.sqrt(D)
    out, lse = torch.ops.flashattn.fwd_fp8(q8, k8, v8, qd, kd, vd, scale, causal, window[0], window[1], None, None, 0, 0,
                                           torch.bfloat16)
    ro, rl = ref(qf, kf, vf, scale, causal, window)
    fin = torch.isfinite(rl)
    print(f"check D{D} {Sq}x{Sk} causal={causal} window={window}: out max err {(out.float() - ro).abs().max().item():.4f} "
          f"lse max err {(lse - rl)[fin].abs().max().item():.4f} nan {torch.isnan(out).any().item()}", flush=True)

if os.environ.get("AB_CHECK", "1") == "1":
    for args, kw in (((2, 256, 256, 4, 2, 128), {}), ((1, 2049, 2049, 2, 1, 128), {"causal": True}),
                     ((2, 257, 513, 4, 4, 128), {"window": (64, 17)}), ((2, 256, 256, 4, 2, 256), {}),
                     ((1, 1000, 1000, 2, 2, 256), {"causal": True})):
        try:
            check(*args, **kw)
        except Exception as e:
            print("check failed:", args, kw, str(e)[:200], flush=True)

def rate(B, S, H, D, causal):
    q, k, v = (torch.randn(B, S, H, D, device=dev).to(FP8) for _ in range(3))
    ones = torch.ones(B, H, device=dev)
    fn = lambda: torch.ops.flashattn.fwd_fp8(q, k, v, ones, ones, ones, 1 / math.sqrt(D), causal, -1, -1, None, None, 0, 0, torch.bfloat16)
    for _ in range(3): fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(3):
        st = torch.cuda.Event(enable_timing=True); en = torch.cuda.Event(enable_timing=True)
        st.record()
        for _ in range(10): fn()
        en.record(); torch.cuda.synchronize()
        best = min(best, st.elapsed_time(en) / 10)
    return 4 * B * H * S * S * D / (2 if causal else 1) / best / 1e9
if dev == "cuda":
    rows = [("d128", 2, 8192, 16, 128, False), ("d128c", 2, 8192, 16, 128, True), ("d256", 2, 8192, 8, 256, False),
            ("d128-2k", 8, 2048, 16, 128, False)]
    line = "RATES " + " ".join(f"{n}={rate(*a):.0f}" for n, *a in rows)
    if os.environ.get("AB_BF16") == "1":  # ours bf16 (sm90), d128 S 8192 non-causal
        q, k, v = (torch.randn(2, 8192, 16, 128, device=dev, dtype=torch.bfloat16) for _ in range(3))
        fn = lambda: flash_attn_func(q, k, v)
        for _ in range(3): fn()
        torch.cuda.synchronize()
        best = 1e9
        for _ in range(3):
            st = torch.cuda.Event(enable_timing=True); en = torch.cuda.Event(enable_timing=True)
            st.record()
            for _ in range(10): fn()
            en.record(); torch.cuda.synchronize()
            best = min(best, st.elapsed_time(en) / 10)
        line += f" bf16={4 * 2 * 16 * 8192 * 8192 * 128 / best / 1e9:.0f}"
    print(line, flush=True)
