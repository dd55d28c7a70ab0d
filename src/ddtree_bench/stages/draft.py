"""The drafter's share of a round, measured: a ``Job`` and ``run(job)`` time ``k26.draft.DraftShard.run`` (the
DFlash drafter's forward over the block, the LM-head shard over the block's drafted positions, the
log-softmax normaliser and ``torch.topk``) at one (batch, prefix length) for every budget, as one CUDA graph
replay timed by CUDA events behind the spin kernel.

The block: ``block_size`` tokens (the bonus token and mask tokens) and a top-K of ``K = min(N, topk)`` per
drafted position; with ``follow_budget`` the block is coupled to the budget as SGLang's DDTree worker does
(block N + 1, top-K over its N drafted positions with K = N). Rows say which (``depth``: the drafted
positions a request; ``note``). Where the drafter does not fit or cannot run, rows say why.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddtree_bench.environment import ENVIRONMENT_COLUMNS, collect_environment
from ddtree_bench.k26.draft import DraftShard, draft_block, draft_bytes
from ddtree_bench.k26.shapes import DrafterShape
from ddtree_bench.paths import layout
from ddtree_bench.stages import points
from ddtree_bench.stages.gpu_runner import HEADROOM, GraphRunner, describe_error, gpu_reason, ok_rows
from ddtree_bench.timing.gpu import EVENT_CLOCK
from ddtree_bench.timing.policy import TimingPolicy
from ddtree_bench.timing.records import stage_frame, unavailable_row


@dataclass(frozen=True)
class Job:
    """One draft job: ``batch`` requests with ``prefix`` cached draft positions each, every budget of
    ``budgets``, a drafter of ``shape`` over the target's vocab shard of ``vocab_shard`` rows; the block
    (``block_size``, ``follow_budget``) and its top-``topk`` as ``k26.draft.draft_block``. ``timing``:
    ``TimingPolicy``'s keyword arguments; ``util_fatbin``: a prebuilt ``bench_util.cu`` (None: the cached
    build)."""

    batch: int
    prefix: int
    budgets: tuple[int, ...]
    shape: DrafterShape
    vocab_shard: int
    block_size: int
    follow_budget: bool
    topk: int
    timing: dict
    machine: str | None = None
    util_fatbin: str | None = None
    seed: int = 0

    @classmethod
    def grid(cls, settings) -> list[dict]:
        step = settings.step_options()
        return points(batch=step["batch_sizes"], prefix=step["prefix_lengths"])

    @classmethod
    def from_settings(cls, settings, *, batch, prefix, results=None):
        step = settings.step_options()
        draft = step["draft"]
        return cls(
            batch=int(batch),
            prefix=int(prefix),
            budgets=tuple(int(b) for b in step["budgets"]),
            shape=draft["shape"],
            vocab_shard=int(step["model"]["shape"].vocab_shard),
            block_size=draft["block_size"],
            follow_budget=draft["follow_budget"],
            topk=int(settings.trace_columns),
            timing=step["attention_timing"],
            machine=settings.machine,
            util_fatbin=layout(settings, results).artefact("bench_util"),
        )

    @property
    def inputs(self) -> dict[str, str]:
        return {"util": self.util_fatbin}

    @property
    def regime(self) -> str:
        """The block's regime, as the rows' notes say it."""
        if self.follow_budget:
            return "block follows the budget (N + 1, K = N)"
        return f"block {self.block_size}"

    def base(self, env: dict, budget: int) -> dict:
        """The fields every row at ``budget`` carries (``env``: the machine's)."""
        block, _ = draft_block(budget, self.block_size, self.topk, self.follow_budget)
        return {
            **{key: env.get(key) for key in ENVIRONMENT_COLUMNS},
            "stage": "draft",
            "impl": "torch",
            "batch": self.batch,
            "budget": budget,
            "prefix": self.prefix,
            "depth": block - 1,
            "tokens": self.batch * block,
            "timing": "cuda-events",
            "cache": "warm",
            "clock": EVENT_CLOCK,
        }


def run(job: Job) -> dict[int, pd.DataFrame]:
    """One frame of rows per budget (module docstring), as ``timing.records.stage_frame``. Bad arguments are
    a one-line ValueError before anything runs."""
    budgets = [int(b) for b in job.budgets]
    if job.block_size < 2:
        raise ValueError(f"draft: block_size must be >= 2, got {job.block_size}")
    policy = TimingPolicy(**job.timing)
    env = collect_environment(job.machine)

    def unavailable(budget, reason, status="unavailable"):
        return stage_frame([unavailable_row({**job.base(env, budget), "note": job.regime}, reason, status)])

    reason = gpu_reason()
    if reason is not None:
        return {budget: unavailable(budget, reason) for budget in budgets}
    runner = GraphRunner(policy, job.util_fatbin)
    out = {}
    for budget in budgets:
        block, k = draft_block(budget, job.block_size, job.topk, job.follow_budget)
        k = min(k, job.vocab_shard)
        free = runner.free()
        needed = draft_bytes(job.shape, job.batch, block, job.prefix, job.vocab_shard)
        if needed > free * (1 - HEADROOM):
            out[budget] = unavailable(
                budget, f"does not fit: needs about {needed / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
            )
            continue
        try:
            with runner.torch.cuda.stream(runner.torch_stream):
                drafter = DraftShard(
                    job.shape,
                    batch=job.batch,
                    block=block,
                    context=job.prefix,
                    k=k,
                    vocab_shard=job.vocab_shard,
                    seed=job.seed,
                )
            samples, note = runner.measure(drafter.run)
        except Exception as exc:  # noqa: BLE001 (recorded; the other budgets still run)
            out[budget] = unavailable(budget, describe_error(exc), status="failed")
            continue
        out[budget] = stage_frame(
            ok_rows(
                job.base(env, budget),
                samples,
                flops=job.shape.flops(job.batch, block, job.prefix, job.vocab_shard),
                nbytes=job.shape.bytes(job.vocab_shard),
                experts_touched=None,
                note=f"{note}; {job.regime}, K = {k}",
            )
        )
        del drafter
    return out
