"""``reference``: our own pure-Python implementation of SGLang's DDTree tree build.

Same algorithm, same language and the same per-request structure as SGLang's
``build_ddtree_tree_from_topk`` (a ``heapq`` best-first search whose entries are
``(-logw, ranks, parent, depth, rank, logw)``), so its per-tree cost stays comparable; its output is
identical element for element, ties included. It is labelled as ours in every report, never as SGLang.
"""

from __future__ import annotations

import heapq

import numpy as np

from ddtree_bench import catalog
from ddtree_bench.builders.base import Builder
from ddtree_bench.tree import TreeBatch


def build_one(top_log_probs: np.ndarray, top_token_ids: np.ndarray, budget: int, out: TreeBatch, b: int):
    """Build request ``b``'s tree from its ``[L, K]`` rows into the padded batch ``out`` (in place)."""
    topk = min(int(budget), int(top_log_probs.shape[-1]))
    depth_limit = int(top_log_probs.shape[0])
    lp = top_log_probs[:, :topk].tolist()  # Python floats (float64) of float32 values, as SGLang's float()
    ids = top_token_ids[:, :topk]

    first_logw = lp[0][0]
    heap = [(-first_logw, (0,), 0, 1, 0, first_logw)]
    node_token_ids = out.node_token_ids[b]
    node_depths = out.node_depths[b]
    parents = out.parents[b]
    parents[0] = -1
    node_count = 0
    while heap and node_count < budget:
        _, ranks, parent_index, depth, rank, logw = heapq.heappop(heap)
        current_index = node_count + 1
        node_token_ids[node_count] = ids[depth - 1, rank]
        node_depths[node_count] = depth
        parents[current_index] = parent_index
        node_count += 1
        if rank + 1 < topk:
            row = lp[depth - 1]
            sibling_logw = logw - row[rank] + row[rank + 1]
            heapq.heappush(
                heap, (-sibling_logw, ranks[:-1] + (rank + 1,), parent_index, depth, rank + 1, sibling_logw)
            )
        if depth < depth_limit:
            child_logw = logw + lp[depth][0]
            heapq.heappush(heap, (-child_logw, ranks + (0,), current_index, depth + 1, 0, child_logw))

    out.node_count[b] = node_count
    length = node_count + 1
    visibility = out.visibility[b]
    visibility[0, 0] = True
    for index in range(1, length):
        parent_index = int(parents[index])
        visibility[index, :index] = visibility[parent_index, :index]
        visibility[index, index] = True

    next_token = out.retrieve_next_token[b]
    next_sibling = out.retrieve_next_sibling[b]
    last_child = [-1] * length
    for child in range(1, length):
        parent = int(parents[child])
        if next_token[parent] == -1:
            next_token[parent] = child
        else:
            next_sibling[last_child[parent]] = child
        last_child[parent] = child


class ReferenceBuilder(Builder):
    name = catalog.REFERENCE
    label = "reference (ours, pure Python heapq)"
    device = "cpu"

    def build(self, top_log_probs, top_token_ids, budget) -> TreeBatch:
        budget = self.check(top_log_probs, top_token_ids, budget)
        out = TreeBatch.empty(top_log_probs.shape[0], budget)
        for b in range(top_log_probs.shape[0]):  # the per-request loop SGLang's worker runs
            build_one(top_log_probs[b], top_token_ids[b], budget, out, b)
        return out
