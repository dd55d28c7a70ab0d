"""The parallel tree-build kernel (``ddtree_build_tree`` in kernels/tree_build/tree_build.cu: the candidate
pool, exact scores, preorder ranks, selection, sort and outputs, and the exact sequential heap it falls back
to) run on the CPU: its code compiled by the host C++ compiler, every thread of the block a host thread,
barriers and warp collectives emulated, under AddressSanitizer with the exact shared memory the host plans
(``plan_launch``, for the H200's shared memory and for a GPU with less, whose smaller pool takes other code
paths). Wherever a C++ compiler is (CI has no GPU), its trees must equal the reference's on every
distribution, budgets 1...1024, shape edges, with and without the bool mask, forced heap included; and under
ThreadSanitizer (the CPU's racecheck) no two threads may touch shared memory without a barrier, warp
collective or atomic between them."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_inputs import EMULATOR_SHAPE_EDGES, KINDS, topk_inputs
from host_programs import assert_trees_equal_reference, host_program, run_tree_emulator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree_bench.builders.gpu import FLAG_FORCE_HEAP, plan_launch

H200_SHARED = 232448  # the H200's opt-in shared memory per block (cupy's sharedMemPerBlockOptin there)
SMALL_SHARED = 101376  # a GPU with 99 KB per block (the RTX PRO 6000 Blackwell): smaller pools
UNWRITTEN = 0x5A

EMULATOR_MAIN = r"""
// Host emulator of one launch of ddtree_build_tree: the blocks one after another, each block's threads as
// host threads; __syncthreads is a meeting of the block, warp collectives meetings of the warp
// (host_warp_intrinsics.h), static __shared__ variables host statics. The dynamic shared memory is an
// exact-size heap allocation of the bytes the host plans, refilled with garbage before every block.
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
        ddtree_build_tree(lp, ids, static_cast<int>(B), static_cast<int>(L), static_cast<int>(K),
                          static_cast<int>(N), static_cast<int>(cap), static_cast<int>(flags), out.counts,
                          out.tokens, out.depths, out.parents, out.bits, out.next_token, out.next_sibling,
                          out.stats, nullptr, out.visibility);
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
    std::fprintf(stderr, "emulator: %d barriers\n", emu_held[EMU_SYNCTHREADS]);
    out.release();
    std::free(lp); std::free(ids); std::free(emu_shared);
    return 0;
}
"""


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    flags = ["-ffp-contract=off", f"-DUNWRITTEN={UNWRITTEN}", "-Wno-unused-function"]
    return host_program(tmp_path_factory, "tree_build_block_emulator", EMULATOR_MAIN, flags)


def run_block_kernel(
    emulator, lp, ids, budget, tmp_path, with_bool=True, shared=H200_SHARED, force_heap=False, threads=None
):
    """One emulated launch of the parallel kernel over the batch: ``(TreeBatch, packed bits, path codes)``;
    ``threads`` overrides the plan's block size."""
    batch, depth, k = lp.shape
    plan = plan_launch(batch, depth, k, budget, shared, path="parallel")
    flags = plan.flags | (FLAG_FORCE_HEAP if force_heap else 0)
    threads = plan.threads if threads is None else threads
    header = [batch, depth, k, budget, plan.cap, flags, threads, int(with_bool), plan.shared_bytes]
    data, out = tmp_path / "in.bin", tmp_path / "out.bin"
    with open(data, "wb") as f:
        np.array(header, np.int64).tofile(f)
        np.ascontiguousarray(lp, np.float32).tofile(f)
        np.ascontiguousarray(ids, np.int64).tofile(f)
    return run_tree_emulator(emulator, data, out, batch, budget, with_bool)


def assert_block_kernel_equals_reference(emulator, lp, ids, budget, tmp_path, with_bool=True, **launch):
    trees, bits, stats = run_block_kernel(emulator, lp, ids, budget, tmp_path, with_bool, **launch)
    assert_trees_equal_reference(trees, bits, lp, ids, budget, with_bool)
    return stats


def test_block_emulator_has_address_sanitizer(emulator):
    if not emulator.sanitized:
        pytest.skip("the C++ compiler here has no AddressSanitizer (the emulator still runs, unchecked)")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("budget", [1, 8, 33, 100, 128, 200])
def test_block_kernel_equals_reference(emulator, kind, budget, tmp_path):
    lp, ids = topk_inputs(kind, 2, 16, budget, seed=budget)
    stats = assert_block_kernel_equals_reference(
        emulator, lp, ids, budget, tmp_path, with_bool=budget % 2 == 0
    )
    assert set(stats.tolist()) <= {0, 1, 2}  # the parallel path, or the heap after an anomaly / overflow


@pytest.mark.parametrize("kind", ["uniform", "peaked", "bf16"])
@pytest.mark.parametrize("budget", [256, 1024])
def test_block_kernel_large_budgets(emulator, kind, budget, tmp_path):
    """The budgets the benchmark runs at their block sizes (512 and 1024 threads), with the bool mask the
    kernel writes itself."""
    lp, ids = topk_inputs(kind, 1, 16, budget, seed=3)
    stats = assert_block_kernel_equals_reference(emulator, lp, ids, budget, tmp_path)
    if kind != "bf16":
        assert stats.tolist() == [0]  # continuous inputs: the parallel path proves its result


@pytest.mark.parametrize("kind", ["uniform", "peaked", "bf16"])
@pytest.mark.parametrize("budget,threads", [(100, 128), (300, 128), (300, 256), (100, 1024)])
def test_block_kernel_other_block_sizes(emulator, kind, budget, threads, tmp_path):
    """Block sizes other than the plan's: fewer threads than the selected entries take the sort's
    several-elements-a-thread path; the tree is the same whatever the block size."""
    lp, ids = topk_inputs(kind, 2, 16, budget, seed=11)
    assert_block_kernel_equals_reference(emulator, lp, ids, budget, tmp_path, threads=threads)


@pytest.mark.parametrize("kind", ["uniform", "peaked", "equal"])
@pytest.mark.parametrize("budget", [64, 300, 1024])
def test_block_kernel_small_shared_memory(emulator, kind, budget, tmp_path):
    """With 99 KB of shared memory a block (RTX PRO 6000): smaller pools, rows read from global memory, and
    at budget 1024 the packed bits built in two parts."""
    lp, ids = topk_inputs(kind, 2 if budget < 1024 else 1, 16, budget, seed=5)
    assert_block_kernel_equals_reference(emulator, lp, ids, budget, tmp_path, shared=SMALL_SHARED)


@pytest.mark.parametrize("budget", [1, 16, 100])
def test_block_kernel_forced_heap(emulator, budget, tmp_path):
    for kind in ("uniform", "bf16", "equal"):
        lp, ids = topk_inputs(kind, 2, 8, budget, seed=budget)
        stats = assert_block_kernel_equals_reference(emulator, lp, ids, budget, tmp_path, force_heap=True)
        assert (stats == 3).all()


@pytest.mark.parametrize("batch,depth,k,budget", EMULATOR_SHAPE_EDGES)
def test_block_kernel_shape_edges(emulator, batch, depth, k, budget, tmp_path):
    for kind in ("uniform", "bf16", "equal"):
        lp, ids = topk_inputs(kind, batch, depth, k, vocab=max(k, 64), seed=k + depth)
        assert_block_kernel_equals_reference(emulator, lp, ids, budget, tmp_path)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    batch=st.integers(1, 2),
    depth=st.integers(1, 32),
    k=st.integers(1, 60),
    budget=st.integers(1, 160),
    kind=st.sampled_from(KINDS),
    seed=st.integers(0, 2**31 - 1),
    with_bool=st.booleans(),
)
def test_block_kernel_property(emulator, tmp_path_factory, batch, depth, k, budget, kind, seed, with_bool):
    lp, ids = topk_inputs(kind, batch, depth, k, vocab=max(64, k), seed=seed)
    tmp = tmp_path_factory.mktemp("case")
    assert_block_kernel_equals_reference(emulator, lp, ids, budget, tmp, with_bool)


@pytest.fixture(scope="module")
def race_emulator(tmp_path_factory):
    flags = ["-ffp-contract=off", f"-DUNWRITTEN={UNWRITTEN}", "-Wno-unused-function"]
    program = host_program(
        tmp_path_factory, "tree_build_block_race", EMULATOR_MAIN, flags, sanitizer="thread"
    )
    if not program.sanitized:
        pytest.skip("the C++ compiler here has no ThreadSanitizer")
    return program


@pytest.mark.parametrize(
    "kind,budget",
    [
        ("peaked", 100),
        ("bf16", 256),
        ("tied", 64),
        ("uniform", 8),
        ("peaked", 1024),
        ("certain", 300),
        ("rounding", 100),
    ],
)
def test_block_kernel_has_no_data_race(race_emulator, kind, budget, tmp_path):
    """ThreadSanitizer over the emulated block (the CPU's racecheck): every shared-memory access between two
    threads is ordered by a barrier, a warp collective or an atomic."""
    lp, ids = topk_inputs(kind, 2, 16, budget, seed=7)
    assert_block_kernel_equals_reference(race_emulator, lp, ids, budget, tmp_path)
