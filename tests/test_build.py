"""The build's own invariants, checked without a GPU."""
import importlib.util
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_instantiations_match_generator():
    """csrc/instantiations/ is generated; a hand edit or a stale list fails here."""
    result = subprocess.run([sys.executable, str(ROOT / "csrc" / "generate_instantiations.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_headdim_switch_matches_generator():
    """Every head dim the dispatch switch can pick has a generated instantiation."""
    switch = (ROOT / "csrc" / "common" / "static_switch.h").read_text()
    sys.path.insert(0, str(ROOT / "csrc"))
    try:
        import generate_instantiations as gen
    finally:
        sys.path.pop(0)
    for head_dim in gen.HEAD_DIMS:
        assert f"constexpr static int CONST_NAME = {head_dim};" in switch
    assert switch.count("constexpr static int CONST_NAME") == len(gen.HEAD_DIMS)


def test_kernels_hold_no_torch_headers():
    """Kernel files stay plain CUDA C++: torch headers belong to the binding (csrc/api/) only."""
    for path in (ROOT / "csrc").rglob("*"):
        if path.suffix in {".h", ".cuh", ".cu"} and "api" not in path.relative_to(ROOT / "csrc").parts:
            text = path.read_text()
            assert "#include <torch" not in text and "#include <ATen" not in text, path


def _setup_module():
    """setup.py's helpers, without running setup()."""
    spec = importlib.util.spec_from_file_location("flashattn_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_family_compiles_only_for_its_archs():
    setup = _setup_module()
    arch_list = "8.0+PTX;8.6;9.0a"
    assert setup.gencode_flags(arch_list, "sm80") == [
        "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_80,code=compute_80",
        "-gencode=arch=compute_86,code=sm_86", "-gencode=arch=compute_90a,code=sm_90a"]
    assert setup.gencode_flags(arch_list, "sm90") == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert setup.gencode_flags("8.0", "sm90") == []
    assert setup.gencode_flags("7.5;8.0", "sm80") == ["-gencode=arch=compute_80,code=sm_80"]


def test_every_kernel_source_belongs_to_a_family():
    """Each .cu file is compiled by its family's rule; only the binding is host code."""
    setup = _setup_module()
    for path in (ROOT / "csrc").rglob("*.cu"):
        assert setup.source_family(str(path)) in setup.FAMILY_ARCHS, path
    assert setup.source_family("csrc/api/flash_api.cpp") is None


def test_build_order_starts_the_slowest_sources_first():
    """Every source once; backward kernels before forward kernels before the rest, the ones with
    extras (dropout, ALiBi: the slowest to compile) first within each (ninja starts a fresh build's
    files in this order)."""
    setup = _setup_module()
    sources = [str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.cu")]
    random.Random(0).shuffle(sources)
    ordered = setup.build_order(sources)
    assert sorted(ordered) == sorted(sources)
    kinds = ["bwd" if "_bwd_" in s else "fwd" if "_fwd" in s else "other" for s in ordered]
    assert kinds == sorted(kinds, key=["bwd", "fwd", "other"].index)
    for kind in ("bwd", "fwd"):
        extras = ["_extras" in s for s, k in zip(ordered, kinds) if k == kind]
        assert extras == sorted(extras, reverse=True) and any(extras) and not all(extras), kind


def test_the_binding_compiles_in_the_first_kernel_familys_run():
    """One ninja run per kernel family (its -gencode flags), the binding in the first one's, so that its
    one long file runs beside kernels; every source in exactly one run."""
    setup = _setup_module()
    kernels = setup.build_order(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.cu"))
    sources = ["csrc/api/flash_api.cpp", *kernels]
    groups = setup.compile_groups(sources)
    assert [family for family, _ in groups] == list(setup.FAMILY_ARCHS)
    assert sorted(s for _, group in groups for s in group) == sorted(sources)
    assert groups[0][1][0] == "csrc/api/flash_api.cpp"
    for index, (family, group) in enumerate(groups):
        assert all(setup.source_family(s) == family for s in group[1 if index == 0 else 0:])
    assert setup.compile_groups(["csrc/api/flash_api.cpp"]) == [(None, ["csrc/api/flash_api.cpp"])]
    sm90_only = setup.compile_groups(["csrc/api/flash_api.cpp", "csrc/sm90/dispatch.cu"])
    assert sm90_only == [("sm90", ["csrc/api/flash_api.cpp", "csrc/sm90/dispatch.cu"])]


def test_kernel_families_have_no_cross_includes():
    """common/ includes nothing of a family; a family includes no other family's code, only
    (a newer family, for what it does not serve) an older family's entry points: sm80/sm80.h."""
    csrc = ROOT / "csrc"
    families = [p.name for p in csrc.iterdir() if p.is_dir() and p.name.startswith("sm")]
    for path in csrc.rglob("*"):
        if path.suffix not in {".h", ".cuh", ".cu"} or "instantiations" in path.parts:
            continue
        includes = re.findall(r'#include "([^"]+)"', path.read_text())
        owner = path.relative_to(csrc).parts[0]
        for include in includes:
            top = include.split("/")[0]
            if owner == "common":
                assert top == "common", (path, include)
            elif owner in families:
                delegates = owner > "sm80" and include == "sm80/sm80.h"
                assert top in {"common", owner} or delegates, (path, include)


def _nvcc() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = Path(cuda_home, "bin", "nvcc")
    return str(nvcc) if nvcc.exists() else shutil.which("nvcc")


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc (the CUDA toolkit)")
def test_sm90_sources_compile(tmp_path):
    """CI builds for sm_80 only, which skips the sm90 family (9.0a): compile its dispatch, its host
    code, three forward (16-bit d128 and d64, FP8) and three backward instantiations here
    (compile only, no torch), so that an error in the sm90 sources fails CI (d256's has kernels of
    its own: bwd_slice_consumer's dK/dV and bwd_dq_kernel's dQ); the d64 ones take every variant at once
    (local, softcap; the backward's deterministic too), where ptxas has the least margin (the d64
    forward's three consumer warpgroups hold 160 registers: per-warpgroup key tiles spilled 8-16 B
    in its masked steps until the mask compared constants, round 19). (The
    FP8 d256 kernels spill 40-64 B in their producer's bookkeeping, benchmarks/NOTES.md: d128's do
    not, and it is the one compiled here.) About a minute on two cores."""
    sources = ["csrc/instantiations/sm90_fwd_bf16_hdim128_local_softcap.cu",
               "csrc/instantiations/sm90_fwd_bf16_hdim64_local_softcap.cu",
               "csrc/instantiations/sm90_fwd_fp8_bf16_hdim128.cu",
               "csrc/instantiations/sm90_bwd_bf16_hdim128_local.cu",
               "csrc/instantiations/sm90_bwd_bf16_hdim64_local_softcap_det.cu",
               "csrc/instantiations/sm90_bwd_bf16_hdim256_local_softcap.cu", "csrc/sm90/dispatch.cu",
               "csrc/sm90/tensor_map.cu"]
    procs = [subprocess.Popen([_nvcc(), "-gencode=arch=compute_90a,code=sm_90a", "-std=c++20", "-O3",
                               "--expt-relaxed-constexpr", "-Xptxas=-warn-spills", "-c", str(ROOT / source),
                               f"-I{ROOT / 'csrc'}", "-o", str(tmp_path / (Path(source).stem + ".o"))],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for source in sources]
    for source, proc in zip(sources, procs):
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{source}:\n{output}"
        assert "spill" not in output, f"{source}: ptxas spills registers:\n{output}"


def test_kernels_only_turns_every_other_instantiation_into_a_stub(tmp_path):
    """FLASHATTN_KERNELS_ONLY (kernel work): the named instantiations are compiled as they are;
    every other one is defined once, in a stub file of its family, as a specialization that
    returns cudaErrorNotSupported, so the binding links and an unbuilt kernel's call fails."""
    setup = _setup_module()
    generated = sorted((ROOT / "csrc" / "instantiations").glob("*.cu"))
    sources = ["csrc/api/flash_api.cpp", "csrc/sm90/dispatch.cu"] + [str(p.relative_to(ROOT)) for p in generated]
    kept = setup.stub_unwanted_instantiations(sources, "sm90_fwd_bf16_hdim128, sm80_bwd_fp16_*", tmp_path)
    wanted = [str(p.relative_to(ROOT)) for p in generated
              if p.stem == "sm90_fwd_bf16_hdim128" or p.stem.startswith("sm80_bwd_fp16_")]
    stubs = sorted(tmp_path.glob("*.cu"))
    assert kept == ["csrc/api/flash_api.cpp", "csrc/sm90/dispatch.cu", *wanted,
                    *(os.path.relpath(s, ROOT) for s in stubs)]
    stubbed = {}
    for stub in stubs:
        family = stub.name.split("_")[0]
        for line in stub.read_text().splitlines():
            if line.startswith("template <>"):
                assert line.endswith("{ return cudaErrorNotSupported; }"), line
                stubbed[line] = family
    expected = {}
    for path in generated:
        if str(path.relative_to(ROOT)) not in wanted:
            for declared in setup.STUB_INSTANTIATION.findall(path.read_text()):
                expected[f"template <> {declared} {{ return cudaErrorNotSupported; }}"] = path.name.split("_")[0]
    assert len(expected) == len(generated) - len(wanted)
    assert stubbed == expected
    if _nvcc() is not None:  # a stub is valid CUDA (seconds: it holds no kernel)
        sm80_stub = next(s for s in stubs if s.name.startswith("sm80_"))
        result = subprocess.run([_nvcc(), "-std=c++20", "--expt-relaxed-constexpr", "-c", str(sm80_stub),
                                 f"-I{ROOT / 'csrc'}", "-o", str(tmp_path / "stub.o")],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr


def _run_host_program(tmp_path, name: str, text: str) -> str:
    """Compiles a C++ program over csrc/'s headers for the host (nvcc), runs it, and returns its
    output; the compile and the run must both succeed."""
    source = tmp_path / f"{name}.cu"
    source.write_text(text)
    binary = tmp_path / name
    result = subprocess.run([_nvcc(), "-std=c++20", "--expt-relaxed-constexpr", str(source), f"-I{ROOT / 'csrc'}",
                             "-o", str(binary)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


_SCHEDULE_PROGRAM = r"""
#include <cstdio>
#include "sm90/schedule.h"
using namespace flash::sm90;
int main() {
    // For each (tiles, heads, section): every (tile, head) pair once, and within each
    // section the tiles in order (tile 0, the longest, first), each section's heads only.
    int bad = 0, cases = 0;
    for (int tiles = 1; tiles <= 9; ++tiles)
        for (int heads = 1; heads <= 13; ++heads)
            for (int section = 1; section <= heads; ++section) {
                ++cases;
                static int seen[9][13];
                for (int i = 0; i < tiles; ++i) for (int h = 0; h < heads; ++h) seen[i][h] = 0;
                int last_tile = -1, last_section = -1;
                for (int t = 0; t < tiles * heads; ++t) {
                    const TileOfHead th = tile_in_order(t, tiles, heads, section);
                    if (th.tile < 0 || th.tile >= tiles || th.head < 0 || th.head >= heads) { ++bad; break; }
                    ++seen[th.tile][th.head];
                    const int s = th.head / section;
                    if (s != last_section) { if (s != last_section + 1) ++bad; last_section = s; last_tile = -1; }
                    if (th.tile < last_tile) ++bad;
                    last_tile = th.tile;
                    if (section == 1 && (th.tile != t % tiles || th.head != t / tiles)) ++bad;
                }
                for (int i = 0; i < tiles; ++i) for (int h = 0; h < heads; ++h) bad += seen[i][h] != 1;
            }
    std::printf("cases %d bad %d sections %d %d %d %d\n", cases, bad,
                heads_per_section(2 << 20, 50 << 20, 64), heads_per_section(64 << 20, 50 << 20, 64),
                heads_per_section(1, 50 << 20, 7), heads_per_section(0, 50 << 20, 7));
    return bad != 0;
}
"""


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc (the CUDA toolkit)")
def test_sm90_tile_order_takes_every_tile_once_longest_first_per_section(tmp_path):
    """The sm90 forward's drawn tiles (csrc/sm90/schedule.h), compiled for the host and run: for
    every small (tiles, heads, section), tile_in_order is a bijection onto the (tile, head) pairs,
    each section's heads are taken together with their tiles in order (tile 0, the longest, first),
    and a section of one is the order head after head; heads_per_section fits half of L2 and stays
    in [1, heads]. A wrong order would run some tiles twice and skip others on the GPU."""
    stdout = _run_host_program(tmp_path, "schedule_check", _SCHEDULE_PROGRAM)
    assert stdout.split() == ["cases", "819", "bad", "0", "sections", "12", "1", "7", "7"], stdout


_DETERMINISTIC_GRID_PROGRAM = r"""
#include <cstdio>
#include <vector>
#include "sm90/schedule.h"
using namespace flash::sm90;
int main() {
    // For each grid (tiles, heads, batches) and mask: the run is a quarter of the tiles (all of them
    // under a mask), every (tile, head, batch) is one block's, the first run's blocks are every
    // pair's last `run` tiles, and within a pair a larger key tile has a smaller linear block index.
    int bad = 0, cases = 0;
    for (int tiles = 1; tiles <= 23; ++tiles)
        for (int heads = 1; heads <= 4; ++heads)
            for (int batches = 1; batches <= 3; ++batches)
                for (int masked = 0; masked <= 1; ++masked) {
                    ++cases;
                    const int run = deterministic_run(tiles, masked);
                    if (run != (masked ? tiles : (tiles + 3) / 4) || run < 1 || run > tiles) ++bad;
                    std::vector<long> at(static_cast<size_t>(tiles) * heads * batches, -1);
                    const long blocks = static_cast<long>(tiles) * heads * batches;
                    for (long b = 0; b < blocks; ++b) {
                        const KeyTileOfPair t = deterministic_tile(b, tiles, heads, batches, run);
                        if (t.tile < 0 || t.tile >= tiles || t.head < 0 || t.head >= heads || t.batch < 0 ||
                            t.batch >= batches) { ++bad; break; }
                        long& slot = at[(static_cast<size_t>(t.batch) * heads + t.head) * tiles + t.tile];
                        if (slot != -1) ++bad;
                        slot = b;
                        if (b < static_cast<long>(heads) * batches * run && t.tile < tiles - run) ++bad;
                    }
                    for (int p = 0; p < heads * batches; ++p)
                        for (int tile = 0; tile + 1 < tiles; ++tile) {
                            const long here = at[static_cast<size_t>(p) * tiles + tile];
                            const long before = at[static_cast<size_t>(p) * tiles + tile + 1];
                            if (here < 0 || before < 0 || before >= here) ++bad;
                        }
                }
    // A varlen grid past 2^32 blocks: the last block is the last pair's tile 0, the first block of
    // the last run the first pair's last run's first tile.
    const int tiles = 6001, heads = 1000, batches = 1000, run = deterministic_run(tiles, false);
    const long pairs = static_cast<long>(heads) * batches, blocks = pairs * tiles;
    const KeyTileOfPair last = deterministic_tile(blocks - 1, tiles, heads, batches, run);
    const long last_run = (tiles - 1) / run;
    const KeyTileOfPair first_of_last_run = deterministic_tile(pairs * run * last_run, tiles, heads, batches, run);
    const bool big = blocks > (1L << 32) && last.tile == 0 && last.head == heads - 1 && last.batch == batches - 1 &&
                     first_of_last_run.tile == tiles - 1 - static_cast<int>(last_run) * run &&
                     first_of_last_run.head == 0 && first_of_last_run.batch == 0;
    std::printf("cases %d bad %d big %d\n", cases, bad, big ? 1 : 0);
    return bad != 0 || !big;
}
"""


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc (the CUDA toolkit)")
def test_sm90_deterministic_grid_orders_each_pairs_key_tiles_last_first(tmp_path):
    """The deterministic backward's grid (csrc/sm90/schedule.h), compiled for the host and run: for
    every small grid, masked or not, deterministic_tile is a bijection onto the (key tile, KV head,
    batch) triples, the first run holds every pair's last `run` tiles, and within a pair a larger key
    tile always has a smaller linear block index: the dQ writer of a block waits for exactly those
    blocks, so the reverse would hang the kernel (bwd_kernel.cuh: bwd_dq_writer). Past 2^32 blocks
    (a varlen grid can get there) the 64-bit arithmetic still lands on the right tiles."""
    stdout = _run_host_program(tmp_path, "deterministic_grid_check", _DETERMINISTIC_GRID_PROGRAM)
    assert stdout.split() == ["cases", str(23 * 4 * 3 * 2), "bad", "0", "big", "1"], stdout


_WARPGROUP_WALK_PROGRAM = r"""
#include <cstdio>
#include "common/mask.cuh"
using namespace flash;

// The sm90 forward's walk of one query tile (fwd_kernel.cuh), for each warpgroup of 64 rows: the
// block's last tile (computed where its rows see it), idle steps above its own range, its range
// (the first tile, then masked, whole, masked), the turn of the last P V, idle steps below. Checks
// that every warpgroup takes every tile of the block once, in order, with as many ping-pong turns
// as the others (fewer or more hang the block), computes every tile in which one of its rows sees a
// key, starts its own range with a first step (no P V of a tile before) and continues it with
// steps, and takes a tile unmasked only where each of its rows sees all of it.
// (Where V's tail rows are zeroed, one call site after the first tile, is the kernel's structure, not
// this model's to check: the SASS has one tail barrier and synccheck passes, benchmarks/NOTES.md.)
template <int kBlockM, int kBlockN>
int check(int window_left, int window_right, int seqlen_q, int seqlen_k) {
    const Window window = window_of(window_left, window_right, seqlen_q, seqlen_k);
    int bad = 0;
    for (int m0 = 0; m0 < seqlen_q; m0 += kBlockM) {
        const KeyTileRange block = key_tile_range<kBlockM, kBlockN>(m0, seqlen_q, window);
        const int num_tiles = block.n_end - block.n_begin;
        if (num_tiles <= 0) continue;
        for (int row0 = m0; row0 < m0 + kBlockM; row0 += 64) {
            const KeyTileRange mine = rows_key_tiles<64, kBlockN>(block, row0, seqlen_q, window);
            enum Kind { kIdle, kFirst, kNext };  // idle_step, first_step (no P V before it), step
            int turns = 0, i = 0, n = block.n_end - 1, expected = block.n_end - 1;
            bool pending = false;  // a P whose P V is still to be issued
            auto take = [&](int tile, Kind kind, bool masked) {
                if (tile != expected--) ++bad;
                if (pending != (kind == kNext)) ++bad;  // a step needs the P before it, the others none
                pending = kind != kIdle;
                ++turns, ++i;
                for (int row = row0; row < row0 + 64 && row < seqlen_q; ++row) {
                    const int lo = window.key_begin(row), hi = window.key_end(row);
                    const int n0 = tile * kBlockN, n1 = n0 + kBlockN;
                    const bool sees_some = lo < hi && lo < n1 && hi > n0;
                    const bool sees_all = lo <= n0 && hi >= n1;
                    if (sees_some && kind == kIdle) ++bad;  // a key this row sees, skipped
                    if (kind != kIdle && !masked && !sees_all) ++bad;  // a key it must not see, unmasked
                }
            };
            auto partial = [&](int tile) { return tile >= mine.full_end || tile < mine.full_begin; };
            // The walk's first tile, computed only where the rows see it.
            const bool sees_first = n < mine.n_end;
            take(n, sees_first ? kFirst : kIdle, partial(n)), --n;
            for (; n >= mine.n_end; --n) take(n, kIdle, false);
            if (mine.n_begin < mine.n_end) {
                if (!sees_first) take(n, kFirst, partial(n)), --n;
                for (; n >= mine.full_end; --n) take(n, kNext, true);
                for (; n >= mine.full_begin; --n) take(n, kNext, false);
                for (; n >= mine.n_begin; --n) take(n, kNext, true);
            }
            ++turns, pending = false;  // the last P V's turn (with no P V where no tile was computed)
            for (; n >= block.n_begin; --n) take(n, kIdle, false);
            if (turns != num_tiles + 1 || i != num_tiles || expected != block.n_begin - 1) ++bad;
        }
    }
    return bad;
}

int main() {
    const int windows[][2] = {{-1, -1}, {-1, 0}, {37, -1}, {-1, 11}, {19, 5}, {0, 0}, {40, 0}, {130, 70}, {300, 0}};
    const int lengths[] = {1, 3, 63, 64, 65, 113, 128, 191, 192, 203, 300, 799, 1023, 1024};
    int bad = 0, cases = 0;
    for (const auto& w : windows)
        for (int seqlen_q : lengths)
            for (int seqlen_k : lengths) {
                cases += 4;
                bad += check<192, 128>(w[0], w[1], seqlen_q, seqlen_k);
                bad += check<128, 80>(w[0], w[1], seqlen_q, seqlen_k);
                bad += check<128, 112>(w[0], w[1], seqlen_q, seqlen_k);
                bad += check<128, 176>(w[0], w[1], seqlen_q, seqlen_k);
            }
    std::printf("cases %d bad %d\n", cases, bad);
    return bad != 0;
}
"""


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc (the CUDA toolkit)")
def test_sm90_warpgroups_walk_every_key_tile_once_with_equal_turns(tmp_path):
    """The sm90 forward's per-warpgroup key tiles (csrc/common/mask.cuh: rows_key_tiles), compiled for
    the host and walked as the kernel walks them, over windows, causal masks and awkward lengths: each
    warpgroup of a block takes each of the block's key tiles once in order and as many ping-pong turns
    as the others (a warpgroup with no rows under a window once took extra turns and hung the block),
    computes every tile one of its rows sees, starts its own range with a first step, and leaves a
    tile unmasked only where all its rows see all of it."""
    stdout = _run_host_program(tmp_path, "walk_check", _WARPGROUP_WALK_PROGRAM)
    assert stdout.split() == ["cases", str(9 * 14 * 14 * 4), "bad", "0"], stdout
