"""The wide single-tree path (``ddtree_build_tree_wide``, kernels/tree_build/tree_build_wide.cuh) run on the
CPU like the other tree kernels (every thread of the block a host thread, barriers and warp collectives
emulated, AddressSanitizer over the exact shared memory ``plan_launch`` plans). Its trees must equal the
reference's on every input kind, a sampled set of budgets 1...1024 (odd, powers of two, 1024), both mask
formats, SGLang's regime (L = N rows of K = N columns), and hand-made inputs where the certificate fails
and the block must fall back to its exact sequential heap."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_inputs import KINDS, topk_inputs
from host_programs import assert_trees_equal_reference, host_program, run_tree_emulator

from ddtree_bench.builders.gpu import FLAG_FORCE_HEAP, plan_launch
from ddtree_bench.builders.reference import build_one
from ddtree_bench.tree import TreeBatch, first_difference, packed_visibility

H200_SHARED = 232448
UNWRITTEN = 0x5A
STAT_WIDE, STAT_FORCED, STAT_NOT_CERTIFIED, STAT_OVERFLOW = 5, 3, 6, 7

EMULATOR_MAIN = r"""
enum { EMU_SYNCWARP, EMU_BALLOT, EMU_REDUX, EMU_SHFL, EMU_MATCH, EMU_SYNCTHREADS, EMU_KERNEL_END,
       EMU_BLOCK_START };
#define EMU_KIND_NAMES {"__syncwarp", "__ballot_sync", "__reduce_max_sync", "__shfl_sync", \
                        "__match_any_sync", "__syncthreads", "the kernel's end", "the block's start"}
#include "host_emulator.h"
#include "host_warp_intrinsics.h"
static void __syncthreads() { emu_meet(EMU_SYNCTHREADS); }
#include "tree_build.cu"
#include "host_tree_io.h"

static long long B, L, K, N, cap, flags;
static unsigned long long shared_bytes;
static float* lp;
static long long* ids;
static EmuTrees out;

static void* emu_thread(void* arg) {
    threadIdx.x = static_cast<unsigned int>(reinterpret_cast<size_t>(arg));
    for (unsigned int bx = 0; bx < gridDim.x; ++bx) {
        if (threadIdx.x == 0) std::memset(emu_shared, 0xA5 ^ (bx & 0xFF), shared_bytes);
        emu_meet(EMU_BLOCK_START);
        blockIdx.x = bx;
        ddtree_build_tree_wide(lp, ids, static_cast<int>(B), static_cast<int>(L), static_cast<int>(K),
                               static_cast<int>(N), static_cast<int>(cap), static_cast<int>(flags),
                               out.counts, out.tokens, out.depths, out.parents, out.bits, out.next_token,
                               out.next_sibling, out.stats, nullptr, out.visibility);
        emu_meet(EMU_KERNEL_END);
    }
    return nullptr;
}

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* f = std::fopen(argv[1], "rb");
    long long header[9];
    if (!f || std::fread(header, 8, 9, f) != 9) return 2;
    B = header[0]; L = header[1]; K = header[2]; N = header[3]; cap = header[4]; flags = header[5];
    blockDim.x = static_cast<unsigned int>(header[6]);
    const bool with_bool = header[7] != 0;
    shared_bytes = static_cast<unsigned long long>(header[8]);
    lp = read_array<float>(f, B * L * K);
    ids = read_array<long long>(f, B * L * K);
    std::fclose(f);
    out.allocate(B, N, with_bool);
    emu_shared = static_cast<unsigned char*>(std::aligned_alloc(16, (shared_bytes + 15) / 16 * 16));
    gridDim.x = static_cast<unsigned int>(B);
    if (!emu_run_block_threads(emu_thread)) return 3;
    if (!out.write(argv[2])) return 3;
    out.release();
    std::free(lp); std::free(ids); std::free(emu_shared);
    return 0;
}
"""


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    flags = ["-ffp-contract=off", f"-DUNWRITTEN={UNWRITTEN}", "-Wno-unused-function"]
    return host_program(tmp_path_factory, "tree_build_wide_emulator", EMULATOR_MAIN, flags)


def run_wide(emulator, lp, ids, budget, tmp_path, with_bool=True, force_heap=False, threads=None, cap=None):
    batch, depth, k = lp.shape
    plan = plan_launch(batch, depth, k, budget, H200_SHARED, path="wide")
    threads = plan.threads if threads is None else threads
    cap = plan.cap if cap is None else cap
    flags = FLAG_FORCE_HEAP if force_heap else 0
    header = [batch, depth, k, budget, cap, flags, threads, int(with_bool), plan.shared_bytes]
    data, out = tmp_path / "in.bin", tmp_path / "out.bin"
    with open(data, "wb") as f:
        np.array(header, np.int64).tofile(f)
        np.ascontiguousarray(lp, np.float32).tofile(f)
        np.ascontiguousarray(ids, np.int64).tofile(f)
    return run_tree_emulator(emulator, data, out, batch, budget, with_bool)


def assert_wide_equals_reference(emulator, lp, ids, budget, tmp_path, with_bool=True, **launch):
    trees, bits, stats = run_wide(emulator, lp, ids, budget, tmp_path, with_bool, **launch)
    assert_trees_equal_reference(trees, bits, lp, ids, budget, with_bool)
    return stats


def test_wide_emulator_has_address_sanitizer(emulator):
    if not emulator.sanitized:
        pytest.skip("the C++ compiler here has no AddressSanitizer (the emulator still runs, unchecked)")


SMALL_BUDGETS = [1, 2, 3, 5, 8, 13, 16, 31, 32, 33, 64, 65, 100, 127, 128]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("budget", SMALL_BUDGETS)
def test_wide_equals_reference_l16(emulator, kind, budget, tmp_path):
    lp, ids = topk_inputs(kind, 2, 16, budget, seed=budget)
    stats = assert_wide_equals_reference(emulator, lp, ids, budget, tmp_path, with_bool=budget % 2 == 1)
    if kind in ("uniform", "peaked"):
        assert (stats == STAT_WIDE).all()  # continuous inputs: certified
    assert set(stats.tolist()) <= {STAT_WIDE, STAT_NOT_CERTIFIED, STAT_OVERFLOW}


@pytest.mark.parametrize("kind", ["uniform", "peaked", "bf16", "tied", "certain", "tiny"])
@pytest.mark.parametrize("budget", [1, 2, 7, 8, 16, 17, 32, 63, 64, 100, 128, 255, 256])
def test_wide_sglang_regime(emulator, kind, budget, tmp_path):
    """SGLang's worker: L = N rows of K = N columns (trees may be as deep as N)."""
    lp, ids = topk_inputs(kind, 1, budget, budget, seed=3 * budget + 1)
    stats = assert_wide_equals_reference(emulator, lp, ids, budget, tmp_path, with_bool=budget <= 64)
    if kind in ("uniform", "peaked"):
        assert (stats == STAT_WIDE).all()


@pytest.mark.parametrize("kind", ["uniform", "peaked", "bf16"])
@pytest.mark.parametrize("budget", [257, 511, 512, 1024])
def test_wide_large_budgets(emulator, kind, budget, tmp_path):
    lp, ids = topk_inputs(kind, 1, 16, budget, seed=budget)
    stats = assert_wide_equals_reference(emulator, lp, ids, budget, tmp_path, with_bool=budget == 512)
    if kind != "bf16":
        assert (stats == STAT_WIDE).all()


@pytest.mark.parametrize("budget", [512, 1024])
def test_wide_sglang_regime_large(emulator, budget, tmp_path):
    lp, ids = topk_inputs("peaked", 1, budget, budget, seed=budget)
    stats = assert_wide_equals_reference(emulator, lp, ids, budget, tmp_path, with_bool=False)
    assert (stats == STAT_WIDE).all()


@pytest.mark.parametrize(
    "batch,depth,k,budget",
    [
        (3, 1, 5, 8),
        (2, 2, 3, 64),
        (2, 40, 2, 128),
        (2, 32, 200, 33),
        (5, 8, 1, 8),
        (1, 1, 1, 1),
        (3, 20, 3, 65),
        (1, 70, 70, 70),
    ],
)
def test_wide_shape_edges(emulator, batch, depth, k, budget, tmp_path):
    for kind in ("uniform", "bf16", "equal"):
        lp, ids = topk_inputs(kind, batch, depth, k, vocab=max(k, 64), seed=k + depth)
        assert_wide_equals_reference(emulator, lp, ids, budget, tmp_path)


@pytest.mark.parametrize("budget", [1, 16, 100])
def test_wide_forced_heap(emulator, budget, tmp_path):
    for kind in ("uniform", "bf16", "equal"):
        lp, ids = topk_inputs(kind, 2, 40, budget, seed=budget)
        stats = assert_wide_equals_reference(emulator, lp, ids, budget, tmp_path, force_heap=True)
        assert (stats == STAT_FORCED).all()


def test_wide_falls_back_where_the_chain_is_inexact(emulator, tmp_path):
    """The "rounding" rows: the heap's sibling step rounds differently from the direct sum, so the score is
    not monotone along the sibling chain in float64; the certificate must fail and the heap decide."""
    lp, ids = topk_inputs("rounding", 3, 8, 16, seed=0)
    stats = assert_wide_equals_reference(emulator, lp, ids, 16, tmp_path)
    assert (stats == STAT_NOT_CERTIFIED).all()


def test_wide_falls_back_on_an_uphill_edge(emulator, tmp_path):
    """Hand-made non-monotone input: an unsorted row (a younger sibling scoring above its elder) breaks key
    order; the certificate fails and the heap's own tree comes out (compared with the reference's heap
    itself, whose input check would refuse an unsorted row)."""
    lp = np.full((1, 3, 4), -3.0, np.float32)
    lp[0, :, :2] = [-1.0, -2.0]
    lp[0, 1, 1:3] = [-2.5, -0.5]  # rank 2 above rank 1
    ids = np.tile(np.arange(4, dtype=np.int64), (1, 3, 1))
    trees, bits, stats = run_wide(emulator, lp, ids, 10, tmp_path)
    want = TreeBatch.empty(1, 10)
    build_one(lp[0], ids[0], 10, want, 0)
    assert first_difference(want, trees) is None
    np.testing.assert_array_equal(bits, packed_visibility(want.visibility))
    assert stats.tolist() == [STAT_NOT_CERTIFIED]


def test_wide_falls_back_on_pool_overflow(emulator, tmp_path):
    """Rows of 0.0 then -1.0 with a pool of N + 2 entries: 63 paths score -1.0 at depth 2, tied with the N-th
    best, so no threshold cuts them; the pool cannot hold them and the heap decides."""
    lp = np.full((1, 8, 32), -1.0, np.float32)
    lp[..., 0] = 0.0
    ids = np.tile(np.arange(32, dtype=np.int64), (1, 8, 1))
    stats = assert_wide_equals_reference(emulator, lp, ids, 32, tmp_path, cap=34)
    assert stats.tolist() == [STAT_OVERFLOW]


@pytest.mark.parametrize("threads", [32, 64, 1024])
def test_wide_other_block_sizes(emulator, threads, tmp_path):
    for kind in ("uniform", "peaked", "bf16"):
        lp, ids = topk_inputs(kind, 2, 24, 200, seed=threads)
        assert_wide_equals_reference(emulator, lp, ids, 200, tmp_path, threads=threads)
