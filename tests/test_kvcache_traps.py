"""flash_attn_with_kvcache on CUDA with an index value out of range: the kernel that reads it prints
which argument and traps before anything is read or written out of bounds.

A trap leaves the CUDA context unusable, so each case runs in a fresh interpreter: the case
script makes one call, synchronises, and reports the error it got (exit status 3). The test
asserts the error and the kernel's message naming the argument and its range. A valid call
through the same script exits 0, so the harness itself can tell the two apart.
"""

import subprocess
import sys
import textwrap

import pytest

# B = 2, H = 4, Hk = 2, D = 64, one new token; a paged cache of 8 pages of 16 rows (4 per
# sequence) or, with cache_batch_idx, a contiguous one of 2 sequences x 64 rows.
SCRIPT = textwrap.dedent("""
    import sys
    import torch
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
    {change}
    try:
        flash_attn_with_kvcache(**case)
        torch.cuda.synchronize()
    except Exception as error:  # the trap surfaces here, at the synchronisation
        print(f"caught {{type(error).__name__}}: {{error}}", flush=True)
        sys.exit(3)
    print("completed", flush=True)
""")

CONTIGUOUS = ("case.pop('block_table'); case['k_cache'] = torch.randn(2, 64, 2, 64, device='cuda', "
              "dtype=torch.float16); case['v_cache'] = torch.randn_like(case['k_cache'])")

CASES = [
    pytest.param("case['block_table'][0, 1] = 10_000", "block_table[0][1] = 10000 is outside [0, 7]",
                 id="block_table"),
    pytest.param("case['cache_seqlens'] = i32(64, 3)", "cache_seqlens[0] = 64 is outside [0, 63]",
                 id="cache_seqlens"),
    pytest.param("case['cache_leftpad'] = i32(0, 4)", "cache_leftpad[1] = 4 is outside [0, 3]", id="cache_leftpad"),
    pytest.param(CONTIGUOUS + "; case['cache_batch_idx'] = i32(0, 2)", "cache_batch_idx[1] = 2 is outside [0, 1]",
                 id="cache_batch_idx"),
    pytest.param("case['rotary_cos'] = torch.ones(8, 16, device='cuda'); "
                 "case['rotary_sin'] = torch.zeros(8, 16, device='cuda')",
                 "rotary_cos/rotary_sin row of sequence[0] = 20 is outside [0, 7]", id="rotary_rows"),
]


def run_case(change: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT.format(change=change)], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.gpu
def test_valid_call_completes():
    result = run_case("pass")
    assert result.returncode == 0 and "completed" in result.stdout, result.stdout + result.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("change, message", CASES)
def test_index_out_of_range_traps_with_its_name(change, message):
    result = run_case(change)
    output = result.stdout + result.stderr
    assert result.returncode == 3 and "caught" in result.stdout, output
    assert f"flashattn: {message}" in output, output
