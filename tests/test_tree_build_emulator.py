"""The one-warp heap of the GPU tree builder (kernels/tree_build_warp.cuh), run on the CPU: its code compiled
by the host C++ compiler, every lane a host thread, the warp intrinsics emulated, under AddressSanitizer.
Wherever a C++ compiler is (CI has no GPU), its trees must equal the reference's on every distribution,
budgets 1...128, depths 1...32, K < N and K > N, heap drain, ties (bf16, all-equal), with and without the
bool mask, and the shared memory must be exactly what the host plans (``warp_shared_bytes``)."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from gpu_inputs import topk_inputs
from host_programs import host_program
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree_bench.builders import get_builder
from ddtree_bench.builders.gpu import WARP_MAX_BUDGET, warp_shared_bytes, warp_slots
from ddtree_bench.cuda import KERNEL_DIR
from ddtree_bench.tree import TreeBatch, packed_visibility

WARP_HEADER = KERNEL_DIR / "tree_build_warp.cuh"
UNWRITTEN = 0x5A  # every output byte before the emulated launch: what the kernel must overwrite

EMULATOR_MAIN = r"""
// Host emulator of one launch of the warp-heap kernel: the blocks one after another, each block's 32 lanes
// as host threads (pthreads). Every warp collective (__syncwarp, __ballot_sync, __any_sync,
// __reduce_max_sync, __shfl_sync, __shfl_xor_sync) is a meeting of the 32 threads: each publishes its value,
// all meet, each reads what it needs, all meet again; a thread that reaches a different collective than the
// others (divergent collectives, which the GPU forbids with a full mask) is an error. The dynamic shared
// memory is an exact-size heap allocation of the bytes the host plans, refilled with garbage before every
// block; inputs and outputs are exact-size allocations; AddressSanitizer reports any out-of-bounds access.
#include <algorithm>
enum { EMU_SYNCWARP, EMU_BALLOT, EMU_REDUX, EMU_SHFL, EMU_KERNEL_END, EMU_BLOCK_START };
#define EMU_KIND_NAMES {"__syncwarp", "__ballot_sync", "__reduce_max_sync", "__shfl_sync", \
                        "the kernel's end", "the block's start"}
#include "host_emulator.h"
#define __forceinline__ inline
#define __restrict__
#define DDT_HOST_EMULATOR 1
#define DDT_HOST_EMULATOR_SHARED emu_shared
struct uint4 { unsigned int x, y, z, w; };
using std::max;
using std::min;
static unsigned long long emu_values[32];  // what each lane publishes at a collective

static void emu_check_mask(unsigned int mask) {
    if (mask != 0xffffffffu) { std::fprintf(stderr, "emulator: a partial warp mask\n"); _exit(5); }
}
template <class T> static unsigned long long emu_bits(T v) {
    unsigned long long u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T> static T emu_from_bits(unsigned long long u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}
static void __syncwarp(unsigned int mask = 0xffffffffu) { emu_check_mask(mask); emu_meet(EMU_SYNCWARP); }
static unsigned int __ballot_sync(unsigned int mask, int predicate) {
    emu_check_mask(mask);
    emu_values[threadIdx.x] = predicate != 0;
    emu_meet(EMU_BALLOT);
    unsigned int bits = 0;
    for (int i = 0; i < 32; ++i) bits |= static_cast<unsigned int>(emu_values[i] & 1u) << i;
    emu_meet(EMU_BALLOT);
    return bits;
}
static int __any_sync(unsigned int mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
static unsigned int __reduce_max_sync(unsigned int mask, unsigned int value) {
    emu_check_mask(mask);
    emu_values[threadIdx.x] = value;
    emu_meet(EMU_REDUX);
    unsigned int best = 0;
    for (int i = 0; i < 32; ++i) best = std::max(best, static_cast<unsigned int>(emu_values[i]));
    emu_meet(EMU_REDUX);
    return best;
}
template <class T> static T emu_shuffle(unsigned int mask, T value, int source) {
    emu_check_mask(mask);
    emu_values[threadIdx.x] = emu_bits(value);
    emu_meet(EMU_SHFL);
    const T got = emu_from_bits<T>(emu_values[source & 31]);
    emu_meet(EMU_SHFL);
    return got;
}
template <class T> static T __shfl_sync(unsigned int mask, T value, int lane) {
    return emu_shuffle(mask, value, lane);
}
template <class T> static T __shfl_xor_sync(unsigned int mask, T value, int lane_mask) {
    return emu_shuffle(mask, value, static_cast<int>(threadIdx.x) ^ lane_mask);
}
static int __popc(unsigned int x) { return __builtin_popcount(x); }
static int __ffs(unsigned int x) { return __builtin_ffs(static_cast<int>(x)); }
static unsigned int __umulhi(unsigned int a, unsigned int b) {
    return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}
static unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift) {
    return static_cast<unsigned int>(((static_cast<unsigned long long>(hi) << 32) | lo) >> (shift & 31));
}
static double __dadd_rn(double a, double b) { return a + b; }  // built with -ffp-contract=off
static double __dsub_rn(double a, double b) { return a - b; }
static long long __double_as_longlong(double x) { return emu_from_bits<long long>(emu_bits(x)); }
static double __longlong_as_double(long long x) { return emu_from_bits<double>(emu_bits(x)); }
static long long clock64() { return 0; }
static void cp_async(void* dst, const void* src, int bytes) { std::memcpy(dst, src, bytes); }
static void cp_async_commit() {}
static void cp_async_wait_all() {}
#include KERNEL_PATH

template <class T> static T* output_array(long long n) {
    T* p = static_cast<T*>(std::malloc(n > 0 ? n * sizeof(T) : 1));
    std::memset(p, UNWRITTEN, n > 0 ? n * sizeof(T) : 1);
    return p;
}

static long long B, L, K, N, slots, with_bool;
static unsigned long long shared_bytes;
static float* lp;
static long long *ids, *tokens, *depths, *next_token, *next_sibling;
static int *counts, *parent_out, *stats;
static unsigned int* bits;
static unsigned char* visibility;

static void* emu_thread(void* arg) {
    threadIdx.x = static_cast<unsigned int>(reinterpret_cast<size_t>(arg));
    for (unsigned int bx = 0; bx < gridDim.x; ++bx) {
        if (threadIdx.x == 0) std::memset(emu_shared, 0xA5 ^ (bx & 0xFF), shared_bytes);
        emu_meet(EMU_BLOCK_START);
        blockIdx.x = bx;
#define EMU_ARGS lp, ids, static_cast<int>(B), static_cast<int>(L), static_cast<int>(K), \
    static_cast<int>(N), 0, 0, counts, tokens, depths, parent_out, bits, next_token, next_sibling, stats, \
    nullptr, visibility
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
    B = header[0]; L = header[1]; K = header[2]; N = header[3]; slots = header[4]; with_bool = header[5];
    shared_bytes = static_cast<unsigned long long>(header[6]);
    const long long n1 = N + 1, words = (n1 + 31) / 32;
    lp = read_array<float>(f, B * L * K);
    ids = read_array<long long>(f, B * L * K);
    std::fclose(f);
    counts = output_array<int>(B);
    tokens = output_array<long long>(B * N);
    depths = output_array<long long>(B * N);
    parent_out = output_array<int>(B * n1);
    bits = output_array<unsigned int>(B * n1 * words);
    next_token = output_array<long long>(B * n1);
    next_sibling = output_array<long long>(B * n1);
    stats = output_array<int>(B);
    visibility = with_bool ? output_array<unsigned char>(B * n1 * n1) : nullptr;
    emu_shared = static_cast<unsigned char*>(std::malloc(shared_bytes > 0 ? shared_bytes : 1));
    gridDim.x = static_cast<unsigned int>(B);
    blockDim.x = 32;
    if (!emu_run_block_threads(emu_thread)) return 3;
    FILE* o = std::fopen(argv[2], "wb");
    std::fwrite(counts, sizeof(int), B, o);
    std::fwrite(tokens, sizeof(long long), B * N, o);
    std::fwrite(depths, sizeof(long long), B * N, o);
    std::fwrite(parent_out, sizeof(int), B * n1, o);
    std::fwrite(bits, sizeof(unsigned int), B * n1 * words, o);
    std::fwrite(next_token, sizeof(long long), B * n1, o);
    std::fwrite(next_sibling, sizeof(long long), B * n1, o);
    std::fwrite(stats, sizeof(int), B, o);
    if (with_bool) std::fwrite(visibility, 1, B * n1 * n1, o);
    std::fclose(o);
    std::free(lp); std::free(ids); std::free(counts); std::free(tokens); std::free(depths);
    std::free(parent_out); std::free(bits); std::free(next_token); std::free(next_sibling); std::free(stats);
    std::free(visibility); std::free(emu_shared);
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
    n1 = budget + 1
    words = (n1 + 31) // 32
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
    proc = subprocess.run(
        [str(emulator.path), str(data), str(out)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"emulator exit {proc.returncode}: {proc.stderr[-3000:]}"
    raw = out.read_bytes()
    fields = [
        ("node_count", np.int32, (batch,)),
        ("node_token_ids", np.int64, (batch, budget)),
        ("node_depths", np.int64, (batch, budget)),
        ("parents", np.int32, (batch, n1)),
        ("bits", np.uint32, (batch, n1, words)),
        ("retrieve_next_token", np.int64, (batch, n1)),
        ("retrieve_next_sibling", np.int64, (batch, n1)),
        ("stats", np.int32, (batch,)),
    ]
    if with_bool:
        fields.append(("visibility", np.bool_, (batch, n1, n1)))
    got, at = {}, 0
    for name, dtype, shape in fields:
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        array = np.frombuffer(raw, np.uint8, size, at)
        if name == "visibility":
            assert set(np.unique(array).tolist()) <= {0, 1}, "bool mask bytes other than 0 and 1 (unwritten?)"
        got[name] = array.view(dtype).reshape(shape)
        at += size
    assert at == len(raw)
    bits, stats = got.pop("bits"), got.pop("stats")
    if not with_bool:
        got["visibility"] = np.zeros((batch, n1, n1), np.bool_)
    return TreeBatch(**got), bits, stats


def assert_warp_kernel_equals_reference(emulator, lp, ids, budget, tmp_path, with_bool=True):
    want = get_builder("reference").build(lp, ids, budget)
    trees, bits, stats = run_warp_kernel(emulator, lp, ids, budget, tmp_path, with_bool)
    fields = ["node_count", "node_token_ids", "node_depths", "parents", "retrieve_next_token"]
    fields += ["retrieve_next_sibling"] + (["visibility"] if with_bool else [])
    for name in fields:
        g, w = getattr(trees, name), getattr(want, name)
        if not np.array_equal(g, w):
            at = tuple(int(i) for i in np.argwhere(g != w)[0])
            raise AssertionError(f"{name} differs at {at}: got {g[at]}, expected {w[at]}")
    np.testing.assert_array_equal(bits, packed_visibility(want.visibility))
    assert (stats == 4).all()


def test_emulator_has_address_sanitizer(emulator):
    if not emulator.sanitized:
        pytest.skip("the C++ compiler here has no AddressSanitizer (the emulator still runs, unchecked)")


@pytest.mark.parametrize("kind", ["uniform", "peaked", "bf16", "equal", "tied", "tiny"])
@pytest.mark.parametrize("budget", [1, 2, 8, 31, 32, 33, 64, 65, 100, 128])
def test_warp_kernel_equals_reference(emulator, kind, budget, tmp_path):
    lp, ids = topk_inputs(kind, 2, 16, budget, seed=budget)
    assert_warp_kernel_equals_reference(emulator, lp, ids, budget, tmp_path, with_bool=budget % 2 == 0)


@pytest.mark.parametrize(
    "batch,depth,k,budget",
    [
        (3, 1, 5, 8),  # L = 1: siblings only
        (2, 2, 3, 64),  # heap drain: 2 + 4 + ... < N
        (2, 32, 2, 128),  # the deepest trees, 8-bit levels in all four rank words
        (2, 32, 200, 33),  # K > N, deep
        (5, 8, 1, 8),  # K = 1: a chain
        (1, 1, 1, 1),
        (3, 20, 3, 65),
    ],
)
def test_warp_kernel_shape_edges(emulator, batch, depth, k, budget, tmp_path):
    for kind in ("uniform", "bf16", "equal"):
        lp, ids = topk_inputs(kind, batch, depth, k, vocab=max(k, 64), seed=k + depth)
        assert_warp_kernel_equals_reference(emulator, lp, ids, budget, tmp_path)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    batch=st.integers(1, 3),
    depth=st.integers(1, 32),
    k=st.integers(1, 40),
    budget=st.integers(1, WARP_MAX_BUDGET),
    kind=st.sampled_from(["uniform", "peaked", "bf16", "equal", "tied", "tiny"]),
    seed=st.integers(0, 2**31 - 1),
    with_bool=st.booleans(),
)
def test_warp_kernel_property(emulator, tmp_path_factory, batch, depth, k, budget, kind, seed, with_bool):
    lp, ids = topk_inputs(kind, batch, depth, k, vocab=max(64, k), seed=seed)
    tmp = tmp_path_factory.mktemp("case")
    assert_warp_kernel_equals_reference(emulator, lp, ids, budget, tmp, with_bool)
