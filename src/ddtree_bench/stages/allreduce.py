"""Tensor-parallel communication of a round, measured: a ``Job`` and ``run(job)`` run one round's collectives
(``k26.allreduce.collective_plan``: ``2 x layers`` all-reduces of ``T x hidden`` bf16 and the drafter's
top-K all-gathers) with NCCL, one process per GPU of this host, for every budget of one batch size.

The rows record ``world_size``. The deployment is 8 GPUs; a host with fewer measures as many as it has (at
least 2) and says so. With fewer than 2 GPUs (or no PyTorch) every row is unavailable with the reason, and
the round uses the estimate (``docs/throughput.md``), labelled as such wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddtree_bench.environment import ENVIRONMENT_COLUMNS, collect_environment
from ddtree_bench.k26.allreduce import collective_plan, measure_collectives, plan_bytes
from ddtree_bench.k26.draft import draft_block
from ddtree_bench.k26.shapes import ModelShape
from ddtree_bench.stages import points
from ddtree_bench.timing.records import stage_frame, unavailable_row


@dataclass(frozen=True)
class Job:
    """One allreduce job: the collectives of a round of ``batch`` requests at every budget of ``budgets``
    for a target of ``shape`` under TP ``world_size`` (the drafter's block: ``block_size``,
    ``follow_budget``, ``topk``, as ``k26.draft.draft_block``). ``timing``: its ``warmup`` and ``repeats``;
    ``backend``: nccl (one GPU a rank) or gloo (CPUs: the tests)."""

    batch: int
    budgets: tuple[int, ...]
    shape: ModelShape
    world_size: int
    block_size: int
    follow_budget: bool
    topk: int
    timing: dict
    machine: str | None = None
    backend: str = "nccl"

    @classmethod
    def grid(cls, settings) -> list[dict]:
        return points(batch=settings.step_options()["batch_sizes"])

    @classmethod
    def from_settings(cls, settings, *, batch, results=None):
        step = settings.step_options()
        shape, draft = step["model"]["shape"], step["draft"]
        return cls(
            batch=int(batch),
            budgets=tuple(int(b) for b in step["budgets"]),
            shape=shape,
            world_size=shape.tp,
            block_size=draft["block_size"],
            follow_budget=draft["follow_budget"],
            topk=int(settings.trace_columns),
            timing=step["attention_timing"],
            machine=settings.machine,
        )

    @property
    def inputs(self) -> dict[str, str]:
        return {}


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


def run(job: Job) -> dict[int, pd.DataFrame]:
    """One frame of rows per budget (module docstring), as ``timing.records.stage_frame``."""
    budgets = [int(b) for b in job.budgets]
    env = collect_environment(job.machine)
    backend = job.backend
    if backend == "nccl":
        world, reason = devices_reason(job.world_size)
    else:  # gloo on CPUs (tests): as many processes as asked
        world, reason = job.world_size, None

    def base(budget):
        return {
            **{key: env.get(key) for key in ENVIRONMENT_COLUMNS},
            "stage": "allreduce",
            "impl": backend,
            "batch": job.batch,
            "budget": budget,
            "tokens": job.batch * (budget + 1),
            "world_size": world,
            "timing": "cuda-events" if backend == "nccl" else "wall",
            "cache": "n/a",
        }

    def unavailable(budget, why, status="unavailable"):
        return stage_frame([unavailable_row(base(budget), why, status)])

    if reason is not None:
        return {budget: unavailable(budget, reason) for budget in budgets}
    out = {}
    for budget in budgets:
        block, k = draft_block(budget, job.block_size, job.topk, job.follow_budget)
        plan = collective_plan(
            job.batch * (budget + 1), job.shape.hidden, job.shape.layers, job.batch * (block - 1), k
        )
        status, result = measure_collectives(
            plan,
            world=world,
            backend=backend,
            warmup=int(job.timing["warmup"]),
            repeats=int(job.timing["repeats"]),
        )
        if status != "ok":
            out[budget] = unavailable(budget, result, status="failed")
            continue
        note = (
            f"{len(plan)} collectives{' as one CUDA graph' if backend == 'nccl' else ''}; "
            f"{world} of the deployment's {job.world_size} GPUs"
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
