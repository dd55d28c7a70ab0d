"""What a draft tree buys: path scores, the expected acceptance, and target tokens drawn to match it.

Inputs are a request batch's drafter outputs, ``lp`` float32 ``[B, L, K]`` (top-K log-probs per block
position, rows sorted descending) and ``ids`` int64 ``[B, L, K]``, and the ``TreeBatch`` built from them at a
budget ``N``. A tree node at depth ``d`` (1..L) took its token from row ``d - 1`` of its request; the root
(index 0, depth 0) is not a drafted token.

- ``node_log_probs``: each real node's path score, the sum over the nodes of its root path of the
  log-prob of the node's token in the row of its depth (what the best-first heap ranks nodes by).
- ``expected_accepted_tokens``: the expected number of accepted draft tokens per request when the target's
  token at each tree position follows the drafter's own distribution of that position (restricted to its
  top-K: mass outside the top-K never matches): the sum of the tree's path probabilities.
- ``sample_target_tokens``: a target argmax token for every node, drawn independently per node from exactly
  that distribution, so that the greedy walk's mean accept length is ``1 + expected_accepted_tokens``.

The token of a node is looked up in its row by id. Rows of a real top-K hold distinct tokens; where a row
repeats a token, its first (most probable) column is the one used.
"""

from __future__ import annotations

import numbers

import numpy as np

from ddtree_bench.tree import TreeBatch

_CHUNK_ELEMENTS = 1 << 22  # rows x K gathered at once (bounds the temporary memory of the token lookup)


def _check_inputs(lp, ids, trees: TreeBatch) -> tuple[int, int, int, int]:
    """``(B, L, K, N)`` of consistent inputs; one-line ValueError otherwise."""
    if not isinstance(lp, np.ndarray) or not isinstance(ids, np.ndarray):
        raise ValueError("acceptance: lp and ids must be numpy arrays")
    if lp.ndim != 3:
        raise ValueError(f"acceptance: lp must be 3-D [B, L, K], got shape {lp.shape}")
    if ids.shape != lp.shape:
        raise ValueError(f"acceptance: ids shape {ids.shape} != lp shape {lp.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"acceptance: ids must hold integer token ids, got dtype {ids.dtype}")
    if not np.issubdtype(lp.dtype, np.floating):
        raise ValueError(f"acceptance: lp must hold floating log-probs, got dtype {lp.dtype}")
    batch, depth, k = (int(s) for s in lp.shape)
    for name in ("node_count", "node_token_ids", "node_depths", "parents"):
        if not hasattr(trees, name):
            raise ValueError(f"acceptance: the trees lack field {name}")
    counts = np.asarray(trees.node_count)
    tokens = np.asarray(trees.node_token_ids)
    if tokens.ndim != 2 or tokens.shape[0] != batch:
        raise ValueError(
            f"acceptance: trees have node_token_ids of shape {tokens.shape}, expected [{batch}, N]"
        )
    budget = int(tokens.shape[1])
    if counts.shape != (batch,):
        raise ValueError(f"acceptance: node_count has shape {counts.shape}, expected {(batch,)}")
    if np.asarray(trees.node_depths).shape != (batch, budget):
        raise ValueError(f"acceptance: node_depths must have shape {(batch, budget)}")
    if np.asarray(trees.parents).shape != (batch, budget + 1):
        raise ValueError(f"acceptance: parents must have shape {(batch, budget + 1)}")
    if batch and (counts.min() < 0 or counts.max() > budget):
        b = int(np.argmax((counts < 0) | (counts > budget)))
        raise ValueError(f"acceptance: request {b} has node_count {int(counts[b])} outside 0..{budget}")
    return batch, depth, k, budget


def _real_nodes(trees: TreeBatch, budget: int) -> np.ndarray:
    """``[B, N]`` bool: column ``j`` is node ``j + 1``, real when ``j < node_count``."""
    return np.arange(budget)[None, :] < np.asarray(trees.node_count)[:, None]


def _checked_depths(trees: TreeBatch, real: np.ndarray, depth: int) -> np.ndarray:
    depths = np.asarray(trees.node_depths)
    bad = real & ((depths < 1) | (depths > depth))
    if bad.any():
        b, j = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(
            f"acceptance: request {b} node {j + 1} has depth {int(depths[b, j])} outside 1..{depth}"
        )
    return depths


def node_columns(lp, ids, trees: TreeBatch) -> np.ndarray:
    """``int64 [B, N]``: for every real node, the column of its token in row ``depth - 1`` of its request
    (the first such column); -1 for padding. ValueError when a node's token is not in that row (the trees
    were not built from these inputs)."""
    batch, depth, k, budget = _check_inputs(lp, ids, trees)
    real = _real_nodes(trees, budget)
    depths = _checked_depths(trees, real, depth)
    columns = np.full((batch, budget), -1, np.int64)
    b_idx, j_idx = np.nonzero(real)
    rows = depths[b_idx, j_idx] - 1
    tokens = np.asarray(trees.node_token_ids)[b_idx, j_idx]
    step = max(1, _CHUNK_ELEMENTS // max(k, 1))
    found = np.empty(b_idx.size, np.int64)
    for start in range(0, b_idx.size, step):
        sl = slice(start, start + step)
        match = ids[b_idx[sl], rows[sl], :] == tokens[sl, None]  # [m, K]
        col = np.argmax(match, axis=1)
        missing = ~match[np.arange(col.size), col]
        if missing.any():
            i = int(np.argmax(missing)) + start
            raise ValueError(
                f"acceptance: request {int(b_idx[i])} node {int(j_idx[i]) + 1} carries token "
                f"{int(tokens[i])}, which row {int(rows[i])} of the inputs does not hold "
                "(trees not built from these inputs?)"
            )
        found[sl] = col
    columns[b_idx, j_idx] = found
    return columns


def node_log_probs(lp, ids, trees: TreeBatch) -> np.ndarray:
    """``float64 [B, N]``: the path score of every real node (column ``j`` is node ``j + 1``): the sum, over
    its root path, of ``lp[b, depth - 1, column of the node's token]``, added root-to-leaf in float64.
    Padding is ``-inf``. Equal (to rounding, ~1e-15 relative) to the ``logw`` the builder's heap popped the
    node with."""
    batch, depth, _, budget = _check_inputs(lp, ids, trees)
    columns = node_columns(lp, ids, trees)
    real = columns >= 0
    depths = np.asarray(trees.node_depths)
    own = np.full((batch, budget), -np.inf)
    b_idx, j_idx = np.nonzero(real)
    own[b_idx, j_idx] = lp[b_idx, depths[b_idx, j_idx] - 1, columns[b_idx, j_idx]].astype(np.float64)

    # scores indexed by node (root 0 ... N): a pass per depth, parents (one depth up) are final by then
    scores = np.full((batch, budget + 1), -np.inf)
    scores[:, 0] = 0.0
    parents = np.asarray(trees.parents).astype(np.int64)
    for d in range(1, depth + 1):
        b_d, j_d = np.nonzero(real & (depths == d))
        if b_d.size == 0:
            continue
        parent = parents[b_d, j_d + 1]
        bad = (parent < 0) | (parent > j_d)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(
                f"acceptance: request {int(b_d[i])} node {int(j_d[i]) + 1} has parent {int(parent[i])} "
                f"(must be in 0..{int(j_d[i])})"
            )
        parent_depth = np.where(parent > 0, depths[b_d, np.maximum(parent, 1) - 1], 0)
        if (parent_depth != d - 1).any():
            i = int(np.argmax(parent_depth != d - 1))
            raise ValueError(
                f"acceptance: request {int(b_d[i])} node {int(j_d[i]) + 1} at depth {d} has parent "
                f"{int(parent[i])} at depth {int(parent_depth[i])}, not {d - 1}"
            )
        scores[b_d, j_d + 1] = scores[b_d, parent] + own[b_d, j_d]
    return scores[:, 1:]


def expected_accepted_tokens(lp, ids, trees: TreeBatch) -> np.ndarray:
    """``float64 [B]``: the expected number of accepted draft tokens per request, when the target's token at
    each tree position is drawn from the drafter's own distribution of that position restricted to its
    top-K (probabilities ``exp(lp)``; the mass outside the top-K never matches a drafted token).

    A node is accepted when every edge of its root path matches, with probability ``exp(path score)``, so
    this is the sum of ``exp(node_log_probs)`` over the tree's nodes: exactly what the best-first heap
    maximises for a budget (it keeps the N most probable paths). The accept length of a verify step counts
    the root too, and one more token (the bonus, the target's own token where the walk stops) comes with
    every step: tokens per step = 1 + this value."""
    return np.exp(node_log_probs(lp, ids, trees)).sum(axis=1)


def absent_token(ids) -> int:
    """A token id no row of ``ids`` holds: ``max(ids) + 1``."""
    return int(np.max(ids)) + 1 if np.asarray(ids).size else 0


def sample_target_tokens(lp, ids, trees: TreeBatch, *, seed) -> np.ndarray:
    """``int64 [B, N+1]``: a target argmax token for every node index (root = 0), drawn independently per
    node from the drafter's distribution of the position after it.

    At a node of depth ``d < L``: row ``d``'s top-K categorical with probabilities ``exp(lp[b, d])`` and,
    with the remaining mass ``max(0, 1 - sum exp(lp[b, d]))``, ``absent_token(ids)`` (a token in no row).
    (Where rounding puts the row's sum above 1, the row is renormalised.) At depth ``L`` (no further row):
    the absent token. Padding entries (index > node_count) are 0. A function of the inputs and ``seed``
    (``numpy.random.default_rng(seed)``; one uniform per entry of ``[B, N+1]``, padding included).

    With these tokens the walk's accept length has expectation ``1 + expected_accepted_tokens`` exactly (every
    node's draw is independent, and a node is reached only through its root path)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"acceptance: seed must be an integer >= 0, got {seed!r}")
    batch, depth, k, budget = _check_inputs(lp, ids, trees)
    real = _real_nodes(trees, budget)
    depths = _checked_depths(trees, real, depth)
    absent = absent_token(ids)

    rng = np.random.default_rng(int(seed))
    uniform = rng.random((batch, budget + 1))

    # per row: the top-K probabilities then the rest's mass, as a cumulative distribution [B, L, K+1]
    probs = np.exp(lp.astype(np.float64))
    rest = np.clip(1.0 - probs.sum(axis=-1, keepdims=True), 0.0, None)
    cdf = np.cumsum(np.concatenate([probs, rest], axis=-1), axis=-1)
    cdf /= cdf[..., -1:]

    node_depth = np.zeros((batch, budget + 1), np.int64)  # root: depth 0
    node_depth[:, 1:] = np.where(real, depths, 0)
    present = np.concatenate([np.ones((batch, 1), bool), real], axis=1)
    target = np.zeros((batch, budget + 1), np.int64)
    target[present & (node_depth >= depth)] = absent

    b_idx, i_idx = np.nonzero(present & (node_depth < depth))
    rows = node_depth[b_idx, i_idx]
    step = max(1, _CHUNK_ELEMENTS // (k + 1))
    for start in range(0, b_idx.size, step):
        sl = slice(start, start + step)
        b, r = b_idx[sl], rows[sl]
        column = (uniform[b, i_idx[sl], None] >= cdf[b, r, :]).sum(axis=1)  # first cdf entry > u
        column = np.minimum(column, k)  # u < 1 = cdf[-1] always; guard rounding anyway
        drawn = np.full(column.size, absent, np.int64)
        hit = column < k
        drawn[hit] = ids[b[hit], r[hit], column[hit]]
        target[b, i_idx[sl]] = drawn
    return target
