"""The rest of the round, measured: the target's verify forward and its parts on one GPU's share of Kimi
K2.6 (``k26.target``), at one (batch, prefix length) for every budget: a ``Job`` and ``run(job)``.

One job builds the rank's weights once (random, distinct per layer) and, per budget N, the state of one
verify forward of ``T = B x (N + 1)`` tree tokens over a prefix of S rows, the trees' masks built from the
trace as the verify-attention stage builds them. Each measured call is one CUDA graph replay, timed by CUDA
events behind the spin kernel (``timing.gpu.EventTimer``), warm (the weights far exceed the L2 anyway):

- ``forward`` (impl: the MoE impl it runs): every layer, attention included, and the LM-head shard;
- with ``parts``: ``moe`` (every MoE layer's router, routed and shared experts) per MoE impl, ``dense``
  (norms and MLA projections of every layer, the dense layers' MLPs; no attention core) and ``lm-head``
  (final norm and the LM-head shard). The MoE impls other than the forward's run on weights of their own
  (``moe_only``); one too large for every layer's own experts cycles as many distinct sets as fit.

Rows carry ``tokens``, ``bytes`` (weights read at least once; the routed experts only those touched),
``flops``, ``experts_touched`` and a ``note`` (graph or eager, expert sets). A (B, N, S) whose weights,
KV cache and activations do not fit the GPU gets one row "does not fit: needs X GB" per stage; an impl that
cannot load gets its reason; nothing crashes the job but a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.environment import ENVIRONMENT_COLUMNS, collect_environment
from ddtree_bench.k26 import moe as moe_ops
from ddtree_bench.k26.shapes import ModelShape
from ddtree_bench.paths import layout
from ddtree_bench.stages import points
from ddtree_bench.stages.gpu_runner import HEADROOM, GraphRunner, describe_error, gpu_reason, ok_rows
from ddtree_bench.timing.gpu import EVENT_CLOCK
from ddtree_bench.timing.policy import TimingPolicy
from ddtree_bench.timing.records import stage_frame, unavailable_row

#: The stages one model job writes, in order.
MODEL_STAGES = ("forward", "moe", "dense", "lm-head")


def stage_impls(stage: str, moe_impls, forward_impl: str) -> tuple[str, ...]:
    """The impls a model stage's rows name: the forward's MoE impl, every MoE impl, or torch."""
    if stage == "forward":
        return (forward_impl,)
    if stage == "moe":
        return tuple(moe_impls)
    return ("torch",)


@dataclass(frozen=True)
class Job:
    """One model job: ``batch`` requests over a prefix of ``prefix`` rows, every budget of ``budgets``, on
    one GPU's share of a target of ``shape``; the trees from ``trace``. ``forward_impl``: the forward's MoE
    impl; ``parts``: also time the parts (``moe`` per impl of ``moe_impls``, ``dense``, ``lm-head``);
    ``routing``, ``skew``: the routed experts' routing; ``sglang_files``: the sglang wheel's extracted files
    (None: the installed sglang); ``timing``: ``TimingPolicy``'s keyword arguments; the fatbins: prebuilt
    ``verify_attn.cu`` / ``bench_util.cu`` (None: the cached builds)."""

    trace: str
    batch: int
    prefix: int
    budgets: tuple[int, ...]
    shape: ModelShape
    moe_impls: tuple[str, ...]
    forward_impl: str
    parts: bool
    timing: dict
    routing: str = "uniform"
    skew: float = 1.0
    sglang_files: str | None = None
    machine: str | None = None
    distribution: str | None = None
    attention_fatbin: str | None = None
    util_fatbin: str | None = None
    seed: int = 0

    @classmethod
    def grid(cls, settings) -> list[dict]:
        step = settings.step_options()
        return points(
            distribution=[step["distribution"]],
            depth=[step["depth"]],
            batch=step["batch_sizes"],
            prefix=step["prefix_lengths"],
        )

    @classmethod
    def from_settings(cls, settings, *, distribution, depth, batch, prefix, results=None):
        step, files = settings.step_options(), layout(settings, results)
        model = step["model"]
        return cls(
            trace=files.trace_of(distribution, depth),
            batch=int(batch),
            prefix=int(prefix),
            budgets=tuple(int(b) for b in step["budgets"]),
            shape=model["shape"],
            moe_impls=tuple(model["moe_impls"]),
            forward_impl=model["forward_impl"],
            parts=int(prefix) == min(step["prefix_lengths"]),
            timing=step["attention_timing"],
            routing=model["routing"],
            skew=model["skew"],
            sglang_files=model["sglang_files"],
            machine=settings.machine,
            distribution=distribution,
            attention_fatbin=files.artefact("verify_attn"),
            util_fatbin=files.artefact("bench_util"),
        )

    @property
    def inputs(self) -> dict[str, str]:
        return {"trace": self.trace, "attention": self.attention_fatbin, "util": self.util_fatbin}

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages the job writes: every one of ``MODEL_STAGES`` with ``parts``, else the forward."""
        return MODEL_STAGES if self.parts else ("forward",)


def configured_impls(settings) -> dict[str, tuple[str, ...]]:
    """The impls the configuration runs (its rows saying why name these): the forward's, the MoE parts'."""
    model = settings.step.model
    return {"forward": (model.forward_impl,), "moe": tuple(model.moe_impls)}


def _check(job: Job) -> None:
    budgets = [int(b) for b in job.budgets]
    for impl in [*job.moe_impls, job.forward_impl]:
        if impl not in moe_ops.MOE_IMPLS:
            raise ValueError(f"model: unknown MoE impl {impl!r}; expected one of {list(moe_ops.MOE_IMPLS)}")
    if job.batch < 1 or job.prefix < 0 or not budgets or min(budgets) < 1:
        raise ValueError(
            "model: batch >= 1, prefix >= 0 and budgets >= 1 needed, "
            f"got {job.batch}, {job.prefix}, {budgets}"
        )


def run(job: Job) -> dict[int, pd.DataFrame]:
    """Rows per budget (module docstring), as ``timing.records.stage_frame``. Bad arguments are a one-line
    ValueError before anything runs."""
    _check(job)
    policy = TimingPolicy(**job.timing)
    rows = _Rows(job, collect_environment(job.machine))
    reason = gpu_reason()
    if reason is not None:
        rows.all_unavailable(reason)
        return rows.frames()
    runner = GraphRunner(policy, job.util_fatbin)
    # 1. the forward's weights: the forward and (with parts) dense, lm-head and the forward impl's moe
    forward_reason = moe_ops.moe_unavailable_reason(job.forward_impl, job.sglang_files)
    if forward_reason is not None:
        rows.all_unavailable(f"{job.forward_impl}: {forward_reason}", ("forward", "dense", "lm-head"))
        if job.parts:
            rows.all_unavailable(forward_reason, ("moe",), [job.forward_impl])
    else:
        _forward_jobs(runner, rows, job)
    # 2. the other MoE impls, each on weights of its own
    if job.parts:
        for impl in job.moe_impls:
            if impl == job.forward_impl:
                continue
            impl_reason = moe_ops.moe_unavailable_reason(impl, job.sglang_files)
            if impl_reason is not None:
                rows.all_unavailable(impl_reason, ("moe",), [impl])
                continue
            _moe_jobs(runner, rows, job, impl)
    return rows.frames()


class _Rows:
    """A job's rows by budget, and the fields every row of it carries."""

    def __init__(self, job: Job, env: dict):
        self.job, self.env = job, env
        self.budgets = [int(b) for b in job.budgets]
        self.by_budget: dict[int, list[dict]] = {budget: [] for budget in self.budgets}

    def base(self, stage: str, impl: str, budget: int) -> dict:
        job, forward = self.job, stage == "forward"
        return {
            **{key: self.env.get(key) for key in ENVIRONMENT_COLUMNS},
            "stage": stage,
            "impl": impl,
            "batch": job.batch,
            "budget": budget,
            "heads": job.shape.local_heads if forward else None,
            "prefix": job.prefix if forward else None,
            "distribution": job.distribution if forward else None,
            "tokens": job.batch * (budget + 1),
            "timing": "cuda-events",
            "cache": "warm",
            "clock": EVENT_CLOCK,
        }

    def unavailable(self, stage, impl, budget, reason, status="unavailable") -> dict:
        return unavailable_row(self.base(stage, impl, budget), reason, status)

    def all_unavailable(self, reason, stages=None, impls=None) -> None:
        """A row saying ``reason`` per budget, stage of ``stages`` (default: the job's) and impl (default:
        the stage's)."""
        job = self.job
        for budget in self.budgets:
            for stage in stages or job.stages:
                for impl in impls or stage_impls(stage, job.moe_impls, job.forward_impl):
                    self.by_budget[budget].append(self.unavailable(stage, impl, budget, reason))

    def unfit(self, budget: int, impl: str, reason: str) -> None:
        """A row saying ``reason`` per stage of the job at ``budget`` (the forward's weights do not fit)."""
        for stage in self.job.stages:
            self.by_budget[budget].append(self.unavailable(stage, _impl_of(stage, impl), budget, reason))

    def frames(self) -> dict[int, pd.DataFrame]:
        return {budget: stage_frame(r) for budget, r in self.by_budget.items()}


def _impl_of(stage: str, impl: str) -> str:
    """The impl a row of ``stage`` names where the forward runs ``impl``: it, or torch (dense, lm-head)."""
    return impl if stage in ("forward", "moe") else "torch"


def _slice_bytes(shape: ModelShape, impl: str) -> float:
    """One routed expert's slice in ``impl``'s format (INT4 with group scales, or BF16)."""
    return moe_ops.weight_bytes(impl, 1, shape.hidden, shape.expert_slice, shape.group_size)


def _trees_mask(trace_path, batch: int, budget: int):
    """The trees' packed visibility [B, N+1, words] (int32, on the GPU), built from the trace as the
    verify-attention stage builds them."""
    import torch  # noqa: PLC0415

    from ddtree_bench.builders import get_builder  # noqa: PLC0415
    from ddtree_bench.stages.build import read_batch  # noqa: PLC0415
    from ddtree_bench.tree import packed_visibility  # noqa: PLC0415

    lp, ids, columns, _ = read_batch(trace_path, batch)
    topk = min(budget, columns)
    trees = get_builder(catalog.NATIVE).build(
        np.ascontiguousarray(lp[..., :topk]), np.ascontiguousarray(ids[..., :topk]), budget
    )
    bits = packed_visibility(trees.visibility)
    return torch.as_tensor(bits.view(np.int32), device="cuda"), int(lp.shape[1])


def _forward_jobs(runner: GraphRunner, rows: _Rows, job: Job) -> None:
    """The forward (and, with parts, its parts) at every budget on the forward impl's weights."""
    from ddtree_bench.k26.target import TargetWeights, state_bytes, weights_bytes  # noqa: PLC0415
    from ddtree_bench.ops.attention import VerifyAttention  # noqa: PLC0415

    shape, impl = job.shape, job.forward_impl
    free = runner.free()
    need = weights_bytes(shape, impl)
    if need > free * (1 - HEADROOM):
        for budget in rows.budgets:
            needed = need + state_bytes(shape, job.batch, budget, job.prefix)
            rows.unfit(
                budget, impl, f"does not fit: needs about {needed / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
            )
        return
    with runner.torch.cuda.stream(runner.torch_stream):
        weights = TargetWeights(shape, moe_impl=impl, sglang_files=job.sglang_files, seed=job.seed)
    attention = VerifyAttention(job.attention_fatbin)
    for budget in rows.budgets:
        free = runner.free()
        needed = state_bytes(shape, job.batch, budget, job.prefix)
        if needed > free * (1 - HEADROOM):
            total = needed + weights_bytes(shape, impl)
            rows.unfit(
                budget,
                impl,
                f"does not fit: needs about {total / 1e9:.1f} GB, "
                f"{(free + weights_bytes(shape, impl)) / 1e9:.1f} GB free",
            )
            continue
        _forward_budget(runner, rows, job, (weights, attention), budget)
    del weights


def _forward_budget(runner: GraphRunner, rows: _Rows, job: Job, loaded: tuple, budget: int) -> None:
    """The forward and its parts at one budget; ``loaded``: the weights and our attention kernel."""
    from ddtree_bench.k26.target import ShardOptions, TargetShard  # noqa: PLC0415

    weights, attention = loaded
    shape, impl, batch, prefix = job.shape, job.forward_impl, job.batch, job.prefix
    tokens = batch * (budget + 1)
    with runner.torch.cuda.stream(runner.torch_stream):
        mask_bits, depth = _trees_mask(job.trace, batch, budget)
        state = TargetShard(
            weights,
            batch=batch,
            budget=budget,
            prefix=prefix,
            attention=attention,
            mask_bits=mask_bits,
            options=ShardOptions(routing=job.routing, skew=job.skew),
        )
    touched = state.experts_touched
    part_bytes = shape.part_bytes(tokens, touched, _slice_bytes(shape, impl))
    part_flops = shape.part_flops(tokens)
    calls = {"forward": state.forward}
    if job.parts:
        calls.update({"moe": state.moe_part, "dense": state.dense_part, "lm-head": state.lm_head_part})
    for stage, fn in calls.items():
        row = {**rows.base(stage, _impl_of(stage, impl), budget)}
        if stage == "forward":
            row["depth"] = depth
            nbytes = sum(part_bytes.values()) + shape.kv_cache_bytes(batch, prefix + budget + 1)
            flops = sum(part_flops.values())
        else:
            nbytes, flops = part_bytes[stage], part_flops[stage]
        try:
            samples, note = runner.measure(fn)
        except Exception as exc:  # noqa: BLE001 (an impl failing at run time: recorded, the job goes on)
            rows.by_budget[budget].append(
                rows.unavailable(stage, row["impl"], budget, describe_error(exc), status="failed")
            )
            continue
        rows.by_budget[budget].extend(
            ok_rows(
                row,
                samples,
                flops=flops,
                nbytes=nbytes,
                experts_touched=touched if stage in ("forward", "moe") else None,
                note=note,
            )
        )
    del calls, state, mask_bits


def _moe_jobs(runner: GraphRunner, rows: _Rows, job: Job, impl: str) -> None:
    """The MoE part of ``impl`` at every budget, on weights of its own (as many expert sets as fit)."""
    from ddtree_bench.k26.target import (  # noqa: PLC0415
        ShardOptions,
        TargetShard,
        TargetWeights,
        activation_bytes,
        layer_expert_bytes,
    )

    shape, batch = job.shape, job.batch
    free = runner.free()
    per_set = layer_expert_bytes(shape, impl)
    tokens_max = batch * (max(rows.budgets) + 1)
    # twice the forward's activations: a grouped GEMM impl keeps every route's rows, in float32 for the sum
    room = free * (1 - HEADROOM) - shape.bf16_bytes() - 2 * activation_bytes(shape, tokens_max)
    sets = int(min(shape.moe_layers, room // per_set)) if room > 0 else 0
    if sets < 1:
        for budget in rows.budgets:
            rows.by_budget[budget].append(
                rows.unavailable(
                    "moe", impl, budget, f"does not fit: one layer's experts need {per_set / 1e9:.1f} GB"
                )
            )
        return
    with runner.torch.cuda.stream(runner.torch_stream):
        weights = TargetWeights(
            shape,
            moe_impl=impl,
            sglang_files=job.sglang_files,
            moe_only=True,
            expert_sets=sets,
            seed=job.seed,
        )
    note_sets = (
        ""
        if sets == shape.moe_layers
        else f"; {sets} distinct expert sets of {per_set / 1e9:.1f} GB cycled over {shape.moe_layers} layers"
    )
    for budget in rows.budgets:
        tokens = batch * (budget + 1)
        with runner.torch.cuda.stream(runner.torch_stream):
            state = TargetShard(
                weights,
                batch=batch,
                budget=budget,
                prefix=0,
                options=ShardOptions(routing=job.routing, skew=job.skew),
            )
        touched = state.experts_touched
        try:
            samples, note = runner.measure(state.moe_part)
        except Exception as exc:  # noqa: BLE001
            rows.by_budget[budget].append(
                rows.unavailable("moe", impl, budget, describe_error(exc), status="failed")
            )
            continue
        moe_bytes = shape.part_bytes(tokens, touched, _slice_bytes(shape, impl))["moe"]
        rows.by_budget[budget].extend(
            ok_rows(
                rows.base("moe", impl, budget),
                samples,
                flops=shape.part_flops(tokens)["moe"],
                nbytes=moe_bytes,
                experts_touched=touched,
                note=note + note_sets,
            )
        )
        del state
    del weights
