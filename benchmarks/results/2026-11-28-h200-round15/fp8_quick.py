import math, sys, time
import torch
import torch.nn.functional as F
import flashattn
from flashattn import flash_attn_func

torch.manual_seed(0)
dev = "cuda"
FP8 = torch.float8_e4m3fn

def ref(q, k, v, scale, causal, window=(-1, -1), cu_q=None, cu_k=None):
    if cu_q is not None:
        outs, lses = [], []
        for b in range(len(cu_q) - 1):
            o, l = ref(q[None, cu_q[b]:cu_q[b+1]], k[None, cu_k[b]:cu_k[b+1]], v[None, cu_k[b]:cu_k[b+1]], scale, causal, window)
            outs.append(o[0]); lses.append(l[0])
        return torch.cat(outs), torch.cat(lses, dim=-1)
    B, Sq, H, D = q.shape; Sk, Hk = k.shape[1], k.shape[2]
    kk = k.repeat_interleave(H // Hk, dim=2); vv = v.repeat_interleave(H // Hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk.float()) * scale
    i = torch.arange(Sq, device=q.device)[:, None]; j = torch.arange(Sk, device=q.device)[None]
    d = i + Sk - Sq
    left, right = window
    if causal: right = 0
    mask = torch.zeros(Sq, Sk, dtype=torch.bool, device=q.device)
    if left >= 0: mask |= j < d - left
    if right >= 0: mask |= j > d + right
    s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, vv.float()), lse

def case(B, Sq, Sk, H, Hk, D, causal=False, window=(-1, -1), varlen=False, out_dtype=torch.bfloat16, outliers=False):
    q = torch.randn(B, Sq, H, D, device=dev) * 2
    k = torch.randn(B, Sk, Hk, D, device=dev) * 2
    v = torch.randn(B, Sk, Hk, D, device=dev) * 2
    if outliers: k[..., :3] *= 30
    qd = torch.rand(B, Hk, device=dev) * 0.5 + 0.25
    kd = torch.rand(B, Hk, device=dev) * 0.5 + 0.25
    vd = torch.rand(B, Hk, device=dev) * 0.5 + 0.25
    q8, k8, v8 = (t.to(FP8) for t in (q, k, v))
    hq = torch.arange(H, device=dev) // (H // Hk)
    qf = q8.float() * qd[:, None, hq, None]; kf = k8.float() * kd[:, None, :, None]; vf = v8.float() * vd[:, None, :, None]
    scale = 1 / math.sqrt(D)
    wl, wr = window
    if varlen:
        # B sequences of lengths Sq-ish, packed
        lq = [Sq, max(1, Sq // 3), Sq - 5 if Sq > 5 else 1][:B]
        lk = [Sk, max(1, Sk // 2 + 3), Sk - 7 if Sk > 7 else 1][:B]
        cu_q = [0]; cu_k = [0]
        for a in lq: cu_q.append(cu_q[-1] + a)
        for a in lk: cu_k.append(cu_k[-1] + a)
        qp = torch.cat([q8[b, :lq[b]] for b in range(B)]); kp = torch.cat([k8[b, :lk[b]] for b in range(B)]); vp = torch.cat([v8[b, :lk[b]] for b in range(B)])
        qfp = torch.cat([qf[b, :lq[b]] for b in range(B)]); kfp = torch.cat([kf[b, :lk[b]] for b in range(B)]); vfp = torch.cat([vf[b, :lk[b]] for b in range(B)])
        cq = torch.tensor(cu_q, device=dev, dtype=torch.int32); ck = torch.tensor(cu_k, device=dev, dtype=torch.int32)
        out, lse = torch.ops.flashattn.fwd_fp8(qp, kp, vp, qd, kd, vd, scale, causal, wl, wr, cq, ck, max(lq), max(lk), out_dtype)
        ro, rl = ref(qfp, kfp, vfp, scale, causal, window, cu_q, cu_k)
        # 16-bit baseline on the dequantised data
        o16 = flashattn.flash_attn_varlen_func(qfp.to(out_dtype), kfp.to(out_dtype), vfp.to(out_dtype), cq, ck, max(lq), max(lk), softmax_scale=scale, causal=causal, window_size=window)
    else:
        out, lse = torch.ops.flashattn.fwd_fp8(q8, k8, v8, qd, kd, vd, scale, causal, wl, wr, None, None, 0, 0, out_dtype)
        ro, rl = ref(qf, kf, vf, scale, causal, window)
        o16 = flash_attn_func(qf.to(out_dtype), kf.to(out_dtype), vf.to(out_dtype), softmax_scale=scale, causal=causal, window_size=window)
    err = (out.float() - ro).abs()
    e16 = (o16.float() - ro).abs()
    fin = torch.isfinite(rl)
    lerr = (lse - rl)[fin].abs().max().item() if fin.any() else 0.0
    print(f"B{B} Sq{Sq} Sk{Sk} H{H}/{Hk} D{D} causal={causal} win={window} varlen={varlen} {str(out_dtype)[6:]} outl={outliers}: "
          f"out max {err.max().item():.4f} mean {err.mean().item():.5f} (16-bit max {e16.max().item():.4f} mean {e16.mean().item():.5f}) "
          f"ref max {ro.abs().max().item():.2f}; lse max err {lerr:.4f}; nan {torch.isnan(out).any().item()}", flush=True)

def bench(B, S, H, D, causal):
    q = torch.randn(B, S, H, D, device=dev); k = torch.randn(B, S, H, D, device=dev); v = torch.randn(B, S, H, D, device=dev)
    q8, k8, v8 = (t.to(FP8) for t in (q, k, v))
    ones = torch.ones(B, H, device=dev)
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    scale = 1 / math.sqrt(D)
    fns = {
        "fp8": lambda: torch.ops.flashattn.fwd_fp8(q8, k8, v8, ones, ones, ones, scale, causal, -1, -1, None, None, 0, 0, torch.bfloat16),
        "bf16": lambda: flash_attn_func(qb, kb, vb, causal=causal),
    }
    qt, kt, vt = (t.transpose(1, 2) for t in (qb, kb, vb))
    from torch.nn.attention import sdpa_kernel, SDPBackend
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    fns["cudnn"] = cudnn
    flops = 4 * B * H * S * S * D / (2 if causal else 1)
    res = {}
    for name, fn in fns.items():
        try:
            for _ in range(3): fn()
            torch.cuda.synchronize()
            best = 1e9
            for r in range(3):
                st = torch.cuda.Event(enable_timing=True); en = torch.cuda.Event(enable_timing=True)
                st.record()
                for _ in range(10): fn()
                en.record(); torch.cuda.synchronize()
                best = min(best, st.elapsed_time(en) / 10)
            res[name] = flops / best / 1e9
        except Exception as e:
            res[name] = float("nan"); print(name, "failed", str(e)[:200])
    print(f"bench B{B} S{S} H{H} D{D} causal={causal}: " + ", ".join(f"{n} {t:.0f}" for n, t in res.items()) +
          f"  fp8/bf16 {res['fp8']/res['bf16']:.2f} fp8/cudnn {res['fp8']/res['cudnn']:.2f}", flush=True)

what = sys.argv[1] if len(sys.argv) > 1 else "all"
if what in ("all", "correct"):
    for D in (128, 64, 256, 192):
        case(2, 256, 256, 4, 2, D)
        case(2, 100, 300, 4, 1, D, causal=True)
        case(1, 300, 100, 6, 2, D, causal=True, out_dtype=torch.float16)
        case(2, 257, 513, 4, 4, D, window=(64, 17))
        case(3, 200, 333, 4, 2, D, causal=True, varlen=True)
        case(3, 129, 1000, 4, 2, D, varlen=True)
    case(2, 1, 1, 2, 2, 128)
    case(1, 2049, 2049, 2, 1, 128, causal=True)
    case(1, 1000, 1000, 2, 2, 128, outliers=True)
    case(1, 1000, 1000, 2, 2, 256, outliers=True)
if what in ("all", "bench"):
    for D, H in ((128, 16), (256, 8), (64, 32)):
        for S in (2048, 8192):
            for causal in (False, True):
                bench(16384 // S, S, H, D, causal)
