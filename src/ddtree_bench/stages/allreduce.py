"""Tensor-parallel communication of a round, measured: ``run_allreduce_stage`` runs one round's collectives
(``model.allreduce.collective_plan``: ``2 x layers`` all-reduces of ``T x hidden`` bf16 and the drafter's
top-K all-gathers) with NCCL, one process per GPU of this host, for every budget of one batch size.

The rows record ``world_size``. The deployment is 8 GPUs; a host with fewer measures as many as it has (at
least 2) and says so. With fewer than 2 GPUs (or no PyTorch) every row is unavailable with the reason, and
the round uses the estimate (``docs/throughput.md``), labelled as such wherever it is shown.
"""

from __future__ import annotations

import pandas as pd

from ddtree_bench.environment import ENVIRONMENT_COLUMNS, collect_environment
from ddtree_bench.k26.allreduce import collective_plan, measure_collectives, plan_bytes
from ddtree_bench.k26.shapes import ModelShape
from ddtree_bench.stages.draft import draft_block
from ddtree_bench.timing.records import stage_frame, unavailable_row


def devices_reason(world_size: int) -> tuple[int, str | None]:
    """``(world, reason)``: the GPUs this host lends the stage (at most ``world_size``), or why none."""
    try:
        import torch  # noqa: PLC0415
    except ImportError as exc:
        return 0, f"PyTorch is not installed: {exc}"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        return count, (
            f"needs >= 2 GPUs of one host (NCCL); this machine has {count}: the round uses the estimate"
        )
    return min(count, world_size), None


def run_allreduce_stage(
    *,
    batch: int,
    budgets,
    shape: ModelShape,
    world_size: int,
    block_size: int,
    follow_budget: bool,
    topk: int,
    timing: dict,
    machine: str | None,
    backend: str = "nccl",
) -> dict[int, pd.DataFrame]:
    budgets = [int(b) for b in budgets]
    env = collect_environment(machine)
    if backend == "nccl":
        world, reason = devices_reason(world_size)
    else:  # gloo on CPUs (tests): as many processes as asked
        world, reason = world_size, None

    def base(budget):
        return {
            **{key: env.get(key) for key in ENVIRONMENT_COLUMNS},
            "stage": "allreduce",
            "impl": backend,
            "batch": batch,
            "budget": budget,
            "tokens": batch * (budget + 1),
            "world_size": world,
            "timing": "cuda-events" if backend == "nccl" else "wall",
            "cache": "n/a",
        }

    def unavailable(budget, why, status="unavailable"):
        return unavailable_row(base(budget), why, status)

    if reason is not None:
        return {budget: stage_frame([unavailable(budget, reason)]) for budget in budgets}
    out = {}
    for budget in budgets:
        block, k = draft_block(budget, block_size, topk, follow_budget)
        plan = collective_plan(batch * (budget + 1), shape.hidden, shape.layers, batch * (block - 1), k)
        status, result = measure_collectives(
            plan, world=world, backend=backend, warmup=int(timing["warmup"]), repeats=int(timing["repeats"])
        )
        if status != "ok":
            out[budget] = stage_frame([unavailable(budget, result, status="failed")])
            continue
        note = (
            f"{len(plan)} collectives{' as one CUDA graph' if backend == 'nccl' else ''}; "
            f"{world} of the deployment's {world_size} GPUs"
        )
        out[budget] = stage_frame(
            [
                {
                    **base(budget),
                    "phase": phase,
                    "repetition": rep,
                    "seconds": seconds,
                    "bytes": plan_bytes(plan),
                    "status": "ok",
                    "note": note,
                }
                for phase, rep, seconds in result
            ]
        )
    return out
