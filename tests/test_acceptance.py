"""``acceptance``: path scores equal a slow root-path recomputation and the reference heap's own ``logw``;
the expected acceptance of a hand-built tree; target tokens are deterministic, padded, absent past the last
row, and make the walk's mean accept length ``1 + expected_accepted_tokens``."""

from __future__ import annotations

import heapq
import math
from types import SimpleNamespace

import numpy as np
import pytest

from ddtree_bench.acceptance import (
    absent_token,
    expected_accepted_tokens,
    node_columns,
    node_log_probs,
    sample_target_tokens,
)
from ddtree_bench.builders import get_builder
from ddtree_bench.builders import reference as reference_module
from ddtree_bench.ops.accept import accept_cpu
from ddtree_bench.tree import TreeBatch

# kinds of conftest.make_topk whose rows hold distinct token ids (a top-K of a vocabulary)
DISTINCT_KINDS = ("uniform", "peaked", "bf16", "equal")
# (batch, depth, k, budget): K < N, K > N, drained heaps (fewer paths than the budget), budget 1
SHAPES = [(3, 4, 6, 16), (2, 16, 32, 8), (2, 2, 2, 20), (4, 3, 5, 1), (2, 8, 16, 64)]


def reference_trees(lp, ids, budget) -> TreeBatch:
    return get_builder("reference").build(lp, ids, budget)


def slow_scores(lp, ids, trees: TreeBatch) -> np.ndarray:
    """Per node, the root path walked through ``parents`` and each token found in its row by a list
    search: the sum of the log-probs, in Python floats."""
    batch, budget = trees.node_token_ids.shape
    out = np.full((batch, budget), -np.inf)
    for b in range(batch):
        for node in range(1, int(trees.node_count[b]) + 1):
            total, at = 0.0, node
            path = []
            while at != 0:
                path.append(at)
                at = int(trees.parents[b, at])
            for at in reversed(path):  # root to node
                depth = int(trees.node_depths[b, at - 1])
                row = ids[b, depth - 1].tolist()
                column = row.index(int(trees.node_token_ids[b, at - 1]))
                total += float(lp[b, depth - 1, column])
            out[b, node - 1] = total
    return out


def heap_scores(monkeypatch, lp, ids, budget) -> tuple[TreeBatch, np.ndarray]:
    """The reference build, recording the ``logw`` of every entry it pops (node ``i`` of request ``b`` is
    the ``i``-th pop of that request)."""
    popped = []

    def recording_heappop(heap):
        entry = heapq.heappop(heap)
        popped.append(entry[-1])
        return entry

    shim = SimpleNamespace(heappush=heapq.heappush, heappop=recording_heappop)
    monkeypatch.setattr(reference_module, "heapq", shim)
    trees = reference_trees(lp, ids, budget)
    monkeypatch.undo()
    scores = np.full(trees.node_token_ids.shape, -np.inf)
    at = 0
    for b in range(trees.batch_size):
        n = int(trees.node_count[b])
        scores[b, :n] = popped[at : at + n]
        at += n
    assert at == len(popped)
    return trees, scores


@pytest.mark.parametrize("kind", DISTINCT_KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_node_log_probs_equal_slow_recomputation(topk_inputs, kind, shape):
    batch, depth, k, budget = shape
    lp, ids = topk_inputs(kind, batch, depth, k, seed=11)
    trees = reference_trees(lp, ids, budget)
    got = node_log_probs(lp, ids, trees)
    want = slow_scores(lp, ids, trees)
    assert got.dtype == np.float64 and got.shape == (batch, budget)
    real = np.arange(budget)[None, :] < trees.node_count[:, None]
    assert np.isneginf(got[~real]).all()
    np.testing.assert_allclose(got[real], want[real], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", DISTINCT_KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_node_log_probs_equal_the_reference_heaps_scores(monkeypatch, topk_inputs, kind, shape):
    batch, depth, k, budget = shape
    lp, ids = topk_inputs(kind, batch, depth, k, seed=5)
    trees, want = heap_scores(monkeypatch, lp, ids, budget)
    got = node_log_probs(lp, ids, trees)
    real = np.isfinite(want)
    assert np.array_equal(real, np.isfinite(got))
    np.testing.assert_allclose(got[real], want[real], rtol=0, atol=1e-12)
    # the heap pops in non-increasing logw: so do the scores in node order
    for b in range(batch):
        n = int(trees.node_count[b])
        assert (np.diff(got[b, :n]) <= 1e-12).all()


def test_native_trees_give_the_same_scores(topk_inputs, native_library):
    lp, ids = topk_inputs("bf16", 4, 8, 32, seed=2)
    native = get_builder("native", library=native_library).build(lp, ids, 48)
    reference = reference_trees(lp, ids, 48)
    assert np.array_equal(node_log_probs(lp, ids, native), node_log_probs(lp, ids, reference))


def tiny_inputs():
    """L = 2, K = 2: row 0 probabilities (0.6, 0.3) on tokens (10, 11), row 1 (0.7, 0.2) on (20, 21)."""
    lp = np.log(np.array([[[0.6, 0.3], [0.7, 0.2]]])).astype(np.float32)
    ids = np.array([[[10, 11], [20, 21]]], np.int64)
    return lp, ids


def test_expected_acceptance_of_a_hand_computed_tree():
    lp, ids = tiny_inputs()
    trees = reference_trees(lp, ids, 3)
    # best-first: 10 (0.6), then 10->20 (0.42), then 11 (0.3); 10->21 (0.12) and 11->20 (0.21) are left out
    assert trees.node_token_ids.tolist() == [[10, 20, 11]]
    assert trees.parents.tolist() == [[-1, 0, 1, 0]]
    assert expected_accepted_tokens(lp, ids, trees) == pytest.approx([0.6 + 0.42 + 0.3], abs=1e-6)
    # every path of the tiny tree (budget 6 keeps all of them): 0.6 + 0.3 + 0.6 * 0.9 + 0.3 * 0.9
    full = reference_trees(lp, ids, 6)
    assert int(full.node_count[0]) == 6
    assert expected_accepted_tokens(lp, ids, full) == pytest.approx([0.9 + 0.9 * 0.9], abs=1e-6)
    # exactly sum(exp(score)), per request, float64
    lp2, ids2 = np.concatenate([lp, lp[:, ::-1]]), np.concatenate([ids, ids])
    trees2 = reference_trees(lp2, ids2, 4)
    got = expected_accepted_tokens(lp2, ids2, trees2)
    assert got.dtype == np.float64 and got.shape == (2,)
    assert got == pytest.approx(np.exp(node_log_probs(lp2, ids2, trees2)).sum(1), rel=1e-15)


def test_expected_acceptance_grows_with_the_budget(topk_inputs):
    lp, ids = topk_inputs("peaked", 3, 8, 64, seed=3)
    values = [expected_accepted_tokens(lp, ids, reference_trees(lp, ids, n)) for n in (1, 4, 16, 64, 256)]
    for smaller, larger in zip(values, values[1:], strict=False):
        assert (larger >= smaller).all()
    assert values[0] == pytest.approx(np.exp(lp[:, 0, 0].astype(np.float64)))


def test_node_columns_find_each_token_in_its_row(topk_inputs):
    lp, ids = topk_inputs("uniform", 2, 4, 8, seed=9)
    trees = reference_trees(lp, ids, 12)
    columns = node_columns(lp, ids, trees)
    for b in range(2):
        n = int(trees.node_count[b])
        depth = trees.node_depths[b, :n]
        assert (ids[b, depth - 1, columns[b, :n]] == trees.node_token_ids[b, :n]).all()
        assert (columns[b, n:] == -1).all()


def test_trees_not_from_these_inputs_are_refused(topk_inputs):
    lp, ids = topk_inputs("uniform", 2, 4, 8, seed=1)
    trees = reference_trees(lp, ids, 6)
    trees.node_token_ids[1, 2] = int(ids.max()) + 5
    with pytest.raises(ValueError, match="request 1 node 3 carries token") as info:
        node_log_probs(lp, ids, trees)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="shape"):
        node_log_probs(lp[:1], ids[:1], reference_trees(lp, ids, 6))
    with pytest.raises(ValueError, match="seed"):
        sample_target_tokens(lp, ids, reference_trees(lp, ids, 6), seed=-1)


# ---------------------------------------------------------------------------------------------------------
# target tokens


def test_target_tokens_shape_determinism_padding_and_absent_token(topk_inputs):
    lp, ids = topk_inputs("peaked", 4, 3, 4, seed=4)  # drained heaps: few paths, padding present
    trees = reference_trees(lp, ids, 100)
    assert (trees.node_count < 100).all()
    first = sample_target_tokens(lp, ids, trees, seed=7)
    assert first.dtype == np.int64 and first.shape == (4, 101)
    assert np.array_equal(first, sample_target_tokens(lp, ids, trees, seed=7))
    assert not np.array_equal(first, sample_target_tokens(lp, ids, trees, seed=8))
    absent = absent_token(ids)
    assert absent == int(ids.max()) + 1 and not (ids == absent).any()
    for b in range(4):
        n = int(trees.node_count[b])
        assert (first[b, n + 1 :] == 0).all()
        for node in range(n + 1):
            depth = 0 if node == 0 else int(trees.node_depths[b, node - 1])
            token = int(first[b, node])
            if depth == lp.shape[1]:
                assert token == absent
            else:
                assert token == absent or token in ids[b, depth].tolist()


def test_target_tokens_follow_the_drafters_distribution(topk_inputs):
    """Root tokens of many identical requests: frequencies of the top-K tokens and of the absent token
    match ``exp(lp[0])`` and the rest's mass (row 0 of a top-4 of 40 tokens leaves some mass out)."""
    lp, ids = topk_inputs("uniform", 1, 2, 4, vocab=40, seed=6)
    copies = 20000
    lp_many, ids_many = np.repeat(lp, copies, 0), np.repeat(ids, copies, 0)
    trees = reference_trees(lp_many, ids_many, 2)
    roots = sample_target_tokens(lp_many, ids_many, trees, seed=3)[:, 0]
    probs = np.exp(lp[0, 0].astype(np.float64))
    want = np.append(probs, 1.0 - probs.sum())
    assert want[-1] > 0.1
    got = np.array([(roots == t).mean() for t in ids[0, 0]] + [(roots == absent_token(ids)).mean()])
    assert got.sum() == pytest.approx(1.0)
    sigma = np.sqrt(want * (1 - want) / copies)
    assert (np.abs(got - want) < 5 * sigma).all(), (got, want)


@pytest.mark.parametrize(("kind", "depth", "k", "budget"), [("peaked", 3, 3, 8), ("uniform", 4, 4, 12)])
def test_mean_accept_length_is_one_plus_expected_acceptance(topk_inputs, kind, depth, k, budget):
    """Each request replicated; over many seeds and copies the walk's mean accept length (root included)
    approaches ``1 + expected_accepted_tokens`` within five standard errors."""
    lp, ids = topk_inputs(kind, 2, depth, k, vocab=3 * k, seed=2)
    copies, seeds = 500, 8
    lp_many, ids_many = np.repeat(lp, copies, 0), np.repeat(ids, copies, 0)
    trees = reference_trees(lp_many, ids_many, budget)
    expected = expected_accepted_tokens(lp, ids, reference_trees(lp, ids, budget))
    lengths = np.stack(
        [accept_cpu(trees, sample_target_tokens(lp_many, ids_many, trees, seed=s))[1] for s in range(seeds)]
    ).reshape(seeds, 2, copies)
    for b in range(2):
        sample = lengths[:, b, :].ravel().astype(np.float64)
        standard_error = sample.std(ddof=1) / math.sqrt(sample.size)
        assert 0.5 < expected[b] < depth  # a case where acceptance is neither trivial nor certain
        assert abs(sample.mean() - (1 + expected[b])) < 5 * standard_error + 1e-9, (
            sample.mean(),
            expected[b],
        )
