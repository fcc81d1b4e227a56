"""ncu counters of the contiguous and the paged varlen forward on the same tokens (chunks of 512 queries
over 4k keys, 8 sequences, causal, bf16): `python scripts/paged_probe.py run {contiguous,extras,paged} D`
runs one at head dim D; `python scripts/paged_probe.py [D ...]` (default 64) runs each under ncu and
prints the counters side by side."""
import subprocess
import sys

import torch

METRICS = ["gpu__time_duration.sum", "smsp__inst_executed.sum", "launch__registers_per_thread",
           "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem", "launch__grid_size",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed_op_local_ld.sum",
           "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
           "smsp__average_warp_latency_issue_stalled_barrier", "smsp__average_warp_latency_issue_stalled_long_scoreboard",
           "smsp__average_warp_latency_issue_stalled_short_scoreboard", "dram__bytes_read.sum", "lts__t_bytes.sum"]


def run(which, d):
    from flashattn import flash_attn_varlen_func
    gen = torch.Generator().manual_seed(0)
    cu_q = torch.arange(9, dtype=torch.int32, device="cuda") * 512
    cu_k = torch.arange(9, dtype=torch.int32, device="cuda") * 4096
    q = torch.randn(4096, 32, d, generator=gen).to("cuda", torch.bfloat16)
    k, v = (torch.randn(8 * 4096, 8, d, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
    extra = {}
    if which == "extras":
        extra["alibi_slopes"] = torch.zeros(32, device="cuda")
    if which == "paged":
        perm = torch.randperm(8 * 256, generator=gen)
        k = k.view(8 * 256, 16, 8, d)[perm.argsort()].contiguous()
        v = v.view(8 * 256, 16, 8, d)[perm.argsort()].contiguous()
        extra["block_table"] = perm.view(8, 256).to(torch.int32).cuda()
    flash_attn_varlen_func(q, k, v, cu_q, cu_k, 512, 4096, causal=True, **extra)
    torch.cuda.synchronize()


def profile(which, d):
    command = ["ncu", "--metrics", ",".join(METRICS), "--kernel-name", "regex:fwd_kernel", "--csv", "--page", "raw",
               sys.executable, __file__, "run", which, str(d)]
    out = subprocess.run(command, capture_output=True, text=True)
    rows = [line for line in out.stdout.splitlines() if line.startswith('"')]
    if len(rows) < 3:
        return "ncu failed " + out.stdout[-800:] + out.stderr[-800:]
    head = [h.strip('"') for h in rows[0].split('","')]
    cells = [c.strip('"') for c in rows[2].split('","')]
    return "; ".join(f"{h}={c}" for h, c in zip(head, cells) if h in METRICS)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    for d in [int(a) for a in sys.argv[1:]] or [64]:
        for which in ("contiguous", "extras", "paged"):
            print(f"d{d} {which}: {profile(which, d)}", flush=True)
