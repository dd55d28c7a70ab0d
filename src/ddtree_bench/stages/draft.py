"""The drafter's share of a round, measured: ``run_draft_stage`` times ``model.draft.DraftShard.run`` (the
DFlash drafter's forward over the block, the LM-head shard over the block's drafted positions, the
log-softmax normaliser and ``torch.topk``) at one (batch, prefix length) for every budget, as one CUDA graph
replay timed by CUDA events behind the spin kernel.

The block: ``block_size`` tokens (the bonus token and mask tokens) and a top-K of ``K = min(N, topk)`` per
drafted position; with ``follow_budget`` the block is coupled to the budget as SGLang's DDTree worker does
(block N + 1, top-K over its N drafted positions with K = N). Rows say which (``depth``: the drafted
positions a request; ``note``). Where the drafter does not fit or cannot run, rows say why.
"""

from __future__ import annotations

import pandas as pd

from ddtree_bench.environment import ENVIRONMENT_COLUMNS, collect_environment
from ddtree_bench.k26.draft import DraftShard, draft_bytes
from ddtree_bench.k26.shapes import DrafterShape
from ddtree_bench.stages.model import HEADROOM, _describe, _ok_rows, _Runner, gpu_reason
from ddtree_bench.timing.gpu import EVENT_CLOCK
from ddtree_bench.timing.policy import TimingPolicy
from ddtree_bench.timing.records import stage_frame, unavailable_row


def draft_block(budget: int, block_size: int, topk: int, follow_budget: bool) -> tuple[int, int]:
    """``(block, K)`` of a round at budget ``budget``: the configured block and ``min(budget, topk)``, or
    (``follow_budget``) SGLang's worker's coupling, a block of ``budget + 1`` and ``K = budget``."""
    if follow_budget:
        return budget + 1, budget
    return block_size, min(budget, topk)


def run_draft_stage(
    *,
    batch: int,
    prefix: int,
    budgets,
    shape: DrafterShape,
    vocab_shard: int,
    block_size: int,
    follow_budget: bool,
    topk: int,
    timing: dict,
    machine: str | None,
    util_fatbin=None,
    seed: int = 0,
) -> dict[int, pd.DataFrame]:
    budgets = [int(b) for b in budgets]
    if block_size < 2:
        raise ValueError(f"draft: block_size must be >= 2, got {block_size}")
    policy = TimingPolicy(**timing)
    env = collect_environment(machine)
    regime = "block follows the budget (N + 1, K = N)" if follow_budget else f"block {block_size}"

    def base(budget):
        block, k = draft_block(budget, block_size, topk, follow_budget)
        return {
            **{key: env.get(key) for key in ENVIRONMENT_COLUMNS},
            "stage": "draft",
            "impl": "torch",
            "batch": batch,
            "budget": budget,
            "prefix": prefix,
            "depth": block - 1,
            "tokens": batch * block,
            "timing": "cuda-events",
            "cache": "warm",
            "clock": EVENT_CLOCK,
        }

    def unavailable(budget, reason, status="unavailable"):
        return unavailable_row({**base(budget), "note": regime}, reason, status)

    reason = gpu_reason()
    if reason is not None:
        return {budget: stage_frame([unavailable(budget, reason)]) for budget in budgets}
    runner = _Runner(policy, util_fatbin)
    out = {}
    for budget in budgets:
        block, k = draft_block(budget, block_size, topk, follow_budget)
        k = min(k, vocab_shard)
        free = runner.free()
        needed = draft_bytes(shape, batch, block, prefix, vocab_shard)
        if needed > free * (1 - HEADROOM):
            out[budget] = stage_frame(
                [
                    unavailable(
                        budget, f"does not fit: needs about {needed / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
                    )
                ]
            )
            continue
        try:
            with runner.torch.cuda.stream(runner.torch_stream):
                drafter = DraftShard(
                    shape, batch=batch, block=block, context=prefix, k=k, vocab_shard=vocab_shard, seed=seed
                )
            samples, note = runner.measure(drafter.run)
        except Exception as exc:  # noqa: BLE001 (recorded; the other budgets still run)
            out[budget] = stage_frame([unavailable(budget, _describe(exc), status="failed")])
            continue
        flops = shape.flops(batch, block, prefix, vocab_shard)
        nbytes = shape.bytes(vocab_shard)
        out[budget] = stage_frame(
            _ok_rows(
                base(budget),
                samples,
                flops=flops,
                nbytes=nbytes,
                experts_touched=None,
                note=f"{note}; {regime}, K = {k}",
            )
        )
        del drafter
    return out
