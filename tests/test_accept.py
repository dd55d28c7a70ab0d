"""Tree accept: the CPU walk equals SGLang's ``follow_verified_tree`` over SGLang's child maps; the CUDA
kernel compiles everywhere, and its code -- the kernel function itself, run by a host emulator of the warp
under AddressSanitizer -- equals the CPU walk on every case; on a GPU, ``GpuAccept`` equals it too."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree_bench import cuda
from ddtree_bench.accept import (
    KERNEL_SOURCE,
    AcceptUnavailable,
    GpuAccept,
    accept_cpu,
    check_batch_budget,
)
from ddtree_bench.builders import get_builder
from ddtree_bench.tree import TreeBatch

GPU_REASON = cuda.gpu_unavailable_reason()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")
SENTINEL32 = 0x5EEDBEEF  # what the emulator and the GPU tests put in every output before a launch
SENTINEL64 = 0x5EEDBEEF5EEDBEEF


# ---------------------------------------------------------------------------------------------------------
# inputs


def make_topk(rng, batch: int, depth: int, k: int, vocab: int, duplicate_ids: int = 0):
    """Top-k of softmax(Gaussian logits) over ``vocab``: ``(log-probs float32 [B, L, K] sorted descending,
    token ids int64 [B, L, K])``. With ``duplicate_ids`` the ids are drawn with replacement from that many
    tokens instead (rows then repeat tokens, so siblings can share a token)."""
    logits = rng.normal(scale=2.0, size=(batch, depth, vocab))
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    order = np.argsort(-log_probs, axis=-1, kind="stable")[..., :k]
    lp = np.minimum(np.take_along_axis(log_probs, order, axis=-1), 0.0).astype(np.float32)
    lp = -np.sort(-lp, axis=-1)  # float32 rounding never unsorts, but be sure
    ids = order if not duplicate_ids else rng.integers(0, duplicate_ids, size=order.shape)
    return np.ascontiguousarray(lp, np.float32), np.ascontiguousarray(ids, np.int64)


def build_trees(rng, batch, budget, depth, k, vocab, duplicate_ids=0) -> TreeBatch:
    lp, ids = make_topk(rng, batch, depth, k, vocab, duplicate_ids)
    return get_builder("reference").build(lp, ids, budget)


def leaves(trees: TreeBatch, b: int) -> list[int]:
    n = int(trees.node_count[b])
    found = [i for i in range(1, n + 1) if trees.retrieve_next_token[b, i] == -1]
    return found or [0]


def root_path(trees: TreeBatch, b: int, node: int) -> list[int]:
    path = [node]
    while path[-1] != 0:
        path.append(int(trees.parents[b, path[-1]]))
    return path[::-1]


def make_target(trees: TreeBatch, kind: str, rng, vocab: int):
    """Target tokens ``[B, N+1]`` of a kind, and (for ``path``) the root-to-leaf path each request must
    accept. ``path``: along a random root-to-leaf path every node's target is the next node's token;
    ``none``: tokens no node carries; ``random`` / ``duplicates``: uniform over the vocabulary."""
    batch, budget = trees.node_token_ids.shape
    target = rng.integers(0, vocab, size=(batch, budget + 1)).astype(np.int64)
    paths = None
    if kind == "none":
        target = vocab + 17 + rng.integers(0, 1000, size=(batch, budget + 1)).astype(np.int64)
    elif kind == "path":
        paths = []
        for b in range(batch):
            candidates = leaves(trees, b)
            path = root_path(trees, b, candidates[int(rng.integers(len(candidates)))])
            for node, child in zip(path[:-1], path[1:], strict=True):
                target[b, node] = trees.node_token_ids[b, child - 1]
            paths.append(path)
    elif kind not in ("random", "duplicates"):
        raise ValueError(kind)
    return target, paths


# (kind, batch, budget, depth L, K, vocab)
CASES = [
    ("path", 1, 1, 16, 8, 50),
    ("path", 3, 2, 16, 8, 50),
    ("path", 4, 7, 16, 3, 50),
    ("path", 5, 16, 16, 16, 50),
    ("path", 8, 64, 16, 8, 50),
    ("path", 2, 256, 16, 32, 64),
    ("path", 2, 1024, 16, 64, 64),
    ("path", 3, 40, 2, 3, 50),  # heap drain: 3 + 9 = 12 nodes < N
    ("path", 2, 30, 1, 40, 50),  # L = 1: every node a root child
    ("none", 1, 1, 16, 8, 50),
    ("none", 6, 64, 16, 8, 50),
    ("none", 2, 1024, 16, 64, 64),
    ("random", 1, 1, 16, 4, 6),
    ("random", 7, 8, 16, 4, 6),
    ("random", 16, 64, 16, 4, 6),
    ("random", 4, 300, 8, 4, 6),
    ("random", 2, 1024, 16, 4, 6),
    ("duplicates", 9, 16, 16, 8, 3),
    ("duplicates", 8, 100, 12, 6, 3),
    ("duplicates", 2, 1024, 16, 32, 3),
]


# the GPU grid: batch 1...64, budget 1...1024, every kind (also run through the kernel emulator)
GPU_GRID = [
    (kind, batch, budget, 16, k, vocab)
    for batch in (1, 3, 64)
    for budget in (1, 2, 7, 16, 64, 256, 1024)
    for kind, k, vocab in (("path", 8, 50), ("none", 8, 50), ("random", 4, 6), ("duplicates", 6, 3))
]


def case_id(case) -> str:
    kind, batch, budget, depth, k, vocab = case
    return f"{kind}-B{batch}-N{budget}-L{depth}-K{k}"


def make_case(case, seed: int = 0):
    kind, batch, budget, depth, k, vocab = case
    rng = np.random.default_rng([seed, batch, budget, depth, k])
    trees = build_trees(
        rng, batch, budget, depth, k, vocab, duplicate_ids=vocab if kind == "duplicates" else 0
    )
    target, paths = make_target(trees, kind, rng, vocab)
    return trees, target, paths


def tree_from_parents(parents: list[int], tokens: list[int], budget: int | None = None) -> TreeBatch:
    """A one-request TreeBatch by hand (``parents[0] = -1``, node ``i``'s token ``tokens[i - 1]``), its
    links derived the way SGLang derives them (first child by index, then siblings by increasing index)."""
    n = len(tokens)
    budget = n if budget is None else budget
    trees = TreeBatch.empty(1, budget)
    trees.node_count[0] = n
    trees.node_token_ids[0, :n] = tokens
    trees.parents[0, : n + 1] = parents
    last_child = [-1] * (n + 1)
    for child in range(1, n + 1):
        parent = parents[child]
        trees.node_depths[0, child - 1] = 1 if parent == 0 else trees.node_depths[0, parent - 1] + 1
        if trees.retrieve_next_token[0, parent] == -1:
            trees.retrieve_next_token[0, parent] = child
        else:
            trees.retrieve_next_sibling[0, last_child[parent]] = child
        last_child[parent] = child
    return trees


# ---------------------------------------------------------------------------------------------------------
# the independent oracle: SGLang's child maps (as its tree builder fills them) and follow_verified_tree


def sglang_child_maps(parents, node_token_ids, node_count):
    child_maps = [dict()]
    for node_index in range(node_count):
        current_index = node_index + 1
        child_maps.append(dict())
        child_maps[int(parents[current_index])][int(node_token_ids[node_index])] = current_index
    return child_maps


def sglang_follow_verified_tree(child_maps, posterior_tokens):
    accepted_indices = [0]
    current_index = 0
    next_token = int(posterior_tokens[current_index])
    while next_token in child_maps[current_index]:
        current_index = child_maps[current_index][next_token]
        accepted_indices.append(current_index)
        next_token = int(posterior_tokens[current_index])
    return accepted_indices, next_token


def oracle(trees: TreeBatch, target: np.ndarray):
    """Per request ``(accepted indices list, bonus token)``."""
    out = []
    for b in range(trees.batch_size):
        n = int(trees.node_count[b])
        maps = sglang_child_maps(trees.parents[b], trees.node_token_ids[b], n)
        out.append(sglang_follow_verified_tree(maps, target[b, : n + 1]))
    return out


def assert_matches_oracle(result, trees: TreeBatch, target: np.ndarray):
    accepted, length, bonus = result
    batch, budget = trees.node_token_ids.shape
    assert accepted.shape == (batch, budget + 1) and accepted.dtype == np.int32
    assert length.shape == (batch,) and length.dtype == np.int32
    assert bonus.shape == (batch,) and bonus.dtype == np.int64
    for b, (path, next_token) in enumerate(oracle(trees, target)):
        assert length[b] == len(path), (b, length[b], path)
        assert accepted[b, : len(path)].tolist() == path, b
        assert (accepted[b, len(path) :] == -1).all(), b
        assert bonus[b] == next_token, b


def assert_walk_invariants(result, trees: TreeBatch, target: np.ndarray):
    """What any greedy accept must satisfy, checked without child maps: the accepted nodes are a chain from
    the root, each node's token is its parent's target token, the bonus is the last node's target token,
    and no child of the last node carries the bonus token."""
    accepted, length, bonus = result
    for b in range(trees.batch_size):
        path = accepted[b, : length[b]].tolist()
        assert path[0] == 0 and 1 <= length[b] <= trees.budget + 1
        for parent, child in zip(path[:-1], path[1:], strict=True):
            assert trees.parents[b, child] == parent
            assert trees.node_token_ids[b, child - 1] == target[b, parent]
        assert bonus[b] == target[b, path[-1]]
        n = int(trees.node_count[b])
        children = [i for i in range(1, n + 1) if trees.parents[b, i] == path[-1]]
        assert all(trees.node_token_ids[b, i - 1] != bonus[b] for i in children)


# ---------------------------------------------------------------------------------------------------------
# CPU walk


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_cpu_equals_follow_verified_tree(case):
    trees, target, paths = make_case(case)
    result = accept_cpu(trees, target)
    assert_matches_oracle(result, trees, target)
    assert_walk_invariants(result, trees, target)
    accepted, length, bonus = result
    kind = case[0]
    if kind == "path":  # the whole chosen root-to-leaf path, and the leaf's target as the bonus
        for b, path in enumerate(paths):
            assert accepted[b, : len(path)].tolist() == path
            assert length[b] == len(path) == 1 + (trees.node_depths[b, path[-1] - 1] if path[-1] else 0)
            assert bonus[b] == target[b, path[-1]]
        if trees.budget >= 16 and case[3] >= 2:
            assert length.max() >= 3  # the paths are not all trivial
    if kind == "none":
        assert (length == 1).all() and (accepted[:, 0] == 0).all() and (accepted[:, 1:] == -1).all()
        np.testing.assert_array_equal(bonus, target[:, 0])
    if kind == "random" and trees.budget >= 8:
        assert length.max() >= 2  # a small vocabulary: some request accepts beyond the root


def test_random_cases_accept_something():
    """Across the random and duplicate cases, acceptance is neither always 1 nor always the full path."""
    lengths = np.concatenate(
        [accept_cpu(*make_case(c)[:2])[1] for c in CASES if c[0] in ("random", "duplicates")]
    )
    assert (lengths == 1).any() and (lengths >= 3).any()


def test_hand_built_tree():
    #        0
    #      /   \
    #   1:10   2:20
    #    |     /   \
    #  3:30  4:40  5:50
    #               |
    #              6:60
    trees = tree_from_parents([-1, 0, 0, 1, 2, 2, 5], [10, 20, 30, 40, 50, 60], budget=8)
    cases = [
        ([20, 0, 50, 0, 0, 60, 7, 0, 0], [0, 2, 5, 6], 7),  # the full right path; bonus at leaf 6
        ([10, 30, 0, 99, 0, 0, 0, 0, 0], [0, 1, 3], 99),
        ([20, 0, 41, 0, 0, 0, 0, 0, 0], [0, 2], 41),  # 41 is no child of node 2
        ([11, 0, 0, 0, 0, 0, 0, 0, 0], [0], 11),
        ([40, 0, 0, 0, 0, 0, 0, 0, 0], [0], 40),  # 40 is a grandchild, not a child, of the root
    ]
    for row, path, bonus in cases:
        target = np.array([row], np.int64)
        accepted, length, got_bonus = accept_cpu(trees, target)
        assert accepted[0].tolist() == path + [-1] * (9 - len(path))
        assert length.tolist() == [len(path)] and got_bonus.tolist() == [bonus]


def test_duplicate_sibling_tokens_take_the_later_child():
    """SGLang's child map is a dict filled in index order: a repeated token maps to the later sibling."""
    trees = tree_from_parents([-1, 0, 0, 0, 2, 3], [5, 5, 5, 8, 9])
    accepted, length, bonus = accept_cpu(trees, np.array([[5, 0, 8, 9, 0, 0]], np.int64))
    assert accepted[0].tolist() == [0, 3, 5, -1, -1, -1] and length[0] == 3 and bonus[0] == 0
    assert sglang_child_maps(trees.parents[0], trees.node_token_ids[0], 5)[0] == {5: 3}


def test_target_tokens_past_the_tree_are_ignored():
    trees, target, _ = make_case(("random", 3, 40, 2, 3, 3))  # heap drain: 12 nodes, N = 40
    assert (trees.node_count < 40).all()
    other = target.copy()
    for b in range(3):
        other[b, trees.node_count[b] + 1 :] = 12345
    for got, want in zip(accept_cpu(trees, other), accept_cpu(trees, target), strict=True):
        np.testing.assert_array_equal(got, want)


def test_budget_zero_and_empty_batch():
    trees = TreeBatch.empty(2, 0)
    accepted, length, bonus = accept_cpu(trees, np.array([[4], [9]]))
    assert accepted.tolist() == [[0], [0]] and length.tolist() == [1, 1] and bonus.tolist() == [4, 9]
    empty = accept_cpu(TreeBatch.empty(0, 5), np.zeros((0, 6), np.int64))
    assert [a.shape for a in empty] == [(0, 6), (0,), (0,)]


def test_any_integer_dtype_for_target_tokens():
    trees, target, _ = make_case(("random", 4, 16, 16, 6, 6))
    want = accept_cpu(trees, target)
    for dtype in (np.int32, np.uint16, np.int16):
        for got, expected in zip(accept_cpu(trees, target.astype(dtype)), want, strict=True):
            np.testing.assert_array_equal(got, expected)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    batch=st.integers(1, 3),
    budget=st.integers(1, 48),
    depth=st.integers(1, 8),
    k=st.integers(1, 6),
    vocab=st.integers(1, 6),
    duplicates=st.booleans(),
    follow=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_cpu_property(batch, budget, depth, k, vocab, duplicates, follow, seed):
    """Random small trees (duplicate sibling tokens included) and targets that follow the first child with
    probability ``follow``: the CPU walk equals the oracle and keeps the invariants."""
    rng = np.random.default_rng(seed)
    vocab = max(vocab, k)
    trees = build_trees(rng, batch, budget, depth, k, vocab, duplicate_ids=vocab if duplicates else 0)
    target = rng.integers(0, vocab + 1, size=(batch, budget + 1))
    for b in range(batch):
        for node in range(int(trees.node_count[b]) + 1):
            first = trees.retrieve_next_token[b, node]
            if first != -1 and rng.random() < follow:
                target[b, node] = trees.node_token_ids[b, first - 1]
    result = accept_cpu(trees, target)
    assert_matches_oracle(result, trees, target)
    assert_walk_invariants(result, trees, target)


# ---------------------------------------------------------------------------------------------------------
# validation (one-line ValueError, before any device work)


def one_line_error(match, fn, *args):
    with pytest.raises(ValueError, match=match) as info:
        fn(*args)
    assert "\n" not in str(info.value)


def test_cpu_rejects_bad_inputs():
    trees, target, _ = make_case(("random", 3, 16, 16, 6, 6))
    one_line_error("batch 2 but the trees have B = 3", accept_cpu, trees, target[:2])
    one_line_error("16 columns but the trees need N \\+ 1 = 17", accept_cpu, trees, target[:, :16])
    one_line_error("18 columns", accept_cpu, trees, np.zeros((3, 18), np.int64))
    one_line_error("2-D", accept_cpu, trees, target[0])
    one_line_error("integer token ids", accept_cpu, trees, target.astype(np.float32))
    bad = TreeBatch(**{k: v.copy() for k, v in trees.as_dict().items()})
    bad.retrieve_next_sibling = bad.retrieve_next_sibling[:, :16]
    one_line_error(
        "retrieve_next_sibling has shape \\(3, 16\\), expected \\(3, 17\\)", accept_cpu, bad, target
    )
    bad = TreeBatch(**{k: v.copy() for k, v in trees.as_dict().items()})
    bad.parents[1, 5] = 5
    one_line_error("request 1 node 5 has parent 5", accept_cpu, bad, target)
    bad = TreeBatch(**{k: v.copy() for k, v in trees.as_dict().items()})
    bad.node_count[2] = 17
    one_line_error("request 2 has node_count 17 outside 0..16", accept_cpu, bad, target)


def test_batch_and_budget_checks():
    assert check_batch_budget(np.int64(4), 0) == (4, 0)
    one_line_error("budget must be >= 0, got -1", check_batch_budget, 2, -1)
    one_line_error("batch must be >= 0, got -3", check_batch_budget, -3, 8)
    one_line_error("budget must be an integer", check_batch_budget, 2, 8.0)
    one_line_error("budget must be an integer", check_batch_budget, 2, True)
    one_line_error("exceeds the kernel's limit", check_batch_budget, 2, 2**31)


def test_device_outputs_refuse_a_negative_budget_before_touching_the_device():
    from ddtree_bench.accept import DeviceAccept

    one_line_error("budget must be >= 0, got -1", DeviceAccept, 4, -1)
    one_line_error("batch must be >= 0, got -2", DeviceAccept, -2, 8)


def host_arrays(batch, budget, target_shape=None, out_budget=None, out_batch=None, dtype=np.int64):
    """numpy stand-ins for a launch's device arrays (validation runs before anything touches CuPy)."""
    n1 = budget + 1
    trees = SimpleNamespace(
        node_token_ids=np.zeros((batch, budget), np.int64),
        retrieve_next_token=np.full((batch, n1), -1, np.int64),
        retrieve_next_sibling=np.full((batch, n1), -1, np.int64),
    )
    ob = batch if out_batch is None else out_batch
    on1 = n1 if out_budget is None else out_budget + 1
    out = SimpleNamespace(
        accepted_indices=np.zeros((ob, on1), np.int32),
        accept_length=np.zeros(ob, np.int32),
        bonus_token=np.zeros(ob, np.int64),
    )
    return np.zeros(target_shape or (batch, n1), dtype), trees, out


def test_launch_rejects_bad_shapes_before_touching_the_device():
    launch = GpuAccept().launch
    one_line_error("batch 3 but the trees have B = 4", launch, *host_arrays(4, 8, target_shape=(3, 9)))
    one_line_error(
        "10 columns but the trees need N \\+ 1 = 9", launch, *host_arrays(4, 8, target_shape=(4, 10))
    )
    one_line_error("accepted_indices has shape \\(4, 17\\)", launch, *host_arrays(4, 8, out_budget=16))
    one_line_error("accepted_indices has shape \\(5, 9\\)", launch, *host_arrays(4, 8, out_batch=5))
    target, trees, out = host_arrays(4, 8)
    out.accept_length = np.zeros(5, np.int32)
    one_line_error("accept_length has shape \\(5,\\), expected \\(4,\\)", launch, target, trees, out)
    one_line_error("target_tokens must be int64, got int32", launch, *host_arrays(4, 8, dtype=np.int32))
    target, trees, out = host_arrays(4, 8)
    trees.retrieve_next_token = trees.retrieve_next_token[:, :8]
    one_line_error(
        "retrieve_next_token has shape \\(4, 8\\), expected \\(4, 9\\)", launch, target, trees, out
    )
    target, trees, out = host_arrays(4, 8)
    out.accepted_indices = np.zeros((4, 9), np.int64)
    one_line_error("accepted_indices must be int32", launch, target, trees, out)
    target, trees, out = host_arrays(4, 8)
    one_line_error("C-contiguous", launch, np.asfortranarray(target), trees, out)
    target, trees, out = host_arrays(4, 8)
    del out.bonus_token
    one_line_error("bonus_token must be an array", launch, target, trees, out)


def test_gpu_accept_checks_host_inputs_first():
    trees, target, _ = make_case(("random", 3, 16, 16, 6, 6))
    one_line_error("batch 2 but the trees have B = 3", GpuAccept().accept, trees, target[:2])
    one_line_error("16 columns", GpuAccept().accept, trees, target[:, :16])


@pytest.mark.skipif(GPU_REASON is None, reason="a GPU is present")
def test_gpu_accept_without_gpu_says_why():
    trees, target, _ = make_case(("random", 3, 16, 16, 6, 6))
    with pytest.raises(AcceptUnavailable, match="unavailable"):
        GpuAccept().accept(trees, target)


# ---------------------------------------------------------------------------------------------------------
# the kernel: compiles, and its code run on the host (warp emulated, AddressSanitizer on) equals the CPU walk


@pytest.mark.skipif(cuda.find_nvcc() is None, reason="nvcc not found")
def test_kernel_compiles_for_configured_archs(tmp_path):
    out = tmp_path / "tree_accept.fatbin"
    info = cuda.build_fatbin(KERNEL_SOURCE, out, ["sm_90", "sm_120"])
    assert out.stat().st_size > 1000
    assert info["archs"] == ["sm_120", "sm_90"] and info["ptx"] == "compute_120"
    assert b"ddtree_tree_accept" in out.read_bytes()


EMULATOR_MAIN = r"""
// Host emulator of one launch of ddtree_tree_accept: runs every thread of every block sequentially, lane
// order within each warp, so lane 0 has walked before the others reach __shfl_sync (the only warp
// primitive the kernel uses; it broadcasts lane 0's value). Inputs and outputs are separate exact-size heap
// allocations, so AddressSanitizer reports any out-of-bounds access.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#define __host__
#define __device__
#define __global__
struct EmuDim { unsigned int x = 0, y = 1, z = 1; };
static EmuDim threadIdx, blockIdx, blockDim, gridDim;
static int emu_shfl_value = 0;
static int emu_shfl_calls = 0;
static int __shfl_sync(unsigned int mask, int value, int src) {
    if (mask != 0xffffffffu || src != 0) {
        std::fprintf(stderr, "emulator: unsupported shfl\n");
        std::exit(5);
    }
    if ((threadIdx.x & 31u) == 0) emu_shfl_value = value;
    ++emu_shfl_calls;
    return emu_shfl_value;
}
#include KERNEL_PATH

template <class T> static T* read_array(FILE* f, long long n) {
    T* p = static_cast<T*>(std::malloc(n > 0 ? n * sizeof(T) : 1));
    if (n > 0 && std::fread(p, sizeof(T), n, f) != static_cast<size_t>(n)) std::exit(2);
    return p;
}

int main(int argc, char** argv) {
    if (argc != 5) return 2;
    FILE* f = std::fopen(argv[1], "rb");
    long long header[2];
    if (!f || std::fread(header, 8, 2, f) != 2) return 2;
    const long long B = header[0], N = header[1], n1 = N + 1;
    long long* target = read_array<long long>(f, B * n1);
    long long* tokens = read_array<long long>(f, B * N);
    long long* next_token = read_array<long long>(f, B * n1);
    long long* next_sibling = read_array<long long>(f, B * n1);
    std::fclose(f);
    int* accepted = static_cast<int*>(std::malloc(B * n1 > 0 ? B * n1 * sizeof(int) : 1));
    int* length = static_cast<int*>(std::malloc(B > 0 ? B * sizeof(int) : 1));
    long long* bonus = static_cast<long long*>(std::malloc(B > 0 ? B * sizeof(long long) : 1));
    for (long long i = 0; i < B * n1; ++i) accepted[i] = SENTINEL32;
    for (long long i = 0; i < B; ++i) { length[i] = SENTINEL32; bonus[i] = SENTINEL64; }
    gridDim.x = static_cast<unsigned int>(std::atoi(argv[3]));
    blockDim.x = static_cast<unsigned int>(std::atoi(argv[4]));
    for (unsigned int bx = 0; bx < gridDim.x; ++bx) {
        blockIdx.x = bx;
        for (unsigned int w0 = 0; w0 < blockDim.x; w0 += 32) {
            emu_shfl_calls = 0;
            for (unsigned int t = w0; t < w0 + 32 && t < blockDim.x; ++t) {
                threadIdx.x = t;
                ddtree_tree_accept(target, tokens, next_token, next_sibling, static_cast<int>(B),
                                   static_cast<int>(N), accepted, length, bonus);
            }
            if (emu_shfl_calls != 0 && emu_shfl_calls != 32) {
                std::fprintf(stderr, "emulator: %d lanes of a warp reached __shfl_sync\n", emu_shfl_calls);
                return 4;
            }
        }
    }
    FILE* o = std::fopen(argv[2], "wb");
    std::fwrite(accepted, sizeof(int), B * n1, o);
    std::fwrite(length, sizeof(int), B, o);
    std::fwrite(bonus, sizeof(long long), B, o);
    std::fclose(o);
    std::free(target); std::free(tokens); std::free(next_token); std::free(next_sibling);
    std::free(accepted); std::free(length); std::free(bonus);
    return 0;
}
"""
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


def compile_emulator(source_path, output, compiler) -> bool:
    """Build the emulator around ``source_path`` (the kernel); True when AddressSanitizer is on."""
    main = output.with_suffix(".cpp")
    main.write_text(EMULATOR_MAIN)
    base = [
        *compiler,
        "-std=c++17",
        "-O1",
        "-g",
        f'-DKERNEL_PATH="{source_path}"',
        f"-DSENTINEL32={SENTINEL32}",
        f"-DSENTINEL64={SENTINEL64}LL",
        "-o",
        str(output),
        str(main),
    ]
    if subprocess.run(base[:1] + SANITIZE + base[1:], capture_output=True, text=True).returncode == 0:
        return True
    proc = subprocess.run(base, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return False


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    from ddtree_bench.native_build import compiler_unavailable_reason, find_compiler

    reason = compiler_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    output = tmp_path_factory.mktemp("accept_emulator") / "tree_accept_emulator"
    sanitized = compile_emulator(KERNEL_SOURCE, output, find_compiler())
    return SimpleNamespace(path=output, sanitized=sanitized)


def run_emulator(exe, trees, target, grid=None, block=None, tmp=None):
    """One emulated launch: ``(accepted, length, bonus)`` with the sentinels left where nothing wrote."""
    batch, budget = trees.node_token_ids.shape
    n1 = budget + 1
    if grid is None:
        (grid,), (block,) = GpuAccept.grid(batch)
    data = tmp / "in.bin"
    with open(data, "wb") as f:
        np.array([batch, budget], np.int64).tofile(f)
        for array in (target, trees.node_token_ids, trees.retrieve_next_token, trees.retrieve_next_sibling):
            np.ascontiguousarray(array, np.int64).tofile(f)
    out = tmp / "out.bin"
    proc = subprocess.run(
        [str(exe), str(data), str(out), str(grid), str(block)], capture_output=True, text=True
    )
    assert proc.returncode == 0, f"emulator exit {proc.returncode}: {proc.stderr[-3000:]}"
    raw = out.read_bytes()
    accepted = np.frombuffer(raw[: 4 * batch * n1], np.int32).reshape(batch, n1)
    length = np.frombuffer(raw[4 * batch * n1 : 4 * batch * (n1 + 1)], np.int32)
    bonus = np.frombuffer(raw[4 * batch * (n1 + 1) :], np.int64)
    assert bonus.shape == (batch,)
    return accepted, length, bonus


def assert_same_result(got, want):
    for name, g, w in zip(("accepted_indices", "accept_length", "bonus_token"), got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        if not np.array_equal(g, w):
            at = tuple(int(i) for i in np.argwhere(g != w)[0])
            raise AssertionError(f"{name} differs at {at}: got {g[at]}, expected {w[at]}")


def test_emulator_has_address_sanitizer(emulator):
    if not emulator.sanitized:
        pytest.skip("the C++ compiler has no AddressSanitizer here; out-of-bounds checks are off")


@pytest.mark.parametrize("case", CASES + GPU_GRID, ids=case_id)
def test_kernel_code_equals_cpu_walk(emulator, case, tmp_path):
    trees, target, _ = make_case(case)
    assert_same_result(run_emulator(emulator.path, trees, target, tmp=tmp_path), accept_cpu(trees, target))


@pytest.mark.parametrize("grid,block", [(None, None), (1, 32 * 64), (64, 32), (22, 100), (70, 96)])
def test_kernel_code_any_launch_shape(emulator, grid, block, tmp_path):
    """Any block of whole warps (and a partial trailing warp, which idles), any grid covering the batch,
    excess warps past the batch doing nothing."""
    trees, target, _ = make_case(("random", 64, 16, 16, 6, 6))
    assert_same_result(
        run_emulator(emulator.path, trees, target, grid, block, tmp_path), accept_cpu(trees, target)
    )


def test_kernel_code_budget_zero(emulator, tmp_path):
    trees = TreeBatch.empty(3, 0)
    got = run_emulator(emulator.path, trees, np.array([[4], [9], [1]], np.int64), tmp=tmp_path)
    assert (
        got[0].tolist() == [[0], [0], [0]] and got[1].tolist() == [1, 1, 1] and got[2].tolist() == [4, 9, 1]
    )


def test_kernel_code_hand_built_and_duplicates(emulator, tmp_path):
    trees = tree_from_parents([-1, 0, 0, 0, 2, 3], [5, 5, 5, 8, 9])
    target = np.array([[5, 0, 8, 9, 0, 0]], np.int64)
    got = run_emulator(emulator.path, trees, target, tmp=tmp_path)
    assert got[0][0].tolist() == [0, 3, 5, -1, -1, -1] and got[1][0] == 3 and got[2][0] == 0


@pytest.mark.parametrize("seed", range(12))
def test_kernel_code_survives_malformed_links(emulator, seed, tmp_path):
    """Links out of range, self loops and cycles: the walk ends, stays in bounds (AddressSanitizer) and
    writes every output, with indices in 0..N and a length in 1..N+1."""
    rng = np.random.default_rng(seed)
    trees, _, _ = make_case(("random", 4, 32, 8, 4, 4), seed=seed)
    batch, budget = trees.node_token_ids.shape
    for name in ("retrieve_next_token", "retrieve_next_sibling"):
        links = getattr(trees, name)
        mask = rng.random(links.shape) < 0.3
        links[mask] = rng.choice([-5, 0, 1, budget, budget + 1, 10**12, -(10**12)], size=mask.sum())
        cycle = rng.integers(1, budget + 1, size=links.shape)  # back and self links: cycles
        mask = rng.random(links.shape) < 0.2
        links[mask] = cycle[mask]
    trees.node_token_ids[:] = rng.integers(0, 2, size=trees.node_token_ids.shape)  # everything matches often
    target = rng.integers(0, 2, size=(batch, budget + 1))
    accepted, length, bonus = run_emulator(emulator.path, trees, target, tmp=tmp_path)
    assert ((length >= 1) & (length <= budget + 1)).all()
    for b in range(batch):
        assert accepted[b, 0] == 0
        assert ((accepted[b, 1 : length[b]] >= 1) & (accepted[b, 1 : length[b]] <= budget)).all()
        assert (accepted[b, length[b] :] == -1).all()
        assert bonus[b] == target[b, accepted[b, length[b] - 1]]


@pytest.mark.parametrize(
    "mutation,case",
    [
        (("i < n1; i += lanes", "i <= n1; i += lanes"), ("random", 4, 16, 16, 6, 6)),  # pads one too far
        (("if (tokens[c - 1] == t) match = c;", "if (match < 0 && tokens[c - 1] == t) match = c;"), None),
        (("if (b >= batch) return;", ""), ("random", 3, 16, 16, 6, 6)),  # warps past the batch run
    ],
    ids=["pad-overflow", "first-match", "no-batch-guard"],
)
def test_emulator_catches_broken_kernels(emulator, mutation, case, tmp_path):
    """The emulator tests are able to fail: each mutant of the kernel is caught (an out-of-bounds access
    or a result that differs from the CPU walk)."""
    if not emulator.sanitized and case is not None:
        pytest.skip("out-of-bounds mutants need AddressSanitizer")
    from ddtree_bench.native_build import find_compiler

    source = KERNEL_SOURCE.read_text()
    assert source.count(mutation[0]) == 1
    mutant = tmp_path / "mutant.cu"
    mutant.write_text(source.replace(mutation[0], mutation[1]))
    exe = tmp_path / "mutant"
    compile_emulator(mutant, exe, find_compiler())
    if case is None:  # first match instead of the dict's last: differs on repeated sibling tokens
        trees = tree_from_parents([-1, 0, 0, 0, 2, 3], [5, 5, 5, 8, 9])
        target = np.array([[5, 0, 8, 9, 0, 0]], np.int64)
        got = run_emulator(exe, trees, target, tmp=tmp_path)
        assert got[0][0].tolist() != accept_cpu(trees, target)[0][0].tolist()
        differing = 0  # the random duplicate-token cases tell the first match from the last, too
        for case in (c for c in CASES if c[0] == "duplicates"):
            trees, target, _ = make_case(case)
            got, want = run_emulator(exe, trees, target, tmp=tmp_path), accept_cpu(trees, target)
            differing += int((got[0] != want[0]).any(axis=1).sum())
        assert differing > 0
        return
    trees, target, _ = make_case(case)
    with pytest.raises(AssertionError, match="emulator exit"):
        run_emulator(exe, trees, target, tmp=tmp_path)


# ---------------------------------------------------------------------------------------------------------
# GPU


@pytest.fixture(scope="module")
def gpu_accept():
    return GpuAccept()


@needs_gpu
@pytest.mark.parametrize("case", GPU_GRID + CASES, ids=case_id)
def test_gpu_equals_cpu(gpu_accept, case):
    trees, target, _ = make_case(case)
    assert_same_result(gpu_accept.accept(trees, target), accept_cpu(trees, target))


@needs_gpu
def test_gpu_hand_built_duplicates_and_budget_zero(gpu_accept):
    trees = tree_from_parents([-1, 0, 0, 0, 2, 3], [5, 5, 5, 8, 9])
    target = np.array([[5, 0, 8, 9, 0, 0]], np.int64)
    assert_same_result(gpu_accept.accept(trees, target), accept_cpu(trees, target))
    zero = TreeBatch.empty(3, 0)
    target = np.array([[4], [9], [1]], np.int64)
    assert_same_result(gpu_accept.accept(zero, target), accept_cpu(zero, target))
    empty = gpu_accept.accept(TreeBatch.empty(0, 4), np.zeros((0, 5), np.int64))
    assert [a.shape for a in empty] == [(0, 5), (0,), (0,)]


def device_case(case):
    """A case's trees built by the GPU builder into DeviceTrees, plus device target tokens."""
    import cupy as cp

    kind, batch, budget, depth, k, vocab = case
    rng = np.random.default_rng([7, batch, budget])
    lp, ids = make_topk(rng, batch, depth, k, vocab)
    d_trees, _ = get_builder("gpu").build_device(lp, ids, budget, bool_visibility=False)
    trees = d_trees.to_host()
    target, _ = make_target(trees, kind, rng, vocab)
    return trees, target, d_trees, cp.asarray(target)


def sentinel_outputs(out):
    out.accepted_indices.fill(SENTINEL32)
    out.accept_length.fill(SENTINEL32)
    out.bonus_token.fill(SENTINEL64)


@needs_gpu
@pytest.mark.parametrize("budget", [1, 16, 1024])
@pytest.mark.parametrize("batch", [1, 64])
def test_gpu_launch_on_device_trees(gpu_accept, batch, budget):
    """On the GPU builder's own DeviceTrees, on a side stream, every output element written."""
    import cupy as cp

    from ddtree_bench.accept import DeviceAccept

    trees, target, d_trees, d_target = device_case(("path", batch, budget, 16, 16, 64))
    out = DeviceAccept(batch, budget)
    sentinel_outputs(out)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    gpu_accept.launch(d_target, d_trees, out, stream=stream)
    stream.synchronize()
    assert_same_result(out.to_host(), accept_cpu(trees, target))


@needs_gpu
def test_gpu_launch_replays_in_a_cuda_graph(gpu_accept):
    import cupy as cp

    from ddtree_bench.accept import DeviceAccept

    trees, target, d_trees, d_target = device_case(("path", 64, 256, 16, 16, 64))
    out = DeviceAccept(64, 256)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    gpu_accept.launch(d_target, d_trees, out, stream=stream)  # loads the module outside the capture
    stream.synchronize()
    stream.begin_capture()
    gpu_accept.launch(d_target, d_trees, out, stream=stream)
    graph = stream.end_capture()
    sentinel_outputs(out)
    cp.cuda.Device().synchronize()
    graph.launch(stream)
    stream.synchronize()
    assert_same_result(out.to_host(), accept_cpu(trees, target))


@needs_gpu
def test_gpu_rejects_bad_shapes(gpu_accept):
    import cupy as cp

    from ddtree_bench.accept import DeviceAccept

    trees, target, d_trees, d_target = device_case(("random", 4, 16, 16, 6, 6))
    one_line_error("budget must be >= 0, got -1", DeviceAccept, 4, -1)
    one_line_error(
        "batch 3 but the trees have B = 4", gpu_accept.launch, d_target[:3], d_trees, DeviceAccept(4, 16)
    )
    one_line_error(
        "16 columns but the trees need N \\+ 1 = 17",
        gpu_accept.launch,
        cp.ascontiguousarray(d_target[:, :16]),
        d_trees,
        DeviceAccept(4, 16),
    )
    one_line_error(
        "accepted_indices has shape \\(4, 33\\)", gpu_accept.launch, d_target, d_trees, DeviceAccept(4, 32)
    )
    one_line_error(
        "must be int64, got int32", gpu_accept.launch, d_target.astype(cp.int32), d_trees, DeviceAccept(4, 16)
    )
    one_line_error("C-contiguous", gpu_accept.launch, d_target[:, ::-1], d_trees, DeviceAccept(4, 16))
    one_line_error("CuPy device arrays", gpu_accept.launch, target, d_trees, DeviceAccept(4, 16))
    one_line_error("batch 3 but the trees have B = 4", gpu_accept.accept, trees, target[:3])
    one_line_error("18 columns", gpu_accept.accept, trees, np.zeros((4, 18), np.int64))
