"""ncu counters of the contiguous and the paged varlen forward on the same tokens (chunks of 512 queries
over 4k keys, 8 sequences, causal, bf16): `python scripts/paged_probe.py run {contiguous,extras,paged} D`
runs one at head dim D; `python scripts/paged_probe.py [D ...]` (default 64) runs each under ncu and
prints the counters side by side, with the average stall of a warp per reason where ncu knows them all."""
import subprocess
import sys

import torch

METRICS = ["gpu__time_duration.sum", "smsp__inst_executed.sum", "launch__registers_per_thread",
           "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem", "launch__grid_size",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed_op_local_ld.sum",
           "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
           "smsp__average_warp_latency_issue_stalled_barrier", "smsp__average_warp_latency_issue_stalled_long_scoreboard",
           "smsp__average_warp_latency_issue_stalled_short_scoreboard", "dram__bytes_read.sum", "lts__t_bytes.sum"]
# Where a warp waits besides (instruction fetch, fixed latencies, a busy pipe or memory queue, the
# scheduler picking another warp); asked for with METRICS, and left out if this ncu does not know one.
STALLS = [f"smsp__average_warp_latency_issue_stalled_{reason}" for reason in
          ("no_instruction", "wait", "math_pipe_throttle", "mio_throttle", "lg_throttle", "branch_resolving",
           "dispatch_stall", "not_selected", "selected")]


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


def profile(which, d, metrics):
    command = ["ncu", "--metrics", ",".join(metrics), "--kernel-name", "regex:fwd_kernel", "--csv", "--page", "raw",
               sys.executable, __file__, "run", which, str(d)]
    out = subprocess.run(command, capture_output=True, text=True)
    rows = [line for line in out.stdout.splitlines() if line.startswith('"')]
    if len(rows) < 3:
        return None, out.stdout[-800:] + out.stderr[-800:]
    head = [h.strip('"') for h in rows[0].split('","')]
    cells = [c.strip('"') for c in rows[2].split('","')]
    return "; ".join(f"{h}={c}" for h, c in zip(head, cells) if h in metrics), ""


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    for d in [int(a) for a in sys.argv[1:]] or [64]:
        for which in ("contiguous", "extras", "paged"):
            counters, error = profile(which, d, METRICS + STALLS)
            if counters is None:
                counters, error = profile(which, d, METRICS)
            print(f"d{d} {which}: " + (counters if counters is not None else "ncu failed " + error), flush=True)
