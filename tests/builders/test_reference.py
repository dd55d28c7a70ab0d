"""The ``reference`` builder against an independent brute-force derivation of the same trees.

The brute force shares no code or mechanism with the reference: it enumerates every path (ranks tuple) of
length 1..L with ranks < topk, gives each the score the heap's generator chain produces (the first child
of a node is ``parent + lp[d-1][0]``, each next sibling ``left - lp[d-1][r-1] + lp[d-1][r]``, in Python
floats, in that order), and then selects nodes one at a time by scanning every path whose generator (left
sibling, or parent for rank 0) is already selected for the smallest ``(-score, ranks)``: an O(n^2) loop over
explicit sets, no heap. The tree arrays are then derived from their definitions (prefix relation, smallest
child index, next larger sibling index), not by the reference's streaming loops.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree_bench.builders import get_builder
from ddtree_bench.tree import TreeBatch, first_difference


def brute_force_order(lp: np.ndarray, budget: int) -> tuple[list[tuple[int, ...]], dict]:
    """Selected paths in pop order, and every path's score. ``lp``: one request's [L, K] float32."""
    depth_limit, k = lp.shape
    topk = min(budget, k)
    rows = [[float(x) for x in lp[d, :topk]] for d in range(depth_limit)]
    paths = [p for d in range(1, depth_limit + 1) for p in itertools.product(range(topk), repeat=d)]
    score: dict[tuple[int, ...], float] = {}
    for path in paths:  # product order: a path's generator always comes earlier
        d, r = len(path), path[-1]
        if r == 0:
            score[path] = rows[0][0] if d == 1 else score[path[:-1]] + rows[d - 1][0]
        else:
            left = path[:-1] + (r - 1,)
            score[path] = score[left] - rows[d - 1][r - 1] + rows[d - 1][r]

    def generator(path):
        return path[:-1] + (path[-1] - 1,) if path[-1] > 0 else path[:-1]

    selected: list[tuple[int, ...]] = []
    chosen = {()}
    while len(selected) < budget:
        available = [p for p in paths if p not in chosen and generator(p) in chosen]
        if not available:
            break
        best = min(available, key=lambda p: (-score[p], p))
        selected.append(best)
        chosen.add(best)
    return selected, score


def brute_force_tree(lp: np.ndarray, ids: np.ndarray, budget: int) -> dict[str, np.ndarray]:
    """One request's padded arrays, derived from the brute-force order by definition."""
    order, _ = brute_force_order(lp, budget)
    n = len(order)
    index = {(): 0, **{p: i + 1 for i, p in enumerate(order)}}
    paths = [(), *order]
    n1 = budget + 1
    tree = {
        "node_count": n,
        "node_token_ids": np.full(budget, -1, np.int64),
        "node_depths": np.zeros(budget, np.int64),
        "parents": np.full(n1, -1, np.int32),
        "visibility": np.zeros((n1, n1), np.bool_),
        "retrieve_next_token": np.full(n1, -1, np.int64),
        "retrieve_next_sibling": np.full(n1, -1, np.int64),
    }
    for i, path in enumerate(order, start=1):
        tree["node_token_ids"][i - 1] = ids[len(path) - 1, path[-1]]
        tree["node_depths"][i - 1] = len(path)
        tree["parents"][i] = index[path[:-1]]
    for i, path in enumerate(paths):
        for j, other in enumerate(paths):
            tree["visibility"][i, j] = path[: len(other)] == other  # other is a prefix of path (or path)
    parent_of = {i: index[paths[i][:-1]] for i in range(1, n + 1)}
    for i in range(n + 1):
        children = [j for j in range(1, n + 1) if parent_of[j] == i]
        if children:
            tree["retrieve_next_token"][i] = min(children)
        if i > 0:
            later = [j for j in range(i + 1, n + 1) if parent_of[j] == parent_of[i]]
            if later:
                tree["retrieve_next_sibling"][i] = min(later)
    return tree


def brute_force_batch(lp: np.ndarray, ids: np.ndarray, budget: int) -> TreeBatch:
    out = TreeBatch.empty(lp.shape[0], budget)
    for b in range(lp.shape[0]):
        for name, value in brute_force_tree(lp[b], ids[b], budget).items():
            getattr(out, name)[b] = value
    return out


def assert_reference_matches(lp, ids, budget) -> TreeBatch:
    got = get_builder("reference").build(lp, ids, budget)
    want = brute_force_batch(lp, ids, budget)
    diff = first_difference(want, got)
    assert diff is None, diff
    return got


def _sorted_rows(values) -> np.ndarray:
    return np.ascontiguousarray(-np.sort(-np.asarray(values, np.float32), axis=-1))


# -- fixed cases ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["uniform", "peaked", "bf16", "equal", "tied"])
@pytest.mark.parametrize("depth,k,budget", [(3, 3, 7), (4, 3, 20), (2, 4, 30), (3, 2, 9), (4, 4, 40)])
def test_reference_equals_brute_force(topk_inputs, kind, depth, k, budget):
    lp, ids = topk_inputs(kind, 3, depth, k, seed=depth * 100 + k * 10 + budget)
    assert_reference_matches(lp, ids, budget)


def test_budget_one_is_the_top_token_of_position_one(topk_inputs):
    lp, ids = topk_inputs("uniform", 4, 3, 5, seed=1)
    trees = assert_reference_matches(lp, ids, 1)
    assert trees.node_count.tolist() == [1] * 4
    assert trees.node_token_ids[:, 0].tolist() == ids[:, 0, 0].tolist()
    assert trees.parents.tolist() == [[-1, 0]] * 4
    assert trees.visibility.tolist() == [[[True, False], [True, True]]] * 4
    assert trees.retrieve_next_token.tolist() == [[1, -1]] * 4
    assert trees.retrieve_next_sibling.tolist() == [[-1, -1]] * 4


def test_depth_one_is_a_star_of_the_top_tokens(topk_inputs):
    lp, ids = topk_inputs("uniform", 2, 1, 6, seed=2)
    trees = assert_reference_matches(lp, ids, 4)
    assert trees.node_token_ids.tolist() == ids[:, 0, :4].tolist()
    assert (trees.node_depths == 1).all() and (trees.parents[:, 1:] == 0).all()
    assert trees.retrieve_next_sibling[0].tolist() == [-1, 2, 3, 4, -1]


def test_k_one_is_a_chain(topk_inputs):
    lp, ids = topk_inputs("peaked", 2, 5, 1, seed=3)
    trees = assert_reference_matches(lp, ids, 8)
    assert trees.node_count.tolist() == [5, 5]  # the heap drains: one path per depth
    assert trees.parents[0].tolist() == [-1, 0, 1, 2, 3, 4, -1, -1, -1]
    assert trees.node_depths[0].tolist() == [1, 2, 3, 4, 5, 0, 0, 0]


def test_heap_drain_pads_every_field(topk_inputs):
    lp, ids = topk_inputs("tied", 2, 2, 2, seed=4)
    budget = 10
    trees = assert_reference_matches(lp, ids, budget)
    n = 2 + 4  # every path of length <= 2 over 2 ranks
    assert trees.node_count.tolist() == [n, n]
    assert (trees.node_token_ids[:, n:] == -1).all()
    assert (trees.node_depths[:, n:] == 0).all()
    assert (trees.parents[:, n + 1 :] == -1).all() and (trees.parents[:, 0] == -1).all()
    assert not trees.visibility[:, n + 1 :, :].any() and not trees.visibility[:, :, n + 1 :].any()
    assert (trees.retrieve_next_token[:, n + 1 :] == -1).all()
    assert (trees.retrieve_next_sibling[:, n + 1 :] == -1).all()


def test_equal_scores_pop_in_ranks_tuple_order():
    # every log-prob equal to 0: all paths score exactly 0.0, so the order is the ranks tuples' order:
    # (0,), (0, 0), (0, 0, 0), (0, 0, 1), (0, 1), ... but only among the paths whose generator is selected.
    lp = np.zeros((1, 3, 2), np.float32)
    ids = np.arange(6, dtype=np.int64).reshape(1, 3, 2)
    order, _ = brute_force_order(lp[0], 14)
    assert order == sorted(order)  # here every path becomes available before it is the smallest
    assert order[:5] == [(0,), (0, 0), (0, 0, 0), (0, 0, 1), (0, 1)]
    assert_reference_matches(lp, ids, 14)


# -- incremental scores, not path sums ------------------------------------------------------------------


def pathsum_order(lp: np.ndarray, budget: int) -> list[tuple[int, ...]]:
    """The order a builder would give that scored each path by its left-to-right sum of log-probs (what the
    heap's incremental sibling formula approximates): the same selection loop, other scores."""
    order, incremental = brute_force_order(lp, budget)
    rows = lp.astype(np.float64)
    score = {}
    for path in incremental:
        total = float(rows[0, path[0]])
        for d, r in enumerate(path[1:], start=1):
            total = total + float(rows[d, r])
        score[path] = total
    selected, chosen = [], {()}
    while len(selected) < budget:
        available = [
            p for p in score if p not in chosen and (p[:-1] + (p[-1] - 1,) if p[-1] else p[:-1]) in chosen
        ]
        if not available:
            break
        best = min(available, key=lambda p: (-score[p], p))
        selected.append(best)
        chosen.add(best)
    return selected


# Depth 1 almost certain (x), depths 2 and 3 the same row [p, q]. P = (0, 0, 1) and R = (0, 1, 0) have the
# same path sum, but P's incremental score ((((x + p) + p) - p) + q) rounds one ulp below it: the heap pops
# R first, a path-sum builder would tie them and pop P (the smaller tuple) first.
ROUNDING_CASE = (np.float32(-1.2848934e-09), np.float32(-2.6211164), np.float32(-28.526234))


def test_incremental_sibling_scores_are_followed():
    x, p, q = (float(v) for v in ROUNDING_CASE)
    y = x + p
    p_incremental = (y + p) - p + q
    p_sum, r_sum = y + q, (x + q) + p
    r_incremental = (y - p + q) + p
    assert p_sum == r_sum == r_incremental and p_incremental < p_sum  # the premise of the case

    lp = np.array([[[x, -60.0], [p, q], [p, q]]], np.float32)
    ids = np.arange(6, dtype=np.int64).reshape(1, 3, 2) + 10
    order, _ = brute_force_order(lp[0], 14)
    assert order.index((0, 1, 0)) < order.index((0, 0, 1))
    other = pathsum_order(lp[0], 14)
    assert other.index((0, 0, 1)) < other.index((0, 1, 0))

    trees = assert_reference_matches(lp, ids, 14)
    r_index, p_index = order.index((0, 1, 0)) + 1, order.index((0, 0, 1)) + 1
    assert trees.node_token_ids[0, r_index - 1] == 14 and trees.node_token_ids[0, p_index - 1] == 15
    assert trees.parents[0, r_index] == order.index((0, 1)) + 1
    assert trees.parents[0, p_index] == order.index((0, 0)) + 1


def test_equal_neighbours_never_score_above_their_elder():
    # Why no "younger sibling above its elder" case exists to test: with non-positive inputs, an entry's
    # score always ends in "+ lp[d-1][r]", and ((z + a) - a) + a == z + a in float64 for same-signed z, a.
    rng = np.random.default_rng(0)
    z = -np.exp(rng.uniform(np.log(1e-3), np.log(64), 1_000_000))
    z = (z.view(np.int64) ^ rng.integers(0, 2**20, z.size)).view(np.float64)  # random low bits
    a = (-np.exp(rng.uniform(np.log(1e-12), np.log(64), z.size))).astype(np.float32).astype(np.float64)
    s = z + a
    assert ((s - a) + a == s).all()


# -- properties -------------------------------------------------------------------------------------------

TIE_GRID = [0.0, -0.125, -0.25, -0.5, -1.0, -2.0, -3.0]
VALUES = {
    "ties": st.sampled_from(TIE_GRID),
    "uniform": st.floats(-8.0, 0.0, width=32, allow_subnormal=False),
    # magnitudes from 1e-10 to 30: sums in float64 round, so incremental scores differ from path sums
    "wide": st.builds(lambda e, m: -m * 2.0**e, st.integers(-34, 4), st.floats(1.0, 2.0, exclude_max=True)),
}


@st.composite
def small_inputs(draw):
    batch = draw(st.integers(1, 2))
    depth = draw(st.integers(1, 4))
    k = draw(st.integers(1, 4))
    budget = draw(st.integers(1, 45))
    n = batch * depth * k
    values = draw(st.lists(VALUES[draw(st.sampled_from(sorted(VALUES)))], min_size=n, max_size=n))
    lp = _sorted_rows(np.array(values, np.float32).reshape(batch, depth, k))
    ids = np.array(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)), np.int64)
    return lp, ids.reshape(batch, depth, k), budget


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_inputs())
def test_reference_equals_brute_force_property(case):
    lp, ids, budget = case
    assert_reference_matches(lp, ids, budget)
