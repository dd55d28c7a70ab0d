"""The one-warp heap of the GPU tree builder (kernels/tree_build/tree_build_warp.cuh), run on the CPU: its
code compiled by the host C++ compiler, every lane a host thread, the warp intrinsics emulated, under
AddressSanitizer. Wherever a C++ compiler is (CI has no GPU), its trees must equal the reference's on every
distribution, budgets 1...128, depths 1...32, K < N and K > N, heap drain, ties (bf16, all-equal), with and
without the bool mask, and the shared memory must be exactly what the host plans (``warp_shared_bytes``)."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_inputs import EMULATOR_SHAPE_EDGES, KINDS, topk_inputs
from host_programs import assert_trees_equal_reference, host_program, run_tree_emulator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree_bench.builders.gpu import WARP_MAX_BUDGET, warp_shared_bytes, warp_slots
from ddtree_bench.cuda.loader import KERNEL_DIR

WARP_HEADER = KERNEL_DIR / "tree_build" / "tree_build_warp.cuh"
UNWRITTEN = 0x5A  # every output byte before the emulated launch: what the kernel must overwrite

EMULATOR_MAIN = r"""
// Host emulator of one launch of the warp-heap kernel: the blocks one after another, each block's 32 lanes
// as host threads (pthreads). Every warp collective is a meeting of the 32 threads (host_warp_intrinsics.h);
// a thread that reaches a different collective than the others (divergent collectives, which the GPU forbids
// with a full mask) is an error. The dynamic shared memory is an exact-size heap allocation of the bytes the
// host plans, refilled with garbage before every block; inputs and outputs are exact-size allocations;
// AddressSanitizer reports any out-of-bounds access.
enum { EMU_SYNCWARP, EMU_BALLOT, EMU_REDUX, EMU_SHFL, EMU_MATCH, EMU_KERNEL_END, EMU_BLOCK_START };
#define EMU_KIND_NAMES {"__syncwarp", "__ballot_sync", "__reduce_max_sync", "__shfl_sync", \
                        "__match_any_sync", "the kernel's end", "the block's start"}
#include "host_emulator.h"
#include "host_warp_intrinsics.h"
#include KERNEL_PATH

#include "host_tree_io.h"

static long long B, L, K, N, slots;
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
#define EMU_ARGS lp, ids, static_cast<int>(B), static_cast<int>(L), static_cast<int>(K), \
    static_cast<int>(N), 0, 0, out.counts, out.tokens, out.depths, out.parents, out.bits, out.next_token, \
    out.next_sibling, out.stats, nullptr, out.visibility
        if (slots == 1) warp_build_tree<1>(EMU_ARGS);
        else if (slots == 2) warp_build_tree<2>(EMU_ARGS);
        else warp_build_tree<4>(EMU_ARGS);
        emu_meet(EMU_KERNEL_END);
    }
    return nullptr;
}

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* f = std::fopen(argv[1], "rb");
    long long header[7];
    if (!f || std::fread(header, 8, 7, f) != 7) return 2;
    B = header[0]; L = header[1]; K = header[2]; N = header[3]; slots = header[4];
    const bool with_bool = header[5] != 0;
    shared_bytes = static_cast<unsigned long long>(header[6]);
    lp = read_array<float>(f, B * L * K);
    ids = read_array<long long>(f, B * L * K);
    std::fclose(f);
    out.allocate(B, N, with_bool);
    emu_shared = static_cast<unsigned char*>(std::malloc(shared_bytes > 0 ? shared_bytes : 1));
    gridDim.x = static_cast<unsigned int>(B);
    blockDim.x = 32;
    if (!emu_run_block_threads(emu_thread)) return 3;
    if (!out.write(argv[2])) return 3;
    out.release();
    std::free(lp); std::free(ids); std::free(emu_shared);
    return 0;
}
"""


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    flags = ["-ffp-contract=off", f'-DKERNEL_PATH="{WARP_HEADER}"', f"-DUNWRITTEN={UNWRITTEN}"]
    return host_program(tmp_path_factory, "tree_build_emulator", EMULATOR_MAIN, flags)


def run_warp_kernel(emulator, lp, ids, budget, tmp_path, with_bool=True):
    """One emulated launch over the batch: ``(TreeBatch, packed bits, stats)``."""
    batch, depth, k = lp.shape
    topk = min(budget, k)
    header = [
        batch,
        depth,
        k,
        budget,
        warp_slots(budget),
        int(with_bool),
        warp_shared_bytes(budget, depth, topk),
    ]
    data, out = tmp_path / "in.bin", tmp_path / "out.bin"
    with open(data, "wb") as f:
        np.array(header, np.int64).tofile(f)
        np.ascontiguousarray(lp, np.float32).tofile(f)
        np.ascontiguousarray(ids, np.int64).tofile(f)
    return run_tree_emulator(emulator, data, out, batch, budget, with_bool)


def assert_warp_kernel_equals_reference(emulator, lp, ids, budget, tmp_path, with_bool=True):
    trees, bits, stats = run_warp_kernel(emulator, lp, ids, budget, tmp_path, with_bool)
    assert_trees_equal_reference(trees, bits, lp, ids, budget, with_bool)
    assert (stats == 4).all()


def test_emulator_has_address_sanitizer(emulator):
    if not emulator.sanitized:
        pytest.skip("the C++ compiler here has no AddressSanitizer (the emulator still runs, unchecked)")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("budget", [1, 2, 8, 31, 32, 33, 64, 65, 100, 128])
def test_warp_kernel_equals_reference(emulator, kind, budget, tmp_path):
    lp, ids = topk_inputs(kind, 2, 16, budget, seed=budget)
    assert_warp_kernel_equals_reference(emulator, lp, ids, budget, tmp_path, with_bool=budget % 2 == 0)


@pytest.mark.parametrize("batch,depth,k,budget", EMULATOR_SHAPE_EDGES)
def test_warp_kernel_shape_edges(emulator, batch, depth, k, budget, tmp_path):
    for kind in ("uniform", "bf16", "equal"):
        lp, ids = topk_inputs(kind, batch, depth, k, vocab=max(k, 64), seed=k + depth)
        assert_warp_kernel_equals_reference(emulator, lp, ids, budget, tmp_path)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    batch=st.integers(1, 3),
    depth=st.integers(1, 32),
    k=st.integers(1, 40),
    budget=st.integers(1, WARP_MAX_BUDGET),
    kind=st.sampled_from(KINDS),
    seed=st.integers(0, 2**31 - 1),
    with_bool=st.booleans(),
)
def test_warp_kernel_property(emulator, tmp_path_factory, batch, depth, k, budget, kind, seed, with_bool):
    lp, ids = topk_inputs(kind, batch, depth, k, vocab=max(64, k), seed=seed)
    tmp = tmp_path_factory.mktemp("case")
    assert_warp_kernel_equals_reference(emulator, lp, ids, budget, tmp, with_bool)
