"""Round 32, call 6 (run as /tmp/t.py from the repository root, FLASHATTN_FA3_LIB set): FP8 d128 causal
against our bf16 and FlashAttention-3's FP8 in one process, cuda-event timing of back-to-back calls."""
import torch
from flashattn import flash_attn_func
from benchmarks.backends import flash_attention_3
fa3,_=flash_attention_3()
def tm(fn,n=20):
    for _ in range(3): fn()
    a,b=torch.cuda.Event(True),torch.cuda.Event(True); a.record()
    for _ in range(n): fn()
    b.record(); torch.cuda.synchronize(); return a.elapsed_time(b)/n
for S,c in ((2048,True),(8192,True),(8192,False)):
    B=16384//S
    q8,k8,v8=(torch.randn(B,S,16,128,device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
    qb,kb,vb=(t.to(torch.bfloat16) for t in (q8,k8,v8))
    one={n:torch.ones(B,16,device="cuda") for n in ("q_descale","k_descale","v_descale")}
    fl=4*B*16*S*S*128/(2 if c else 1)
    r={}
    for rnd in range(2):
      for name,fn in (("fp8",lambda:flash_attn_func(q8,k8,v8,causal=c,**one)),("bf16",lambda:flash_attn_func(qb,kb,vb,causal=c)),("fa3fp8",lambda:fa3.forward(q8,k8,v8,c,128**-.5,one))):
        r[name]=min(r.get(name,1e9),tm(fn))
    print(S,c,{k:round(fl/v/1e9) for k,v in r.items()},"fp8/bf16",round(r["bf16"]/r["fp8"],3),flush=True)
