"""What the register spills of the built kernels cost: where their local-memory accesses sit in the
machine code, and what share of the work they are when the kernels run.

    python scripts/spill_cost.py sass [--so PATH]         # static: every kernel of the built extension
    python scripts/spill_cost.py run WORKLOAD             # one workload, run under ncu by `profile`
    python scripts/spill_cost.py profile [--out FILE]     # ncu counters over each workload (ncu, a GPU)
    python scripts/spill_cost.py stalls [--out FILE]      # ncu's sampled stalls on the spill instructions

`sass` disassembles flashattn/_C*.so (cuobjdump -sass, sm_90a) and prints, per kernel with local
memory accesses (LDL/STL), how many there are and how many lie inside a loop (between a backward
branch and its target): a spill outside every loop runs once per block, one inside runs per tile.
`profile` runs each workload under ncu and prints, per kernel launch, the local load/store
instructions executed against all instructions executed, the local-memory bytes through L1 against
the global bytes, and the kernel's duration. `stalls` samples where each kernel's warps wait (ncu's
SourceCounters, per SASS instruction) and prints the share on LDL/STL: the cost of the spills.
"""
import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name -> (head_dim, causal, pass): the d128 bf16 kernels at S = 8k (B = 2, H = 16), whose sm_90a
# builds spill, and d64 for comparison.
WORKLOADS = {
    "fwd-d128": (128, False, "fwd"),
    "fwd-d128-causal": (128, True, "fwd"),
    "bwd-d128": (128, False, "bwd"),
    "bwd-d128-causal": (128, True, "bwd"),
    "bwd-d64": (64, False, "bwd"),
}
METRICS = [
    "gpu__time_duration.sum",
    "smsp__inst_executed.sum",
    "smsp__inst_executed_op_local_ld.sum",
    "smsp__inst_executed_op_local_st.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
    "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum",
]


def sass(so: Path) -> int:
    text = subprocess.run(["cuobjdump", "-sass", str(so)], capture_output=True, text=True, check=True).stdout
    functions = re.split(r"\n\s+Function : ", text)[1:]
    rows = []
    for body in functions:
        name = body.split("\n", 1)[0].strip()
        loops, local = [], []  # (target, branch) address ranges of backward branches; local op addresses
        for line in body.split("\n"):
            if not (address := re.search(r"/\*([0-9a-f]{4,})\*/", line)):
                continue
            at = int(address[1], 16)
            if (branch := re.search(r"\bBRA\b[^;]*?(0x[0-9a-f]+)", line)) and int(branch[1], 16) < at:
                loops.append((int(branch[1], 16), at))
            if re.search(r"\b(LDL|STL)(\.\w+)*\b", line):
                local.append(at)
        if not local:
            continue
        in_loop = sum(any(lo <= a <= hi for lo, hi in loops) for a in local)
        rows.append((name, len(local), in_loop))
    for name, count, in_loop in sorted(rows, key=lambda r: -r[2]):
        print(f"{count:4d} local ops, {in_loop:4d} inside a loop: {name[:140]}")
    print(f"{len(rows)} kernels with local memory accesses; {sum(r[2] > 0 for r in rows)} with some inside a loop")
    return 0


def report(line: str) -> str:
    print(line, flush=True)
    return line


def save(lines: list[str], out: Path | None) -> int:
    if out is not None:
        out.write_text("\n".join(lines) + "\n")
    return 0


def run_workload(name: str) -> int:
    import torch

    from flashattn import flash_attn_func

    head_dim, causal, pass_ = WORKLOADS[name]
    q, k, v = (torch.randn(2, 8192, 16, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = flash_attn_func(q, k, v, causal=causal)
    if pass_ == "bwd":
        out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    return 0


def profile(out: Path | None) -> int:
    results = []
    for name, (_, _, pass_) in WORKLOADS.items():
        kernel = "regex:fwd_kernel" if pass_ == "fwd" else "regex:bwd_dk_dv_kernel"
        command = ["ncu", "--metrics", ",".join(METRICS), "--kernel-name", kernel, "--csv", "--page", "raw",
                   sys.executable, __file__, "run", name]
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if result.returncode != 0:
            print(result.stdout[-2000:], result.stderr[-2000:])
            return 1
        csv = [line for line in result.stdout.splitlines() if line.startswith('"')]
        head = [h.strip('"') for h in csv[0].split('","')]
        for line in csv[2:]:
            cells = dict(zip(head, (c.strip('"') for c in line.split('","'))))
            number = lambda metric: float(cells[metric].replace(",", ""))  # noqa: E731
            local_inst = number("smsp__inst_executed_op_local_ld.sum") + number("smsp__inst_executed_op_local_st.sum")
            local_bytes = (number("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum")
                           + number("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"))
            row = (f"{name}: {cells['Kernel Name'][:60]}: {number('gpu__time_duration.sum') / 1e3:.1f} us, local "
                   f"ld/st {local_inst:.0f} of {number('smsp__inst_executed.sum'):.0f} instructions "
                   f"({100 * local_inst / number('smsp__inst_executed.sum'):.4f}%), local bytes {local_bytes:.0f} vs "
                   f"global load bytes {number('l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum'):.0f}")
            results.append(report(row))
    return save(results, out)


def stalls(out: Path | None) -> int:
    """Per workload: the share of the kernel's sampled warp stalls that sit on local loads and stores
    (ncu's SourceCounters section, per SASS instruction): the time the spills cost, measured."""
    lines = []
    for name, (_, _, pass_) in WORKLOADS.items():
        kernel = "regex:fwd_kernel" if pass_ == "fwd" else "regex:bwd_dk_dv_kernel"
        command = ["ncu", "--section", "SourceCounters", "--kernel-name", kernel, "--launch-count", "1",
                   "--page", "source", "--print-source", "sass", "--csv", sys.executable, __file__, "run", name]
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        rows = [line for line in result.stdout.splitlines() if line.startswith('"')]
        if result.returncode != 0 or not rows:
            print(f"{name}: ncu failed ({result.returncode}):", result.stdout[-1500:], result.stderr[-1500:])
            return 1
        # The page opens with the kernel's name; the table's header is the first row naming "Source".
        header_row = next((n for n, row in enumerate(rows) if '"Source"' in row or '"# Source"' in row), 0)
        rows = rows[header_row:]
        head = [h.strip('"') for h in rows[0].split('","')]
        source = next((i for i, h in enumerate(head) if h in ("Source", "# Source")), None)
        samples = next((i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All")), None)
        if source is None or samples is None:
            print(f"{name}: columns not found in ncu's source page: {head}")
            return 1
        total = local = 0.0
        for row in rows[1:]:
            cells = [c.strip('"') for c in row.split('","')]
            if len(cells) <= max(source, samples) or not cells[samples].replace(",", "").replace(".", "").isdigit():
                continue
            count = float(cells[samples].replace(",", ""))
            total += count
            if re.search(r"\b(LDL|STL)\b", cells[source]):
                local += count
        line = (f"{name}: {local:.0f} of {total:.0f} sampled warp stalls on LDL/STL "
                f"({100 * local / max(total, 1):.2f}% of the kernel's warp time)")
        lines.append(report(line))
    return save(lines, out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sass")
    p.add_argument("--so", type=Path, default=None)
    p = sub.add_parser("run")
    p.add_argument("workload", choices=list(WORKLOADS))
    p = sub.add_parser("profile")
    p.add_argument("--out", type=Path, default=None)
    p = sub.add_parser("stalls")
    p.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.command == "sass":
        so = args.so or next((ROOT / "flashattn").glob("_C*.so"))
        return sass(so)
    if args.command == "run":
        return run_workload(args.workload)
    if args.command == "stalls":
        return stalls(args.out)
    return profile(args.out)


if __name__ == "__main__":
    sys.exit(main())
