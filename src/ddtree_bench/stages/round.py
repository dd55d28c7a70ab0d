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
    ``tree_accept.cu`` (None: the cached builds)."""

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
    seed: int = 0

    @classmethod
    def grid(cls, settings) -> list[dict]:
        step = settings.step_options()
        round_ = step["round"]
        if not round_["builders"]:
            return []
        return points(batch=round_["batch_sizes"], prefix=step["prefix_lengths"])

    @classmethod
    def from_settings(cls, settings, *, batch, prefix, results=None):
        step, files = settings.step_options(), layout(settings, results)
        model, draft, round_ = step["model"], step["draft"], step["round"]
        builders = tuple(round_["builders"])
        return cls(
            batch=int(batch),
            prefix=int(prefix),
            budgets=tuple(int(b) for b in step["budgets"]),
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
            },
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
        return {
            **self.base(stack, budget, timing_name),
            "stage": "stack",
            "depth": draft_block(budget, job.block_size, job.topk, job.follow_budget)[0] - 1,  # the trees' L
            "note": None,
        }

    def unavailable(self, builder, budget, reason, status="unavailable") -> dict:
        return unavailable_row(self.base(builder, budget, "wall"), reason, status)

    def all_unavailable(self, reason: str) -> None:
        """A row saying ``reason`` per budget, builder and stack."""
        for budget in self.budgets:
            self.by_budget[budget] += [self.unavailable(b, budget, reason) for b in self.job.builders] + [
                {**self.unavailable(name, budget, reason), "stage": "stack", "note": None}
                for name in self.job.stack_names
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

    from ddtree_bench.k26.target import TargetWeights, weights_bytes  # noqa: PLC0415
    from ddtree_bench.ops.accept import GpuAccept  # noqa: PLC0415
    from ddtree_bench.ops.attention import VerifyAttention  # noqa: PLC0415

    torch.cuda.empty_cache()
    free = float(torch.cuda.mem_get_info()[0])
    need = weights_bytes(job.shape, job.forward_impl)
    if need > free * (1 - HEADROOM):
        rows.all_unavailable(f"does not fit: needs about {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free")
        return rows.frames()
    weights = TargetWeights(
        job.shape, moe_impl=job.forward_impl, sglang_files=job.sglang_files, seed=job.seed
    )
    kernels = {"attention": VerifyAttention(job.attention_fatbin), "accept": GpuAccept(job.accept_fatbin)}
    if job.stacks and job.stacks.get("stacks"):
        stack_rows = run_stack_rounds(weights, job, kernels, policy, rows.stack_base)
        for budget in rows.budgets:
            rows.by_budget[budget] += stack_rows[budget]
    for budget in rows.budgets:
        for builder in job.builders:
            rows.by_budget[budget] += _builder_rows(weights, job, kernels, policy, rows, builder, budget)
    return rows.frames()


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


def _stack_fits(torch, job: Job, budget: int, need: float) -> str | None:
    from ddtree_bench.k26.draft import draft_bytes  # noqa: PLC0415
    from ddtree_bench.k26.target import state_bytes  # noqa: PLC0415

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free = float(torch.cuda.mem_get_info()[0])
    shape, batch, prefix = job.shape, job.batch, job.prefix
    block = budget + 1 if job.follow_budget else job.block_size
    # the round's state plus SGLang's mask (q x (S + q) bools a request) and FA3's scratch
    needed = (
        state_bytes(shape, batch, budget, prefix)
        + draft_bytes(job.drafter_shape, batch, block, prefix, shape.vocab_shard)
        + batch * (budget + 1) * (prefix + budget + 1)
        + 2 * batch * (budget + 1) * shape.local_heads * 512 * 4 * 2
    )
    if needed > free * (1 - HEADROOM):
        return f"does not fit: needs about {(needed + need) / 1e9:.1f} GB, {(free + need) / 1e9:.1f} GB free"
    return None


def run_stack_rounds(weights, job: Job, kernels: dict, policy, base) -> dict[int, list[dict]]:
    """Per budget of ``job`` and stack of ``job.stacks`` (``catalog.STACKS``): whole rounds
    (``k26.stack.StackRound``, on ``weights`` with ``kernels``: our attention and accept) timed as ``wall``
    (one round, host-inclusive) and its parts (``part-draft`` ... ``part-accept``, each waited for, and their
    ``sum-of-parts``), call by call; ``correct``: the accepted paths equal the CPU walk. A stack whose forward
    or round exceeds ``job.stacks["max_seconds"]`` gets a row saying so, untimed. ``base(stack, budget,
    timing)``: a row's configuration."""
    import torch  # noqa: PLC0415

    from ddtree_bench.k26.stack import StackRound  # noqa: PLC0415
    from ddtree_bench.k26.target import weights_bytes  # noqa: PLC0415

    names = job.stack_names
    sglang_builder = job.builder_options.get(catalog.SGLANG, {})
    sglang = {
        "builder": dict(sglang_builder),
        "accept": sglang_builder.get("source"),
        "attention_files": job.stacks.get("attention_files"),
    }
    clock = time.perf_counter_ns
    need = weights_bytes(weights.shape, weights.moe_impl)
    rows: dict[int, list[dict]] = {budget: [] for budget in (int(b) for b in job.budgets)}
    for budget in rows:
        reason = _stack_fits(torch, job, budget, need)
        if reason is not None:
            rows[budget] += [unavailable_row(base(n, budget, "wall"), reason) for n in names]
            continue
        try:
            runner = StackRound(
                weights,
                job.drafter_shape,
                job.options(budget),
                stacks=names,
                sglang=sglang,
                max_seconds=job.stacks["max_seconds"],
                **kernels,
            )
            runner.capture()
        except Exception as exc:  # noqa: BLE001 (every stack of this budget: recorded)
            rows[budget] += [
                unavailable_row(base(n, budget, "wall"), describe_error(exc), "failed") for n in names
            ]
            continue
        for stack in runner.stacks:
            t0 = time.perf_counter()
            rows[budget] += _time_stack(
                runner, stack, policy, clock, lambda t, s=stack, n=budget: base(s.name, n, t)
            )
            _progress(rows[budget], stack.name, budget, time.perf_counter() - t0)
        del runner
    return rows


def _progress(rows: list[dict], name: str, budget: int, spent: float) -> None:
    """One line on stderr per (stack, budget): its median whole round, or why it has none."""
    import sys  # noqa: PLC0415

    mine = [r for r in rows if r["impl"] == name]
    walls = sorted(r["seconds"] for r in mine if r.get("timing") == "wall" and r.get("status") == "ok")
    what = (
        f"round {walls[len(walls) // 2] * 1e3:.2f} ms, correct {mine[-1].get('correct')}"
        if walls
        else f"{mine[-1].get('status')}: {mine[-1].get('status_reason')}"
    )
    print(f"stack {name} N={budget}: {what} ({spent:.1f} s)", file=sys.stderr, flush=True)


def _time_stack(runner, stack, policy, clock, base) -> list[dict]:
    import torch  # noqa: PLC0415

    from ddtree_bench.k26.stack import TooSlow  # noqa: PLC0415

    try:
        runner.prepare_stack(stack)
        t0 = clock()
        runner.run_stack(stack)  # warm, and the limit checked on a whole round
        seconds = (clock() - t0) / 1e9
        if seconds > runner.max_seconds:
            raise TooSlow(f"one round took {seconds:.2f} s, over the limit of {runner.max_seconds:g} s")
        parts = runner.parts_of(stack)
        samples = {"wall": [], "sum-of-parts": [], **{f"part-{name}": [] for name in parts}}

        def both():
            t0 = clock()
            runner.run_stack(stack)
            samples["wall"].append((clock() - t0) / 1e9)
            total = 0.0
            for name, part in parts.items():
                t0 = clock()
                part()
                torch.cuda.current_stream().synchronize()
                seconds = (clock() - t0) / 1e9
                samples[f"part-{name}"].append(seconds)
                total += seconds
            samples["sum-of-parts"].append(total)
            return samples["wall"][-1] + total

        calls = policy.samples(both)
        runner.run_stack(stack)
        correct = runner.check(stack)
        note = runner.describe(stack)
    except TooSlow as exc:
        return [unavailable_row(base("wall"), f"not timed: {exc}")]
    except Exception as exc:  # noqa: BLE001 (a stack failing: recorded, the others still run)
        torch.cuda.synchronize()
        return [unavailable_row(base("wall"), describe_error(exc), status="failed")]
    samples = {
        name: [(phase, rep, v) for (phase, rep, _), v in zip(calls, values, strict=True)]
        for name, values in samples.items()
    }
    return timed_rows(
        base, samples, correct=correct, note=note, experts_touched=runner.target.experts_touched
    )


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
