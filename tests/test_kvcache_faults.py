"""flash_attn_with_kvcache on CUDA with an index value out of range: the kernel that reads it clamps
it (nothing is read or written out of bounds) and records which argument it was; the next call into
flashattn (or flashattn.check_faults()) raises a RuntimeError naming it, and the process's CUDA
context goes on working: a correct call afterwards gives the same result as before the bad one.

Each case runs in a fresh interpreter, so that a regression to a device trap could not take the
rest of the suite's CUDA context with it.
"""

import subprocess
import sys
import textwrap

import pytest

# B = 2, H = 4, Hk = 2, D = 64, one new token; a paged cache of 8 pages of 16 rows (4 per
# sequence) or, with cache_batch_idx, a contiguous one of 2 sequences x 64 rows.
SCRIPT = textwrap.dedent("""
    import torch
    import flashattn
    from flashattn import flash_attn_with_kvcache

    def i32(*values):
        return torch.tensor(values, dtype=torch.int32, device="cuda")

    torch.manual_seed(0)
    case = dict(q=torch.randn(2, 1, 4, 64, device="cuda", dtype=torch.float16),
                k=torch.randn(2, 1, 2, 64, device="cuda", dtype=torch.float16),
                v=torch.randn(2, 1, 2, 64, device="cuda", dtype=torch.float16),
                k_cache=torch.randn(8, 16, 2, 64, device="cuda", dtype=torch.float16),
                v_cache=torch.randn(8, 16, 2, 64, device="cuda", dtype=torch.float16),
                block_table=torch.arange(8, dtype=torch.int32, device="cuda").reshape(2, 4),
                cache_seqlens=i32(20, 3))
    {valid}

    def run(c):
        c = {{**c, "k_cache": c["k_cache"].clone(), "v_cache": c["v_cache"].clone()}}
        return flash_attn_with_kvcache(**c)

    before = run(case)
    bad = dict(case)
    {change}
    run(bad)
    torch.cuda.synchronize()  # the bad call itself returns; nothing traps
    print("bad call returned", flush=True)
    try:
        {next_call}
        print("no error", flush=True)
    except RuntimeError as error:
        print(f"caught: {{error}}", flush=True)
    after = run(case)
    torch.cuda.synchronize()
    print("same result after" if torch.equal(before, after) else "DIFFERENT RESULT AFTER", flush=True)
    flashattn.check_faults()  # nothing pending any more
    print("clean", flush=True)
""")

PAGED = "pass"
CONTIGUOUS = ("case.pop('block_table'); case['k_cache'] = torch.randn(2, 64, 2, 64, device='cuda', "
              "dtype=torch.float16); case['v_cache'] = torch.randn_like(case['k_cache'])")
ROTARY = ("case['rotary_cos'] = torch.ones(8, 16, device='cuda'); "
          "case['rotary_sin'] = torch.zeros(8, 16, device='cuda'); case['cache_seqlens'] = i32(5, 3)")

CASES = [
    pytest.param(PAGED, "bad['block_table'] = case['block_table'].clone(); bad['block_table'][0, 1] = 10_000",
                 "block_table[0][1] = 10000, outside [0, 7]", id="block_table"),
    pytest.param(PAGED, "bad['cache_seqlens'] = i32(64, 3)", "cache_seqlens[0] = 64, outside [0, 63]",
                 id="cache_seqlens"),
    pytest.param(PAGED, "bad['cache_leftpad'] = i32(0, 4)", "cache_leftpad[1] = 4, outside [0, 3]",
                 id="cache_leftpad"),
    pytest.param(CONTIGUOUS, "bad['cache_batch_idx'] = i32(0, 2)", "cache_batch_idx[1] = 2, outside [0, 1]",
                 id="cache_batch_idx"),
    pytest.param(ROTARY, "bad['cache_seqlens'] = i32(20, 3)",
                 "rotary_cos/rotary_sin row of sequence[0] = 20, outside [0, 7]", id="rotary_rows"),
]


def run_case(valid: str, change: str, next_call: str) -> str:
    script = SCRIPT.format(valid=valid, change=change, next_call=next_call)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.gpu
def test_valid_calls_record_nothing():
    out = run_case(PAGED, "pass", "run(case)")
    assert "no error" in out and "same result after" in out and "clean" in out, out


@pytest.mark.gpu
@pytest.mark.parametrize("valid, change, message", CASES)
def test_the_next_call_raises_the_fault_and_the_context_survives(valid, change, message):
    out = run_case(valid, change, "run(case)")
    assert "bad call returned" in out and f"caught: flashattn: an earlier call on cuda:" in out, out
    assert message in out, out
    assert "same result after" in out and "clean" in out, out


@pytest.mark.gpu
@pytest.mark.parametrize("valid, change, message", CASES[:2])
def test_check_faults_raises_it_without_another_call(valid, change, message):
    out = run_case(valid, change, "flashattn.check_faults()")
    assert message in out and "same result after" in out and "clean" in out, out
