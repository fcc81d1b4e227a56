"""Round 31, call 4's driver: one call each of the paged benchmark's "prefill 8 x 2k" at d128 (causal,
H 32 over Hk 8, bf16), pages of 16 shuffled and the same keys packed, through flashattn (pages
gathered: auto) and through FlashAttention-4 (its page_table with seqused_k; its cp.async gather), after
one warm-up call each outside the profile (FA4 compiles on its first call). Run under ncu with
--profile-from-start off: only the four calls between the profiler's start and stop are profiled."""
import torch

from benchmarks.backends import flash_attention_4
from benchmarks.paged import HEADS, HEADS_K, first, to_pages
from flashattn import flash_attn_varlen_func

fa4, why = flash_attention_4("flash_attn_varlen_func")
assert fa4 is not None, why
lengths, d = [2048] * 8, 128
gen = torch.Generator().manual_seed(0)
cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
q = torch.randn(sum(lengths), HEADS, d, generator=gen).to("cuda", torch.bfloat16)
k, v = (torch.randn(sum(lengths), HEADS_K, d, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
k_pages, v_pages, table = to_pages(k, v, cu, lengths, 16, gen)
used = torch.tensor(lengths, dtype=torch.int32, device="cuda")
calls = {
    "ours contiguous": lambda: flash_attn_varlen_func(q, k, v, cu, cu, 2048, 2048, causal=True),
    "ours paged 16": lambda: flash_attn_varlen_func(q, k_pages, v_pages, cu, cu, 2048, 2048, causal=True,
                                                    block_table=table),
    "fa4 contiguous": lambda: first(fa4(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=2048,
                                        max_seqlen_k=2048, causal=True)),
    "fa4 paged 16": lambda: first(fa4(q, k_pages, v_pages, cu_seqlens_q=cu, seqused_k=used, max_seqlen_q=2048,
                                      max_seqlen_k=2048, page_table=table, causal=True)),
}
want = calls["ours contiguous"]()
for name, call in calls.items():
    print(name, "max diff against ours contiguous", (call().float() - want.float()).abs().max().item(), flush=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for name, call in calls.items():
    torch.cuda.nvtx.range_push(name)
    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
torch.cuda.cudart().cudaProfilerStop()
print("profiled", list(calls), flush=True)
