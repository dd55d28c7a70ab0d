"""The round, run: a ``Job`` and ``run(job)`` time whole DDTree rounds (``k26.round.RoundRunner``) per
builder on one GPU's share of Kimi K2.6, at one (batch, prefix length), for every budget.

Every builder gets the same weights, drafter and target (one job builds them once). Per (budget, builder):

- ``timing = "wall"``: one whole round, host-inclusive (``time.perf_counter_ns`` around the replay(s), the
  host build and the final synchronisation): ``gpu`` as one CUDA graph, the CPU builders split around the
  host build as SGLang's worker splits it;
- ``timing = "sum-of-parts"``: the same round's parts timed one after another in the same repetition (the
  draft graph, the build, the verify graph, each waited for), summed: what a model of separately timed parts
  would charge. The difference is what the round's shape costs or saves.

``correct``: the last round's accepted paths equal the CPU walk on the same trees and target tokens. The
tensor-parallel communication is not in a one-GPU round (the report adds the ``allreduce`` term, measured or
estimated, and labels it). A (B, N, S) that does not fit gets rows saying so; without a GPU, rows say why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.environment import ENVIRONMENT_COLUMNS, collect_environment
from ddtree_bench.k26 import moe as moe_ops
from ddtree_bench.k26.draft import draft_block
from ddtree_bench.k26.round import FUSED_BUILDERS, ROUND_BUILDERS, RoundOptions
from ddtree_bench.k26.shapes import DrafterShape, ModelShape
from ddtree_bench.paths import layout
from ddtree_bench.stages import points
from ddtree_bench.stages.gpu_runner import HEADROOM, describe_error, gpu_reason
from ddtree_bench.timing.policy import TimingPolicy
from ddtree_bench.timing.records import stage_frame, unavailable_row

ROUND_TIMINGS = ("wall", "sum-of-parts")


@dataclass(frozen=True)
class Job:
    """One round job: ``batch`` requests over a prefix of ``prefix`` rows, every budget of ``budgets``,
    whole rounds per builder of ``builders`` (``builder_options``: each builder's keyword options, SGLang's
    too for its stack) and, where ``stacks`` names some (``{"stacks": names, "max_seconds": limit,
    "attention_files": SGLang's Triton attention files}``), per stack, on the same weights: a target of
    ``shape`` with the MoE impl ``forward_impl`` (``sglang_files``: the sglang wheel's extracted files; None:
    the installed sglang), a drafter of ``drafter_shape``, the block of ``k26.round.RoundOptions``.
    ``timing``: ``TimingPolicy``'s keyword arguments; the fatbins: prebuilt ``verify_attn.cu`` /
    ``tree_accept.cu`` (None: the cached builds). ``stacks`` also holds the chain's blocks
    (``chain_blocks``), the stacks' sampling (``warmup``, ``repeats``), the configurations run again
    (``repeat_budgets``, ``repeat_runs``) and the communication estimate's numbers (``comm``);
    ``expert_sets``: the target's distinct routed-expert sets (None: one per MoE layer where they fit).
    ``budgets`` holds the chain's budgets (block - 1) too: the job writes a file per budget."""

    batch: int
    prefix: int
    budgets: tuple[int, ...]
    builders: tuple[str, ...]
    builder_options: dict
    shape: ModelShape
    drafter_shape: DrafterShape
    forward_impl: str
    block_size: int
    follow_budget: bool
    topk: int
    timing: dict
    routing: str = "uniform"
    skew: float = 1.0
    sglang_files: str | None = None
    machine: str | None = None
    attention_fatbin: str | None = None
    accept_fatbin: str | None = None
    stacks: dict | None = None
    expert_sets: int | None = None
    seed: int = 0
    tree_budgets: tuple[int, ...] | None = None

    def __post_init__(self):
        # without a chain every budget is a tree budget; an override of budgets keeps the tree budgets in it
        trees = self.budgets if self.tree_budgets is None else self.tree_budgets
        object.__setattr__(self, "tree_budgets", tuple(b for b in trees if b in self.budgets))

    @classmethod
    def grid(cls, settings) -> list[dict]:
        step = settings.step_options()
        round_ = step["round"]
        if not (round_["builders"] or round_["stacks"] or round_["chain_blocks"]):
            return []
        return points(batch=round_["batch_sizes"], prefix=step["prefix_lengths"])

    @classmethod
    def from_settings(cls, settings, *, batch, prefix, results=None):
        step, files = settings.step_options(), layout(settings, results)
        model, draft, round_ = step["model"], step["draft"], step["round"]
        builders = tuple(round_["builders"])
        chain = {int(b) - 1 for b in round_["chain_blocks"]}
        return cls(
            batch=int(batch),
            prefix=int(prefix),
            budgets=tuple(sorted({int(b) for b in step["budgets"]} | chain)),
            tree_budgets=tuple(int(b) for b in step["budgets"]),
            builders=builders,
            builder_options={
                b: {**files.libraries(b), **settings.builder_options(b)}
                for b in sorted({*builders, catalog.SGLANG})
                if b in catalog.BUILDERS
            },
            shape=model["shape"],
            drafter_shape=draft["shape"],
            forward_impl=model["forward_impl"],
            block_size=draft["block_size"],
            follow_budget=draft["follow_budget"],
            topk=int(settings.trace_columns),
            timing=step["attention_timing"],
            routing=model["routing"],
            skew=model["skew"],
            sglang_files=model["sglang_files"],
            machine=settings.machine,
            attention_fatbin=files.artefact("verify_attn"),
            accept_fatbin=files.artefact("tree_accept"),
            stacks={
                "stacks": tuple(round_["stacks"]),
                "max_seconds": round_["max_round_seconds"],
                "attention_files": step["sglang_triton_source"],
                "chain_blocks": tuple(round_["chain_blocks"]),
                "warmup": round_["warmup"],
                "repeats": round_["repeats"],
                "repeat_budgets": tuple(round_["repeat_budgets"]),
                "repeat_runs": round_["repeat_runs"],
                "comm": dict(round_["comm"]),
            },
            expert_sets=round_["expert_sets"],
        )

    @property
    def inputs(self) -> dict[str, str]:
        """The attention and accept fatbins and every builder's libraries (``<builder>_<option>``)."""
        inputs = {"attention": self.attention_fatbin, "accept": self.accept_fatbin}
        for builder in self.builders:
            options = self.builder_options.get(builder) or {}
            for option, _ in catalog.BUILDERS[builder].libraries:
                if options.get(option) is not None:
                    inputs[f"{builder}_{option}"] = options[option]
        return inputs

    @property
    def stack_names(self) -> list[str]:
        return list(self.stacks["stacks"]) if self.stacks else []

    def options(self, budget: int) -> RoundOptions:
        """The round at ``budget`` (``k26.round.RoundOptions``)."""
        return RoundOptions(
            batch=self.batch,
            budget=budget,
            prefix=self.prefix,
            block_size=self.block_size,
            follow_budget=self.follow_budget,
            topk=self.topk,
            routing=self.routing,
            skew=self.skew,
            seed=self.seed,
        )


class _Rows:
    """A job's rows by budget, and the fields every row of it carries."""

    def __init__(self, job: Job, env: dict):
        self.job, self.env = job, env
        self.budgets = [int(b) for b in job.budgets]
        self.by_budget: dict[int, list[dict]] = {budget: [] for budget in self.budgets}
        self.expert_note = None

    def base(self, builder: str, budget: int, timing_name: str) -> dict:
        job = self.job
        return {
            **{key: self.env.get(key) for key in ENVIRONMENT_COLUMNS},
            "stage": "round",
            "impl": builder,
            "batch": job.batch,
            "budget": budget,
            "heads": job.shape.local_heads,
            "prefix": job.prefix,
            "tokens": job.batch * (budget + 1),
            "timing": timing_name,
            "cache": "n/a",
            "clock": "time.perf_counter_ns",
            "note": "one CUDA graph"
            if builder in FUSED_BUILDERS
            else "split: draft graph, host build, verify graph",
        }

    def stack_base(self, stack: str, budget: int, timing_name: str) -> dict:
        job = self.job
        # the trees' L (the drafted positions); a chain's is its block - 1, its budget
        depth = (
            budget
            if stack == catalog.CHAIN
            else draft_block(budget, job.block_size, job.topk, job.follow_budget)[0] - 1
        )
        return {
            **self.base(stack, budget, timing_name),
            "stage": "stack",
            "depth": depth,
            "note": self.expert_note,
        }

    def unavailable(self, builder, budget, reason, status="unavailable") -> dict:
        return unavailable_row(self.base(builder, budget, "wall"), reason, status)

    def all_unavailable(self, reason: str) -> None:
        """A row saying ``reason`` per budget, builder and stack (and chain block)."""
        job = self.job
        chains = {int(b) - 1 for b in (job.stacks or {}).get("chain_blocks", ())}
        for budget in self.budgets:
            names = job.stack_names if budget in job.tree_budgets else []
            names = names + ([catalog.CHAIN] if budget in chains else [])
            builders = job.builders if budget in job.tree_budgets else ()
            self.by_budget[budget] += [self.unavailable(b, budget, reason) for b in builders] + [
                {**self.unavailable(name, budget, reason), "stage": "stack", "note": None} for name in names
            ]

    def frames(self) -> dict[int, pd.DataFrame]:
        return {budget: stage_frame(r) for budget, r in self.by_budget.items()}


def run(job: Job) -> dict[int, pd.DataFrame]:
    """Whole rounds per builder (module docstring), then, where ``job.stacks`` names some, per stack
    (``run_stack_rounds``) in the same job, on the same weights: one frame of rows per budget. An unknown
    builder is a one-line ValueError before anything runs."""
    unknown = [b for b in job.builders if b not in ROUND_BUILDERS]
    if unknown:
        raise ValueError(f"round: unknown builder {unknown[0]!r}; expected one of {list(ROUND_BUILDERS)}")
    policy = TimingPolicy(**job.timing)
    rows = _Rows(job, collect_environment(job.machine))
    reason = gpu_reason() or moe_ops.moe_unavailable_reason(job.forward_impl, job.sglang_files)
    if reason is not None:
        rows.all_unavailable(reason)
        return rows.frames()

    import torch  # noqa: PLC0415

    from ddtree_bench.k26.target import TargetWeights, layer_expert_bytes  # noqa: PLC0415
    from ddtree_bench.ops.accept import GpuAccept  # noqa: PLC0415
    from ddtree_bench.ops.attention import VerifyAttention  # noqa: PLC0415

    sets, reason = expert_sets(torch, job)
    if reason is not None:
        rows.all_unavailable(reason)
        return rows.frames()
    weights = TargetWeights(
        job.shape, moe_impl=job.forward_impl, sglang_files=job.sglang_files, seed=job.seed, expert_sets=sets
    )
    if sets < job.shape.moe_layers:
        rows.expert_note = (
            f"{sets} distinct routed-expert sets cycled over the {job.shape.moe_layers} MoE layers (each "
            f"{layer_expert_bytes(job.shape, job.forward_impl) / 1e9:.2f} GB, far beyond the L2)"
        )
    kernels = {"attention": VerifyAttention(job.attention_fatbin), "accept": GpuAccept(job.accept_fatbin)}
    if job.stacks and (job.stacks.get("stacks") or job.stacks.get("chain_blocks")):
        from ddtree_bench.stages.stacks import run_stack_rounds  # noqa: PLC0415

        stack_rows = run_stack_rounds(weights, job, kernels, rows.stack_base)
        for budget in rows.budgets:
            rows.by_budget[budget] += stack_rows[budget]
    for budget in job.tree_budgets:
        for builder in job.builders:
            rows.by_budget[budget] += _builder_rows(weights, job, kernels, policy, rows, builder, budget)
    return rows.frames()


def expert_sets(torch, job: Job) -> tuple[int, str | None]:
    """``(sets, reason)``: the distinct routed-expert sets the job's weights hold (``job.expert_sets``, or
    one per MoE layer where they fit beside the largest stack round, else as many as fit, at least 2), or
    why the weights do not fit at all."""
    from ddtree_bench.k26.target import layer_expert_bytes, weights_bytes  # noqa: PLC0415
    from ddtree_bench.stages.stacks import stack_need  # noqa: PLC0415

    torch.cuda.empty_cache()
    free = float(torch.cuda.mem_get_info()[0]) * (1 - HEADROOM)
    shape, impl = job.shape, job.forward_impl
    per_set = layer_expert_bytes(shape, impl)
    fixed = weights_bytes(shape, impl) - shape.moe_layers * per_set
    if job.expert_sets is not None:
        sets = min(int(job.expert_sets), shape.moe_layers)
    else:
        state = max((stack_need(job, b) for b in job.budgets), default=0.0) if job.stacks else 0.0
        sets = int(max(2, min(shape.moe_layers, (free - fixed - state) // per_set)))
    need = fixed + sets * per_set
    if need > free:
        return sets, f"does not fit: needs about {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
    return sets, None


def _builder_rows(weights, job: Job, kernels: dict, policy, rows: _Rows, builder: str, budget: int) -> list:
    """One builder's whole rounds at one budget (``kernels``: our attention and accept): their rows, or one
    saying why there are none."""
    import torch  # noqa: PLC0415

    from ddtree_bench.k26.draft import draft_bytes  # noqa: PLC0415
    from ddtree_bench.k26.round import RoundRunner  # noqa: PLC0415
    from ddtree_bench.k26.target import state_bytes, weights_bytes  # noqa: PLC0415

    shape, batch, prefix = job.shape, job.batch, job.prefix
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free = float(torch.cuda.mem_get_info()[0])
    need = weights_bytes(shape, job.forward_impl)
    block = budget + 1 if job.follow_budget else job.block_size
    needed = state_bytes(shape, batch, budget, prefix) + draft_bytes(
        job.drafter_shape, batch, block, prefix, shape.vocab_shard
    )
    if needed > free * (1 - HEADROOM):
        total = needed + need
        reason = f"does not fit: needs about {total / 1e9:.1f} GB, {(free + need) / 1e9:.1f} GB free"
        return [rows.unavailable(builder, budget, reason)]
    try:
        runner = RoundRunner(
            weights,
            job.drafter_shape,
            job.options(budget),
            builder=builder,
            builder_options=job.builder_options.get(builder),
            **kernels,
        )
        runner.capture()
        samples = _round_samples(runner, policy)
        runner.run_round()
        correct = runner.check_accept()
        note = runner.note
    except Exception as exc:  # noqa: BLE001 (a builder failing: recorded, the others still run)
        return [rows.unavailable(builder, budget, describe_error(exc), status="failed")]
    return timed_rows(
        lambda t: rows.base(builder, budget, t),
        samples,
        correct=correct,
        note=note,
        experts_touched=runner.target.experts_touched,
    )


def _round_samples(runner, policy) -> dict:
    """A whole round (``wall``) and its parts one after another (``sum-of-parts``), call by call:
    ``{timing: [(phase, repetition, seconds)]}``."""
    torch, clock, parts = runner.torch, time.perf_counter_ns, runner.parts()

    def whole():
        t0 = clock()
        runner.run_round()
        return (clock() - t0) / 1e9

    def summed():
        total = 0.0
        for part in parts.values():
            t0 = clock()
            part()
            torch.cuda.current_stream().synchronize()
            total += (clock() - t0) / 1e9
        return total

    samples = {"wall": [], "sum-of-parts": []}

    def both():
        samples["wall"].append(whole())
        samples["sum-of-parts"].append(summed())
        return samples["wall"][-1] + samples["sum-of-parts"][-1]

    calls = policy.samples(both)  # the round and its parts in turn, call by call
    return {
        name: [(phase, rep, v) for (phase, rep, _), v in zip(calls, values, strict=True)]
        for name, values in samples.items()
    }


def timed_rows(base, samples: dict, *, correct, note, experts_touched) -> list[dict]:
    """A row per timed call: ``samples`` maps each timing to its ``(phase, repetition, seconds)``;
    ``base(timing)`` gives the row's configuration."""
    return [
        {
            **base(timing),
            "phase": phase,
            "repetition": rep,
            "seconds": seconds,
            "status": "ok",
            "correct": correct,
            "note": note,
            "experts_touched": experts_touched,
        }
        for timing, values in samples.items()
        for phase, rep, seconds in values
    ]
