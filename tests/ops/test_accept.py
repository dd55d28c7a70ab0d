"""Tree accept: the CPU walk equals SGLang's ``follow_verified_tree`` over SGLang's child maps; the CUDA
kernel compiles everywhere, and its code -- the kernel function itself, run by a host emulator of the warp
under AddressSanitizer -- equals the CPU walk on every case; on a GPU, ``GpuAccept`` equals it too."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
from host_programs import compile_host_program, host_program
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree_bench.builders import get_builder
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.cuda.loader import kernel_constant
from ddtree_bench.ops.accept import (
    KERNEL_SOURCE,
    MAX_THREADS,
    NODES_PER_THREAD,
    STAGE_BYTES_PER_NODE,
    STAGE_MAX_BUDGET,
    TREE_FIELD_DTYPES,
    TREE_LINK_FIELDS,
    AcceptUnavailable,
    DeviceAccept,
    GpuAccept,
    accept_cpu,
    check_batch_budget,
    host_field,
    launch_config,
)
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
    bad.parents = bad.parents[:, :16]
    one_line_error("parents has shape \\(3, 16\\), expected \\(3, 17\\)", accept_cpu, bad, target)
    bad = TreeBatch(**{k: v.copy() for k, v in trees.as_dict().items()})
    bad.node_count = bad.node_count[:2]
    one_line_error("node_count has shape \\(2,\\), expected \\(3,\\)", accept_cpu, bad, target)
    bad = TreeBatch(**{k: v.copy() for k, v in trees.as_dict().items()})
    bad.parents = bad.parents.astype(np.float64)
    one_line_error("parents must hold integer", accept_cpu, bad, target)
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
    one_line_error("budget must be >= 0, got -1", DeviceAccept, 4, -1)
    one_line_error("batch must be >= 0, got -2", DeviceAccept, -2, 8)


def host_arrays(batch, budget, target_shape=None, out_budget=None, out_batch=None, dtype=np.int64):
    """numpy stand-ins for a launch's device arrays (validation runs before anything touches CuPy)."""
    n1 = budget + 1
    trees = SimpleNamespace(
        node_count=np.zeros(batch, np.int32),
        node_token_ids=np.zeros((batch, budget), np.int64),
        parents=np.full((batch, n1), -1, np.int32),
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
    trees.parents = trees.parents[:, :8]
    one_line_error("parents has shape \\(4, 8\\), expected \\(4, 9\\)", launch, target, trees, out)
    target, trees, out = host_arrays(4, 8)
    trees.parents = trees.parents.astype(np.int64)
    one_line_error("parents must be int32, got int64", launch, target, trees, out)
    target, trees, out = host_arrays(4, 8)
    trees.node_count = trees.node_count.astype(np.int64)
    one_line_error("node_count must be int32, got int64", launch, target, trees, out)
    target, trees, out = host_arrays(4, 8)
    del trees.parents
    one_line_error("the trees lack field parents", launch, target, trees, out)
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
    bad = TreeBatch(**{k: v.copy() for k, v in trees.as_dict().items()})
    bad.parents = bad.parents.astype(np.int64)
    bad.parents[0, 3] = 2**40
    one_line_error("parents has values outside int32", GpuAccept().accept, bad, target)


def test_host_field_converts_to_the_kernel_dtypes():
    trees, _, _ = make_case(("random", 3, 16, 16, 6, 6))
    trees.parents = trees.parents.astype(np.int64)
    trees.node_count = trees.node_count.astype(np.uint8)
    for name in TREE_LINK_FIELDS:
        array = host_field(trees, name)
        assert array.dtype == TREE_FIELD_DTYPES[name] and array.flags.c_contiguous
        np.testing.assert_array_equal(array, getattr(trees, name))


def test_launch_configuration():
    """One block per request; enough threads that every node has a register slot (256 at N = 1024, one warp
    up to N = 128, at most 1024); 12 (N + 1) bytes of shared memory up to STAGE_MAX_BUDGET (under the 48 KB a
    launch may use without opting in), none above it or when forced."""
    assert launch_config(64, 1024) == ((64,), (256,), 12 * 1025)
    assert launch_config(3, 8) == ((3,), (32,), 108)
    assert launch_config(1, 0) == ((1,), (32,), 12)
    assert launch_config(5, 128)[1] == (32,) and launch_config(5, 129)[1] == (64,)
    assert launch_config(300, 2048) == ((300,), (512,), 12 * 2049)
    assert launch_config(2, STAGE_MAX_BUDGET)[2] == 12 * (STAGE_MAX_BUDGET + 1) <= 48 * 1024 - 64
    assert launch_config(2, STAGE_MAX_BUDGET + 1) == ((2,), (1024,), 0)
    assert launch_config(2, 1024, force_global=True) == ((2,), (256,), 0)
    assert GpuAccept(force_global=True).launch_config(4, 16) == ((4,), (32,), 0)
    for budget in range(0, 5000, 7):
        (threads,) = launch_config(1, budget)[1]
        assert threads % 32 == 0 and 32 <= threads <= MAX_THREADS
        assert threads * NODES_PER_THREAD >= min(budget, MAX_THREADS * NODES_PER_THREAD)


def test_launch_figures_are_read_from_the_kernel_source(tmp_path):
    """The host's launch figures are the kernel's own #defines (its __launch_bounds__ included), not a copy;
    a source without the figure is a one-line ValueError."""
    text = KERNEL_SOURCE.read_text()
    assert "__launch_bounds__(DDTREE_ACCEPT_MAX_THREADS)" in text
    assert (NODES_PER_THREAD, MAX_THREADS, STAGE_BYTES_PER_NODE) == (4, 1024, 12)
    mutant = tmp_path / "tree_accept.cu"
    define = "#define DDTREE_ACCEPT_MAX_THREADS"
    mutant.write_text(text.replace(f"{define} 1024", f"{define} 512"))
    assert kernel_constant(mutant, "DDTREE_ACCEPT_MAX_THREADS") == 512
    with pytest.raises(ValueError, match="does not #define DDTREE_ACCEPT_NOT_THERE"):
        kernel_constant(mutant, "DDTREE_ACCEPT_NOT_THERE")


def test_python_constants_match_the_kernel_source():
    source = KERNEL_SOURCE.read_text()
    assert f"#define DDTREE_ACCEPT_NODES_PER_THREAD {NODES_PER_THREAD} " in source
    assert "static_cast<unsigned long long>(DDTREE_ACCEPT_SHARED_BYTES_PER_NODE) *" in source
    assert "__launch_bounds__(DDTREE_ACCEPT_MAX_THREADS)" in source
    assert "const int* __restrict__ parents, const int* __restrict__ node_count, int batch," in source


@pytest.mark.skipif(GPU_REASON is None, reason="a GPU is present")
def test_gpu_accept_without_gpu_says_why():
    trees, target, _ = make_case(("random", 3, 16, 16, 6, 6))
    with pytest.raises(AcceptUnavailable, match="unavailable"):
        GpuAccept().accept(trees, target)


# ---------------------------------------------------------------------------------------------------------
# what the kernel computes on any input, malformed included


def kernel_reference(trees, target):
    """The kernel's definition, for any parents and node counts: node ``i`` in ``1..clamp(node_count, 0, N)``
    whose parent ``p`` satisfies ``0 <= p < i`` is a child of ``p`` (every other parent never matches);
    ``next[p]`` is the largest such child whose token is ``target[p]``; the walk follows ``next`` from the
    root. On a well-formed tree this is exactly SGLang's walk (``accept_cpu``)."""
    batch, budget = trees.node_token_ids.shape
    accepted = np.full((batch, budget + 1), -1, np.int32)
    length = np.zeros(batch, np.int32)
    bonus = np.zeros(batch, np.int64)
    for b in range(batch):
        count = min(max(int(trees.node_count[b]), 0), budget)
        chosen = [0] * (budget + 1)
        for i in range(1, count + 1):
            p = int(trees.parents[b, i])
            if 0 <= p < i and trees.node_token_ids[b, i - 1] == target[b, p]:
                chosen[p] = i  # increasing i: the largest index wins
        path = [0]
        while chosen[path[-1]]:
            path.append(chosen[path[-1]])
        accepted[b, : len(path)] = path
        length[b], bonus[b] = len(path), target[b, path[-1]]
    return accepted, length, bonus


def malformed_case(seed: int, batch: int = 4, budget: int = 32):
    """Trees with wrecked parents and node counts (negative, >= the child, past N, int32 extremes, self
    parents) and tokens / targets over {0, 1}, so that almost every comparison matches."""
    rng = np.random.default_rng(seed)
    trees, _, _ = make_case(("random", batch, budget, 8, 4, 4), seed=seed)
    parents = trees.parents
    index = np.broadcast_to(np.arange(budget + 1), parents.shape)
    choices = np.stack(
        [index, index + 1, np.full_like(index, budget), np.full_like(index, budget + 1), index // 2]
    )
    wild = choices[rng.integers(0, len(choices), size=parents.shape), np.arange(batch)[:, None], index]
    mask = rng.random(parents.shape) < 0.3
    parents[mask] = wild[mask]
    mask = rng.random(parents.shape) < 0.1
    parents[mask] = rng.choice([-5, -1, 2**31 - 1, -(2**31)], size=int(mask.sum()))
    trees.node_count[:] = rng.choice([-3, 0, budget // 2, budget, budget + 5, 2**31 - 1], size=batch)
    trees.node_count[0] = budget  # at least one whole tree
    trees.node_token_ids[:] = rng.integers(0, 2, size=trees.node_token_ids.shape)
    target = rng.integers(0, 2, size=(batch, budget + 1)).astype(np.int64)
    return trees, target


def assert_kernel_output_in_bounds(result, trees, target):
    accepted, length, bonus = result
    batch, budget = trees.node_token_ids.shape
    assert ((length >= 1) & (length <= budget + 1)).all()
    for b in range(batch):
        path = accepted[b, : length[b]]
        assert path[0] == 0 and (np.diff(path) > 0).all() and path[-1] <= budget
        assert (accepted[b, length[b] :] == -1).all()
        assert bonus[b] == target[b, path[-1]]


def test_kernel_reference_equals_the_cpu_walk_on_well_formed_trees():
    for case in CASES:
        trees, target, _ = make_case(case)
        assert_same_result(kernel_reference(trees, target), accept_cpu(trees, target))


def test_kernel_reference_on_malformed_trees_stays_in_bounds():
    lengths = []
    for seed in range(10):
        trees, target = malformed_case(seed)
        result = kernel_reference(trees, target)
        assert_kernel_output_in_bounds(result, trees, target)
        lengths.extend(result[1].tolist())
    assert max(lengths) >= 3 and min(lengths) == 1  # the walks do go somewhere, and not always


def assert_same_result(got, want):
    for name, g, w in zip(("accepted_indices", "accept_length", "bonus_token"), got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        if not np.array_equal(g, w):
            at = tuple(int(i) for i in np.argwhere(g != w)[0])
            raise AssertionError(f"{name} differs at {at}: got {g[at]}, expected {w[at]}")


# ---------------------------------------------------------------------------------------------------------
# the kernel: compiles, and its code run on the host (every thread a host thread, barriers and shared atomics
# emulated, AddressSanitizer or ThreadSanitizer on) equals the CPU walk


@pytest.mark.skipif(cuda.find_nvcc() is None, reason="nvcc not found")
def test_kernel_compiles_for_configured_archs(tmp_path):
    out = tmp_path / "tree_accept.fatbin"
    info = cuda.build_fatbin(KERNEL_SOURCE, out, ["sm_90", "sm_120"])
    assert out.stat().st_size > 1000
    assert info["archs"] == ["sm_120", "sm_90"] and info["ptx"] == "compute_120"
    assert b"ddtree_tree_accept" in out.read_bytes()


EMULATOR_MAIN = r"""
// Host emulator of one launch of ddtree_tree_accept: the blocks one after another, each block's blockDim.x
// threads as real host threads (pthreads) that meet at an emulated __syncthreads (a thread that returns while
// others wait at a barrier, or the reverse, is an error); atomicMax by compare-and-swap. The dynamic shared
// memory is an exact-size heap allocation refilled with garbage before every block, the inputs and outputs
// exact-size allocations too, so AddressSanitizer reports any out-of-bounds access; built with
// ThreadSanitizer instead, a missing barrier shows up as a data race.
enum { EMU_SYNCTHREADS, EMU_KERNEL_END, EMU_BLOCK_START };
#define EMU_KIND_NAMES {"__syncthreads", "the kernel's end", "the block's start"}
#include "host_emulator.h"
#define __launch_bounds__(n)
#define __shared__ static
static unsigned int emu_shared_bytes = 0;
#define DDTREE_ACCEPT_DYNAMIC_SHARED emu_shared
#define DDTREE_ACCEPT_DYNAMIC_SHARED_BYTES() emu_shared_bytes

static void __syncthreads() { emu_meet(EMU_SYNCTHREADS); }
static int atomicMax(int* address, int value) {
    int old = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (old < value &&
           !__atomic_compare_exchange_n(address, &old, value, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
#include KERNEL_PATH

static long long B, N;
static long long *target, *tokens, *bonus;
static int *parents, *counts, *accepted, *length;

static void* emu_thread(void* arg) {
    threadIdx.x = static_cast<unsigned int>(reinterpret_cast<size_t>(arg));
    for (unsigned int bx = 0; bx < gridDim.x; ++bx) {
        if (threadIdx.x == 0 && emu_shared_bytes > 0)
            std::memset(emu_shared, 0xA5 ^ (bx & 0xFF), emu_shared_bytes);  // uninitialised shared memory
        emu_meet(EMU_BLOCK_START);
        blockIdx.x = bx;
        ddtree_tree_accept(target, tokens, parents, counts, static_cast<int>(B), static_cast<int>(N),
                           accepted, length, bonus);
        emu_meet(EMU_KERNEL_END);
    }
    return nullptr;
}

int main(int argc, char** argv) {
    if (argc != 6) return 2;
    FILE* f = std::fopen(argv[1], "rb");
    long long header[2];
    if (!f || std::fread(header, 8, 2, f) != 2) return 2;
    B = header[0];
    N = header[1];
    const long long n1 = N + 1;
    target = read_array<long long>(f, B * n1);
    tokens = read_array<long long>(f, B * N);
    parents = read_array<int>(f, B * n1);
    counts = read_array<int>(f, B);
    std::fclose(f);
    accepted = static_cast<int*>(std::malloc(B * n1 > 0 ? B * n1 * sizeof(int) : 1));
    length = static_cast<int*>(std::malloc(B > 0 ? B * sizeof(int) : 1));
    bonus = static_cast<long long*>(std::malloc(B > 0 ? B * sizeof(long long) : 1));
    for (long long i = 0; i < B * n1; ++i) accepted[i] = SENTINEL32;
    for (long long i = 0; i < B; ++i) { length[i] = SENTINEL32; bonus[i] = SENTINEL64; }
    gridDim.x = static_cast<unsigned int>(std::atoi(argv[3]));
    blockDim.x = static_cast<unsigned int>(std::atoi(argv[4]));
    emu_shared_bytes = static_cast<unsigned int>(std::atol(argv[5]));
    emu_shared = static_cast<unsigned char*>(std::malloc(emu_shared_bytes > 0 ? emu_shared_bytes : 1));
    if (!emu_run_block_threads(emu_thread)) return 3;
    FILE* o = std::fopen(argv[2], "wb");
    std::fwrite(accepted, sizeof(int), B * n1, o);
    std::fwrite(length, sizeof(int), B, o);
    std::fwrite(bonus, sizeof(long long), B, o);
    std::fclose(o);
    std::fprintf(stderr, "emulator: %d barriers\n", emu_held[EMU_SYNCTHREADS]);
    std::free(target); std::free(tokens); std::free(parents); std::free(counts);
    std::free(accepted); std::free(length); std::free(bonus); std::free(emu_shared);
    return 0;
}
"""
TSAN_OPTIONS = "halt_on_error=1 exitcode=66 report_signal_unsafe=0"


def emulator_flags(source_path) -> list[str]:
    """The emulator around the kernel at ``source_path`` (the kernel file, or a mutant of it)."""
    return [f'-DKERNEL_PATH="{source_path}"', f"-DSENTINEL32={SENTINEL32}", f"-DSENTINEL64={SENTINEL64}LL"]


def _emulator_fixture(tmp_path_factory, sanitizer):
    flags = emulator_flags(KERNEL_SOURCE)
    return host_program(tmp_path_factory, f"accept_emulator_{sanitizer}", EMULATOR_MAIN, flags, sanitizer)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    return _emulator_fixture(tmp_path_factory, "address")


@pytest.fixture(scope="module")
def tsan_emulator(tmp_path_factory):
    emu = _emulator_fixture(tmp_path_factory, "thread")
    if not emu.sanitized:
        pytest.skip("the C++ compiler has no ThreadSanitizer here")
    return emu


def run_emulator(exe, trees, target, grid=None, block=None, shared=None, tmp=None, force_global=False):
    """One emulated launch (``GpuAccept``'s launch configuration unless ``grid`` / ``block`` / ``shared``
    say otherwise): ``(accepted, length, bonus)`` with the sentinels left where nothing wrote."""
    batch, budget = trees.node_token_ids.shape
    n1 = budget + 1
    default_grid, default_block, default_shared = launch_config(batch, budget, force_global)
    grid = default_grid[0] if grid is None else grid
    block = default_block[0] if block is None else block
    shared = default_shared if shared is None else shared
    data = tmp / "in.bin"
    with open(data, "wb") as f:
        np.array([batch, budget], np.int64).tofile(f)
        np.ascontiguousarray(target, np.int64).tofile(f)
        for name in ("node_token_ids", "parents", "node_count"):
            np.ascontiguousarray(getattr(trees, name), TREE_FIELD_DTYPES[name]).tofile(f)
    out = tmp / "out.bin"
    env = {**os.environ, "TSAN_OPTIONS": TSAN_OPTIONS}
    proc = subprocess.run(
        [str(exe), str(data), str(out), str(grid), str(block), str(shared)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, f"emulator exit {proc.returncode}: {proc.stderr[-3000:]}"
    raw = out.read_bytes()
    accepted = np.frombuffer(raw[: 4 * batch * n1], np.int32).reshape(batch, n1)
    length = np.frombuffer(raw[4 * batch * n1 : 4 * batch * (n1 + 1)], np.int32)
    bonus = np.frombuffer(raw[4 * batch * (n1 + 1) :], np.int64)
    assert bonus.shape == (batch,)
    return accepted, length, bonus


PATHS = ["staged", "global"]

# beyond the GPU grid: the largest budgets the GPU builder makes, and budgets past the staging limit
EMULATOR_EXTRA = [
    ("path", 5, 2048, 16, 64, 64),
    ("duplicates", 3, 2048, 16, 32, 3),
    ("path", 2, STAGE_MAX_BUDGET, 16, 64, 64),
    ("path", 2, STAGE_MAX_BUDGET + 1, 16, 64, 64),  # the global path by budget
    ("random", 2, 4500, 16, 4, 6),
]


def test_emulator_has_address_sanitizer(emulator):
    if not emulator.sanitized:
        pytest.skip("the C++ compiler has no AddressSanitizer here; out-of-bounds checks are off")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES + GPU_GRID + EMULATOR_EXTRA, ids=case_id)
def test_kernel_code_equals_cpu_walk(emulator, case, path, tmp_path):
    trees, target, _ = make_case(case)
    got = run_emulator(emulator.path, trees, target, tmp=tmp_path, force_global=path == "global")
    assert_same_result(got, accept_cpu(trees, target))


@pytest.mark.parametrize(
    "grid,block,shared",
    [
        (None, None, None),
        (None, 1, None),  # one thread: every node past the register slots
        (None, 33, None),  # not whole warps
        (None, 96, None),
        (None, 1024, None),  # more threads than nodes
        (70, 64, None),  # blocks past the batch return
        (None, 64, 12 * 17 - 1),  # one byte short of staging: the global path, no shared access
        (None, 64, 0),
        (None, 64, 12 * 17 + 4096),  # more shared memory than needed
    ],
)
def test_kernel_code_any_launch_shape(emulator, grid, block, shared, tmp_path):
    """Any block size, any grid covering the batch, any dynamic shared size (the kernel stages only when it
    has enough)."""
    trees, target, _ = make_case(("random", 64, 16, 16, 6, 6))
    assert_same_result(
        run_emulator(emulator.path, trees, target, grid, block, shared, tmp_path), accept_cpu(trees, target)
    )


@pytest.mark.parametrize("block", [1, 32, 100])
@pytest.mark.parametrize("path", PATHS)
def test_kernel_code_small_blocks_on_large_budgets(emulator, block, path, tmp_path):
    trees, target, _ = make_case(("path", 3, 1024, 16, 64, 64))
    got = run_emulator(emulator.path, trees, target, block=block, tmp=tmp_path, force_global=path == "global")
    assert_same_result(got, accept_cpu(trees, target))


@pytest.mark.parametrize("path", PATHS)
def test_kernel_code_budget_zero(emulator, path, tmp_path):
    trees = TreeBatch.empty(3, 0)
    target = np.array([[4], [9], [1]], np.int64)
    got = run_emulator(emulator.path, trees, target, tmp=tmp_path, force_global=path == "global")
    assert (
        got[0].tolist() == [[0], [0], [0]] and got[1].tolist() == [1, 1, 1] and got[2].tolist() == [4, 9, 1]
    )


def many_duplicate_children(children: int = 300):
    """The root with ``children`` children all carrying token 5, each with one child of token 6: the walk must
    take the last root child, then its child."""
    parents = [-1] + [0] * children + list(range(1, children + 1))
    tokens = [5] * children + [6] * children
    trees = tree_from_parents(parents, tokens)
    target = np.full((1, 2 * children + 1), 6, np.int64)
    target[0, 0] = 5
    return trees, target, [0, children, 2 * children]


@pytest.mark.parametrize("path", PATHS)
def test_kernel_code_hand_built_and_duplicates(emulator, path, tmp_path):
    force = path == "global"
    trees = tree_from_parents([-1, 0, 0, 0, 2, 3], [5, 5, 5, 8, 9])
    target = np.array([[5, 0, 8, 9, 0, 0]], np.int64)
    got = run_emulator(emulator.path, trees, target, tmp=tmp_path, force_global=force)
    assert got[0][0].tolist() == [0, 3, 5, -1, -1, -1] and got[1][0] == 3 and got[2][0] == 0
    trees, target, path_nodes = many_duplicate_children()
    got = run_emulator(emulator.path, trees, target, tmp=tmp_path, force_global=force)
    assert got[0][0, :3].tolist() == path_nodes and got[1][0] == 3 and got[2][0] == 6
    assert_same_result(got, accept_cpu(trees, target))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("seed", range(10))
def test_kernel_code_survives_malformed_parents(emulator, seed, path, tmp_path):
    """Parents negative, >= their child, past N or at the int32 extremes, node counts out of range: the walk
    ends, stays in bounds (AddressSanitizer), writes every output, and computes kernel_reference."""
    trees, target = malformed_case(seed)
    got = run_emulator(emulator.path, trees, target, tmp=tmp_path, force_global=path == "global")
    assert_kernel_output_in_bounds(got, trees, target)
    assert_same_result(got, kernel_reference(trees, target))


def chain_tree(budget: int):
    """The chain 0 -> 1 -> ... -> N, with targets that follow it to the end (bonus 7)."""
    trees = tree_from_parents([-1, *range(budget)], list(range(100, 100 + budget)))
    target = np.array([[*range(100, 100 + budget), 7]], np.int64)
    return trees, target


@pytest.mark.parametrize("path", PATHS)
def test_kernel_code_chain_tree_accepts_every_node(emulator, path, tmp_path):
    """The chain: the walk's longest case (N + 1 nodes); in the global path each node's link is read from
    the very element of the output row that the walk writes next."""
    budget = 700
    trees, target = chain_tree(budget)
    got = run_emulator(emulator.path, trees, target, tmp=tmp_path, force_global=path == "global")
    assert got[1][0] == budget + 1 and got[0][0].tolist() == list(range(budget + 1)) and got[2][0] == 7


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "case,block",
    [
        (("random", 4, 64, 16, 6, 6), None),
        (("path", 2, 1024, 16, 64, 64), None),
        (("random", 3, 100, 8, 4, 4), 32),
    ],
    ids=["random-B4-N64", "path-B2-N1024", "random-B3-N100-block32"],
)
def test_kernel_code_has_no_data_race(tsan_emulator, case, block, path, tmp_path):
    """ThreadSanitizer: every shared or global element written by one thread and touched by another is
    separated by a barrier (or both are atomics)."""
    trees, target, _ = make_case(case)
    got = run_emulator(
        tsan_emulator.path, trees, target, block=block, tmp=tmp_path, force_global=path == "global"
    )
    assert_same_result(got, accept_cpu(trees, target))


def _mutant(tmp_path, *edits, sanitizer="address"):
    """The kernel with each ``(old, new)`` edit applied (``old`` must occur once), built into the emulator."""
    source = KERNEL_SOURCE.read_text()
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    mutant = tmp_path / "mutant.cu"
    mutant.write_text(source)
    exe = tmp_path / f"mutant_{sanitizer}"
    compile_host_program(EMULATOR_MAIN, exe, emulator_flags(mutant), sanitizer)
    return exe


def _differs(exe, tmp_path, cases, force_global=False, block=None) -> bool:
    for case in cases:
        trees, target, _ = make_case(case)
        got = run_emulator(exe, trees, target, block=block, tmp=tmp_path, force_global=force_global)
        if any(not np.array_equal(g, w) for g, w in zip(got, accept_cpu(trees, target), strict=True)):
            return True
    return False


@pytest.mark.parametrize(
    "mutation,how",
    [
        (("i < n1; i += stride) accepted[i] = -1", "i <= n1; i += stride) accepted[i] = -1"), "oob"),
        (("if (b >= batch) return;", ""), "oob-grid"),
        (("if (p >= 0 && p < i && token", "if (p >= 0 && token"), "oob-malformed"),
        (("if (kStaged) staged_target[0] = root_target;", ""), "staged-differs"),
        (
            (
                "const int child = next[cur];\n            accepted[length++] = cur;",
                "accepted[length] = cur;\n            const int child = next[cur];\n            ++length;",
            ),
            "global-differs",
        ),
        (
            (
                "for (int i = 1 + tid + R * stride; i <= count;",
                "for (int i = 1 + tid + (R + 1) * stride; i <= count;",
            ),
            "small-block-differs",
        ),
        (
            [  # the smallest matching index wins (encoded as 2^30 - i, so that the max picks it)
                ("atomicMax(next + p, i)", "atomicMax(next + p, (1 << 30) - i)"),
                ("const int child = next[cur];", "const int child = next[cur] ? (1 << 30) - next[cur] : 0;"),
            ],
            "duplicates-differ",
        ),
    ],
    ids=[
        "pad-overflow",
        "no-batch-guard",
        "no-parent-guard",
        "staged-root",
        "global-walk-order",
        "slot-remainder",
        "first-match",
    ],
)
def test_emulator_catches_broken_kernels(emulator, mutation, how, tmp_path):
    """The emulator tests are able to fail: each mutant of the kernel is caught (an out-of-bounds access or a
    result that differs from the CPU walk), on the path it breaks."""
    if not emulator.sanitized and how.startswith("oob"):
        pytest.skip("out-of-bounds mutants need AddressSanitizer")
    exe = _mutant(tmp_path, *(mutation if isinstance(mutation[0], tuple) else [mutation]))
    small = [("random", 3, 16, 16, 6, 6)]
    if how == "oob":
        trees, target, _ = make_case(small[0])
        with pytest.raises(AssertionError, match="emulator exit"):
            run_emulator(exe, trees, target, tmp=tmp_path)
    elif how == "oob-grid":
        trees, target, _ = make_case(small[0])
        with pytest.raises(AssertionError, match="emulator exit"):
            run_emulator(exe, trees, target, grid=5, tmp=tmp_path)
    elif how == "oob-malformed":
        trees, target = malformed_case(0)
        with pytest.raises(AssertionError, match="emulator exit"):
            run_emulator(exe, trees, target, tmp=tmp_path)
    elif how == "staged-differs":
        assert _differs(exe, tmp_path, CASES) and not _differs(exe, tmp_path, CASES, force_global=True)
    elif how == "global-differs":  # the walk clobbers next[] only where they alias: the global path
        chain = [("path", 2, 30, 1, 40, 50), *CASES]
        assert _differs(exe, tmp_path, chain, force_global=True) and not _differs(exe, tmp_path, chain)
    elif how == "small-block-differs":
        trees, target = chain_tree(300)  # every node on the path: nodes 129...160 of a 32-thread block lost
        want = accept_cpu(trees, target)
        got = run_emulator(exe, trees, target, block=32, tmp=tmp_path)
        assert got[1][0] == 129 and want[1][0] == 301
        assert_same_result(run_emulator(exe, trees, target, tmp=tmp_path), want)  # 96 threads: no remainder
    else:  # a reversed preference: differs on repeated sibling tokens only
        trees = tree_from_parents([-1, 0, 0, 0, 2, 3], [5, 5, 5, 8, 9])
        target = np.array([[5, 0, 8, 9, 0, 0]], np.int64)
        assert run_emulator(exe, trees, target, tmp=tmp_path)[0][0].tolist() != [0, 3, 5, -1, -1, -1]
        assert _differs(exe, tmp_path, [c for c in CASES if c[0] == "duplicates"])
        assert not _differs(exe, tmp_path, [c for c in CASES if c[0] == "path"])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("barrier", [0, 1, 2])
def test_thread_sanitizer_catches_a_missing_barrier(tsan_emulator, barrier, path, tmp_path):
    """Each of the kernel's three __syncthreads is needed, on both paths: without it ThreadSanitizer reports
    a data race."""
    source = KERNEL_SOURCE.read_text()
    assert source.count("__syncthreads();") == 3
    at = -1
    for _ in range(barrier + 1):
        at = source.index("__syncthreads();", at + 1)
    exe = _mutant(tmp_path, (source[at : at + 80], source[at + 16 : at + 80]), sanitizer="thread")
    trees, target, _ = make_case(("path", 4, 64, 16, 8, 50))
    with pytest.raises(AssertionError, match="(?s)emulator exit 66: .*ThreadSanitizer: data race"):
        run_emulator(exe, trees, target, block=32, tmp=tmp_path, force_global=path == "global")


# ---------------------------------------------------------------------------------------------------------
# GPU


@pytest.fixture(scope="module")
def gpu_accept():
    return GpuAccept()


@pytest.fixture(scope="module")
def gpu_accept_global():
    return GpuAccept(force_global=True)


def accepts(gpu_accept, gpu_accept_global, path):
    return gpu_accept_global if path == "global" else gpu_accept


# batch 1...300, budget 1...2048 (both paths), and budgets past the staging limit (the global path by budget)
GPU_WIDE = [
    (kind, batch, budget, 16, k, vocab)
    for batch in (1, 300)
    for budget in (1, 5, 100, 1500, 2048)
    for kind, k, vocab in (("path", 64, 64), ("random", 4, 6), ("duplicates", 32, 3))
] + [("path", 2, STAGE_MAX_BUDGET + 1, 16, 64, 64), ("random", 5, 6000, 16, 4, 6)]


@needs_gpu
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", GPU_GRID + CASES + GPU_WIDE, ids=case_id)
def test_gpu_equals_cpu(gpu_accept, gpu_accept_global, case, path):
    trees, target, _ = make_case(case)
    got = accepts(gpu_accept, gpu_accept_global, path).accept(trees, target)
    assert_same_result(got, accept_cpu(trees, target))


@needs_gpu
@pytest.mark.parametrize("path", PATHS)
def test_gpu_hand_built_duplicates_and_budget_zero(gpu_accept, gpu_accept_global, path):
    accept = accepts(gpu_accept, gpu_accept_global, path)
    trees = tree_from_parents([-1, 0, 0, 0, 2, 3], [5, 5, 5, 8, 9])
    target = np.array([[5, 0, 8, 9, 0, 0]], np.int64)
    assert_same_result(accept.accept(trees, target), accept_cpu(trees, target))
    for children in (3, 300, 1000):
        trees, target, path_nodes = many_duplicate_children(children)
        got = accept.accept(trees, target)
        assert got[0][0, :3].tolist() == path_nodes and got[1][0] == 3
        assert_same_result(got, accept_cpu(trees, target))
    zero = TreeBatch.empty(3, 0)
    target = np.array([[4], [9], [1]], np.int64)
    assert_same_result(accept.accept(zero, target), accept_cpu(zero, target))
    empty = accept.accept(TreeBatch.empty(0, 4), np.zeros((0, 5), np.int64))
    assert [a.shape for a in empty] == [(0, 5), (0,), (0,)]


@needs_gpu
@pytest.mark.parametrize("path", PATHS)
def test_gpu_chain_tree_accepts_every_node(gpu_accept, gpu_accept_global, path):
    budget = 2048
    trees, target = chain_tree(budget)
    got = accepts(gpu_accept, gpu_accept_global, path).accept(trees, target)
    assert got[1][0] == budget + 1 and got[0][0].tolist() == list(range(budget + 1)) and got[2][0] == 7


class GuardedOutputs:
    """``DeviceAccept``-shaped outputs inside larger sentinel-filled buffers: a write outside the rows lands
    in a guard and shows up."""

    GUARD = 4096

    def __init__(self, batch: int, budget: int):
        import cupy as cp  # noqa: PLC0415

        n1, g = budget + 1, self.GUARD
        self.batch, self.budget = batch, budget
        self._buffers = [
            cp.full(batch * n1 + 2 * g, SENTINEL32, cp.int32),
            cp.full(batch + 2 * g, SENTINEL32, cp.int32),
            cp.full(batch + 2 * g, SENTINEL64, cp.int64),
        ]
        self.accepted_indices = self._buffers[0][g : g + batch * n1].reshape(batch, n1)
        self.accept_length = self._buffers[1][g : g + batch]
        self.bonus_token = self._buffers[2][g : g + batch]

    def to_host(self):
        return self.accepted_indices.get(), self.accept_length.get(), self.bonus_token.get()

    def guards_intact(self) -> bool:
        g = self.GUARD
        for buffer in self._buffers:
            host = buffer.get()
            sentinel = SENTINEL64 if host.dtype == np.int64 else SENTINEL32
            if not ((host[:g] == sentinel).all() and (host[-g:] == sentinel).all()):
                return False
        return True


@needs_gpu
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("seed", range(6))
def test_gpu_survives_malformed_parents(gpu_accept, gpu_accept_global, seed, path):
    """Wrecked parents and node counts: the launch finishes, writes nothing outside the outputs (guards),
    writes every output element, and computes kernel_reference (out-of-bounds reads are the emulator's to
    catch, under AddressSanitizer; run this file under compute-sanitizer to check them on the GPU too)."""
    import cupy as cp  # noqa: PLC0415

    accept = accepts(gpu_accept, gpu_accept_global, path)
    for batch, budget in ((4, 32), (3, 1024), (2, STAGE_MAX_BUDGET + 100)):
        trees, target = malformed_case(seed, batch, budget)
        out = GuardedOutputs(batch, budget)
        d_trees = SimpleNamespace(**{name: cp.asarray(host_field(trees, name)) for name in TREE_LINK_FIELDS})
        accept.launch(cp.asarray(target), d_trees, out)
        cp.cuda.Device().synchronize()
        got = out.to_host()
        assert out.guards_intact()
        assert_kernel_output_in_bounds(got, trees, target)
        assert_same_result(got, kernel_reference(trees, target))


def device_case(case):
    """A case's trees built by the GPU builder into DeviceTrees, plus device target tokens."""
    import cupy as cp  # noqa: PLC0415

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
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("budget", [1, 16, 1024, 2048])
@pytest.mark.parametrize("batch", [1, 64, 300])
def test_gpu_launch_on_device_trees(gpu_accept, gpu_accept_global, batch, budget, path):
    """On the GPU builder's own DeviceTrees, on a side stream, every output element written."""
    import cupy as cp  # noqa: PLC0415

    trees, target, d_trees, d_target = device_case(("path", batch, budget, 16, 16, 64))
    out = DeviceAccept(batch, budget)
    sentinel_outputs(out)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    accepts(gpu_accept, gpu_accept_global, path).launch(d_target, d_trees, out, stream=stream)
    stream.synchronize()
    assert_same_result(out.to_host(), accept_cpu(trees, target))


@needs_gpu
@pytest.mark.parametrize("path", PATHS)
def test_gpu_launch_replays_in_a_cuda_graph(gpu_accept, gpu_accept_global, path):
    import cupy as cp  # noqa: PLC0415

    accept = accepts(gpu_accept, gpu_accept_global, path)
    trees, target, d_trees, d_target = device_case(("path", 64, 256, 16, 16, 64))
    out = DeviceAccept(64, 256)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    accept.launch(d_target, d_trees, out, stream=stream)  # loads the module outside the capture
    stream.synchronize()
    stream.begin_capture()
    accept.launch(d_target, d_trees, out, stream=stream)
    graph = stream.end_capture()
    sentinel_outputs(out)
    cp.cuda.Device().synchronize()
    graph.launch(stream)
    stream.synchronize()
    assert_same_result(out.to_host(), accept_cpu(trees, target))


@needs_gpu
def test_gpu_rejects_bad_shapes(gpu_accept):
    import cupy as cp  # noqa: PLC0415

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
    wrong = SimpleNamespace(node_count=d_trees.node_count, node_token_ids=d_trees.node_token_ids)
    wrong.parents = d_trees.parents.astype(cp.int64)
    one_line_error(
        "parents must be int32, got int64", gpu_accept.launch, d_target, wrong, DeviceAccept(4, 16)
    )
    one_line_error("batch 3 but the trees have B = 4", gpu_accept.accept, trees, target[:3])
    one_line_error("18 columns", gpu_accept.accept, trees, np.zeros((4, 18), np.int64))
