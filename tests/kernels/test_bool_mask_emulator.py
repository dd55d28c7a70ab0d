"""The parallel tree kernel's own bool rows (``expand_own_tree`` in kernels/tree_build/tree_build_bool.cuh),
run on the CPU: the kernel's code compiled by the host C++ compiler under AddressSanitizer, the block's
threads one after another (the function has no barrier, so this order is as good as any). Wherever a C++
compiler is (CI has no GPU), each tree's block, run alone into a buffer of sentinel bytes the exact size of
the batch's mask, must write exactly its own tree's region -- 16-byte chunks inside it, single bytes where a
chunk is shared with a neighbouring tree or the tree has fewer than 16 columns -- equal to the reference's
bool mask, and leave every other byte alone."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from gpu_inputs import topk_inputs
from host_programs import host_program

from ddtree_bench.builders import get_builder
from ddtree_bench.tree import packed_visibility

SENTINEL = 0x5A

HARNESS = r"""
// One block of expand_own_tree per run: tree `b` of a batch, `threads` threads run one after another.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#define __device__
#define __forceinline__ inline
#define __restrict__
struct uint4 { unsigned int x, y, z, w; };
struct EmuDim { unsigned int x; };
static EmuDim threadIdx, blockDim;
static long long __double_as_longlong(double x) { long long u; std::memcpy(&u, &x, 8); return u; }
static double __longlong_as_double(long long u) { double x; std::memcpy(&x, &u, 8); return x; }
static unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift) {
    const unsigned long long both = (static_cast<unsigned long long>(hi) << 32) | lo;
    return static_cast<unsigned int>(both >> (shift & 31));
}
#include "tree_build_common.cuh"
#include "tree_build_bool.cuh"

int main(int argc, char** argv) {
    FILE* in = std::fopen(argv[1], "rb");
    long long head[4];  // batch, N + 1, threads, tree
    if (std::fread(head, sizeof(long long), 4, in) != 4) return 3;
    const long long B = head[0], n1 = head[1], b = head[3];
    const int W = static_cast<int>((n1 + 31) / 32);
    unsigned int* bits = static_cast<unsigned int*>(std::malloc(n1 * W * sizeof(unsigned int)));
    if (std::fread(bits, sizeof(unsigned int), n1 * W, in) != static_cast<size_t>(n1 * W)) return 3;
    std::fclose(in);
    // the batch's whole mask, exactly: 16-byte aligned as the device allocation is (malloc gives 16)
    const size_t total = static_cast<size_t>(B * n1 * n1);
    unsigned char* vis = static_cast<unsigned char*>(std::aligned_alloc(16, (total + 15) / 16 * 16));
    std::memset(vis, SENTINEL, (total + 15) / 16 * 16);
    blockDim.x = static_cast<unsigned int>(head[2]);
    for (unsigned int t = 0; t < blockDim.x; ++t) {
        threadIdx.x = t;
        expand_own_tree(bits, static_cast<int>(n1), W, b, vis);
    }
    FILE* out = std::fopen(argv[2], "wb");
    std::fwrite(vis, 1, total, out);
    std::fclose(out);
    // bytes past the batch's mask (the allocation's rounding) stay untouched
    for (size_t q = total; q < (total + 15) / 16 * 16; ++q)
        if (vis[q] != SENTINEL) { std::fprintf(stderr, "wrote past the mask at byte %zu\n", q); return 4; }
    std::free(bits);
    std::free(vis);
    return 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return host_program(tmp_path_factory, "bool_mask_emulator", HARNESS, [f"-DSENTINEL={SENTINEL}"])


def run_block(harness, bits, batch, tree, threads, tmp_path) -> np.ndarray:
    """The batch's mask bytes after tree ``tree``'s block alone wrote into sentinel bytes."""
    n1 = bits.shape[0]
    data, out = tmp_path / "in.bin", tmp_path / "out.bin"
    with open(data, "wb") as f:
        np.array([batch, n1, threads, tree], np.int64).tofile(f)
        np.ascontiguousarray(bits, np.uint32).tofile(f)
    proc = subprocess.run([str(harness.path), str(data), str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, f"harness exit {proc.returncode}: {proc.stderr[-3000:]}"
    return np.fromfile(out, np.uint8)


@pytest.mark.parametrize("budget", [1, 2, 3, 7, 14, 15, 16, 17, 31, 32, 33, 100, 255, 257, 1024])
@pytest.mark.parametrize("batch", [1, 2, 3, 5])
def test_each_block_writes_exactly_its_trees_bool_rows(harness, budget, batch, tmp_path):
    lp, ids = topk_inputs("bf16", batch, 16, budget, seed=budget + batch)
    want = get_builder("native").build(lp, ids, budget).visibility
    bits = packed_visibility(want)
    n1 = budget + 1
    size = n1 * n1
    for tree in range(batch):
        for threads in (1024, 37):  # the kernel's block, and a count that leaves the strides ragged
            got = run_block(harness, bits[tree], batch, tree, threads, tmp_path)
            assert got.size == batch * size
            region = got[tree * size : (tree + 1) * size]
            np.testing.assert_array_equal(region, want[tree].reshape(-1).astype(np.uint8))
            outside = np.concatenate([got[: tree * size], got[(tree + 1) * size :]])
            assert (outside == SENTINEL).all(), f"tree {tree} wrote outside its region"


def test_harness_has_address_sanitizer(harness):
    if not harness.sanitized:
        pytest.skip("the C++ compiler here has no AddressSanitizer (the harness still runs, unchecked)")
