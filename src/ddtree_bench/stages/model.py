"""The rest of the round, measured: the target's verify forward and its parts on one GPU's share of Kimi
K2.6 (``model.target``), at one (batch, prefix length) for every budget: ``run_model_stage``.

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

import numpy as np
import pandas as pd

from ddtree_bench.cuda import loader as cuda
from ddtree_bench.environment import ENVIRONMENT_COLUMNS, collect_environment
from ddtree_bench.k26 import moe as moe_ops
from ddtree_bench.k26.shapes import ModelShape
from ddtree_bench.timing.gpu import EVENT_CLOCK
from ddtree_bench.timing.policy import TimingPolicy
from ddtree_bench.timing.records import stage_frame, unavailable_row

#: The stages one model job writes, in order.
MODEL_STAGES = ("forward", "moe", "dense", "lm-head")
#: Room left free on the GPU beside what a job allocates (the CUDA context, allocator slack).
HEADROOM = 0.06


def _describe(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def gpu_reason() -> str | None:
    """Why the model stages cannot run here (no GPU, no PyTorch), or None."""
    reason = cuda.gpu_unavailable_reason()
    if reason is None:
        try:
            import torch  # noqa: F401, PLC0415
        except ImportError as exc:
            reason = f"PyTorch is not installed: {exc}"
    return reason


def stage_impls(stage: str, moe_impls, forward_impl: str) -> tuple[str, ...]:
    if stage == "forward":
        return (forward_impl,)
    if stage == "moe":
        return tuple(moe_impls)
    return ("torch",)


def run_model_stage(
    trace_path,
    *,
    batch: int,
    prefix: int,
    budgets,
    shape: ModelShape,
    moe_impls,
    forward_impl: str,
    parts: bool,
    routing: str,
    skew: float,
    sglang_files,
    timing: dict,
    machine: str | None,
    distribution: str | None,
    attention_fatbin=None,
    util_fatbin=None,
    seed: int = 0,
) -> dict[int, pd.DataFrame]:
    """Rows per budget (module docstring), as ``timing.records.stage_frame``."""
    budgets = [int(b) for b in budgets]
    moe_impls = list(moe_impls)
    for impl in [*moe_impls, forward_impl]:
        if impl not in moe_ops.MOE_IMPLS:
            raise ValueError(f"model: unknown MoE impl {impl!r}; expected one of {list(moe_ops.MOE_IMPLS)}")
    if batch < 1 or prefix < 0 or not budgets or min(budgets) < 1:
        raise ValueError(
            f"model: batch >= 1, prefix >= 0 and budgets >= 1 needed, got {batch}, {prefix}, {budgets}"
        )
    policy = TimingPolicy(**timing)
    env = collect_environment(machine)
    stages = MODEL_STAGES if parts else ("forward",)

    def base(stage, impl, budget):
        tokens = batch * (budget + 1)
        return {
            **{key: env.get(key) for key in ENVIRONMENT_COLUMNS},
            "stage": stage,
            "impl": impl,
            "batch": batch,
            "budget": budget,
            "heads": shape.local_heads if stage == "forward" else None,
            "prefix": prefix if stage == "forward" else None,
            "distribution": distribution if stage == "forward" else None,
            "tokens": tokens,
            "timing": "cuda-events",
            "cache": "warm",
            "clock": EVENT_CLOCK,
        }

    def unavailable(stage, impl, budget, reason, status="unavailable"):
        return unavailable_row(base(stage, impl, budget), reason, status)

    rows: dict[int, list[dict]] = {budget: [] for budget in budgets}

    def all_unavailable(reason, stages_=stages, impls=None):
        for budget in budgets:
            for stage in stages_:
                for impl in impls or stage_impls(stage, moe_impls, forward_impl):
                    rows[budget].append(unavailable(stage, impl, budget, reason))

    reason = gpu_reason()
    if reason is not None:
        all_unavailable(reason)
        return {budget: stage_frame(r) for budget, r in rows.items()}

    runner = _Runner(policy, util_fatbin)
    # 1. the forward's weights: the forward and (with parts) dense, lm-head and the forward impl's moe
    forward_reason = moe_ops.moe_unavailable_reason(forward_impl, sglang_files)
    if forward_reason is not None:
        all_unavailable(f"{forward_impl}: {forward_reason}", ("forward", "dense", "lm-head"))
        if parts:
            all_unavailable(forward_reason, ("moe",), [forward_impl])
    else:
        _forward_jobs(
            runner,
            rows,
            base,
            unavailable,
            trace_path,
            budgets,
            shape,
            forward_impl,
            sglang_files,
            attention_fatbin,
            parts,
            batch,
            prefix,
            routing,
            skew,
            seed,
        )
    # 2. the other MoE impls, each on weights of its own
    if parts:
        for impl in moe_impls:
            if impl == forward_impl:
                continue
            impl_reason = moe_ops.moe_unavailable_reason(impl, sglang_files)
            if impl_reason is not None:
                all_unavailable(impl_reason, ("moe",), [impl])
                continue
            _moe_jobs(
                runner,
                rows,
                base,
                unavailable,
                budgets,
                shape,
                impl,
                sglang_files,
                batch,
                routing,
                skew,
                seed,
            )
    return {budget: stage_frame(r) for budget, r in rows.items()}


class _Runner:
    """The job's one event timer (behind the spin kernel) on a stream that torch also launches on."""

    def __init__(self, policy: TimingPolicy, util_fatbin):
        import cupy as cp  # noqa: PLC0415
        import torch  # noqa: PLC0415

        from ddtree_bench.timing.gpu import EventTimer  # noqa: PLC0415

        util = cp.RawModule(path=str(util_fatbin or cuda.cached_fatbin(cuda.BENCH_UTIL_SOURCE)))
        self.policy = policy
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.torch_stream = torch.cuda.ExternalStream(self.stream.ptr)
        self.timer = EventTimer(self.stream, util.get_function("ddtree_spin_kernel"))
        self.torch = torch

    def measure(self, fn):
        """``(samples, note)``: ``fn`` captured as one CUDA graph and its replays timed; where capture fails,
        the eager calls (said in the note)."""
        from ddtree_bench.k26.target import capture  # noqa: PLC0415

        torch = self.torch
        with torch.cuda.stream(self.torch_stream):
            try:
                graph, _ = capture(fn)
                call, note = graph.replay, "one CUDA graph"
            except Exception as exc:  # noqa: BLE001 (recorded: the eager calls are timed instead)
                torch.cuda.synchronize()
                graph, call, note = None, fn, f"eager (graph capture failed: {_describe(exc)})"
            samples = self.policy.samples(lambda: self.timer(call))
        torch.cuda.synchronize()
        del graph
        return samples, note

    def free(self) -> float:
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()
        return float(self.torch.cuda.mem_get_info()[0])


def _ok_rows(base_row: dict, samples, *, flops, nbytes, experts_touched, note) -> list[dict]:
    return [
        {
            **base_row,
            "phase": phase,
            "repetition": rep,
            "seconds": seconds,
            "flops": flops,
            "bytes": nbytes,
            "experts_touched": experts_touched,
            "note": note,
            "status": "ok",
        }
        for phase, rep, seconds in samples
    ]


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
    trees = get_builder("native").build(
        np.ascontiguousarray(lp[..., :topk]), np.ascontiguousarray(ids[..., :topk]), budget
    )
    bits = packed_visibility(trees.visibility)
    return torch.as_tensor(bits.view(np.int32), device="cuda"), int(lp.shape[1])


def _forward_jobs(
    runner,
    rows,
    base,
    unavailable,
    trace_path,
    budgets,
    shape,
    impl,
    sglang_files,
    attention_fatbin,
    parts,
    batch,
    prefix,
    routing,
    skew,
    seed,
) -> None:
    from ddtree_bench.k26.target import TargetShard, TargetWeights, state_bytes, weights_bytes  # noqa: PLC0415
    from ddtree_bench.ops.attention import VerifyAttention  # noqa: PLC0415

    stages = MODEL_STAGES if parts else ("forward",)
    free = runner.free()
    need = weights_bytes(shape, impl)
    if need > free * (1 - HEADROOM):
        for budget in budgets:
            for stage in stages:
                needed = need + state_bytes(shape, batch, budget, prefix)
                rows[budget].append(
                    unavailable(
                        stage,
                        impl if stage in ("forward", "moe") else "torch",
                        budget,
                        f"does not fit: needs about {needed / 1e9:.1f} GB, {free / 1e9:.1f} GB free",
                    )
                )
        return
    with runner.torch.cuda.stream(runner.torch_stream):
        weights = TargetWeights(shape, moe_impl=impl, sglang_files=sglang_files, seed=seed)
    attention = VerifyAttention(attention_fatbin)
    for budget in budgets:
        free = runner.free()
        needed = state_bytes(shape, batch, budget, prefix)
        if needed > free * (1 - HEADROOM):
            total = needed + weights_bytes(shape, impl)
            for stage in stages:
                rows[budget].append(
                    unavailable(
                        stage,
                        impl if stage in ("forward", "moe") else "torch",
                        budget,
                        f"does not fit: needs about {total / 1e9:.1f} GB, "
                        f"{(free + weights_bytes(shape, impl)) / 1e9:.1f} GB free",
                    )
                )
            continue
        tokens = batch * (budget + 1)
        with runner.torch.cuda.stream(runner.torch_stream):
            mask_bits, depth = _trees_mask(trace_path, batch, budget)
            state = TargetShard(
                weights,
                batch=batch,
                budget=budget,
                prefix=prefix,
                attention=attention,
                mask_bits=mask_bits,
                routing=routing,
                skew=skew,
            )
        touched = state.experts_touched
        part_bytes = shape.part_bytes(tokens, touched, _slice_bytes(shape, impl))
        part_flops = shape.part_flops(tokens)
        calls = {"forward": state.forward}
        if parts:
            calls.update({"moe": state.moe_part, "dense": state.dense_part, "lm-head": state.lm_head_part})
        for stage, fn in calls.items():
            row = {**base(stage, impl if stage in ("forward", "moe") else "torch", budget)}
            if stage == "forward":
                row["depth"] = depth
                nbytes = sum(part_bytes.values()) + shape.kv_cache_bytes(batch, prefix + budget + 1)
                flops = sum(part_flops.values())
            else:
                nbytes, flops = part_bytes[stage], part_flops[stage]
            try:
                samples, note = runner.measure(fn)
            except Exception as exc:  # noqa: BLE001 (an impl failing at run time: recorded, the job goes on)
                rows[budget].append(unavailable(stage, row["impl"], budget, _describe(exc), status="failed"))
                continue
            rows[budget].extend(
                _ok_rows(
                    row,
                    samples,
                    flops=flops,
                    nbytes=nbytes,
                    experts_touched=touched if stage in ("forward", "moe") else None,
                    note=note,
                )
            )
        del state, mask_bits
    del weights


def _moe_jobs(
    runner, rows, base, unavailable, budgets, shape, impl, sglang_files, batch, routing, skew, seed
) -> None:
    from ddtree_bench.k26.target import TargetShard, TargetWeights, activation_bytes, layer_expert_bytes  # noqa: PLC0415

    free = runner.free()
    per_set = layer_expert_bytes(shape, impl)
    tokens_max = batch * (max(budgets) + 1)
    # twice the forward's activations: a grouped GEMM impl keeps every route's rows, in float32 for the sum
    room = free * (1 - HEADROOM) - shape.bf16_bytes() - 2 * activation_bytes(shape, tokens_max)
    sets = int(min(shape.moe_layers, room // per_set)) if room > 0 else 0
    if sets < 1:
        for budget in budgets:
            rows[budget].append(
                unavailable(
                    "moe", impl, budget, f"does not fit: one layer's experts need {per_set / 1e9:.1f} GB"
                )
            )
        return
    with runner.torch.cuda.stream(runner.torch_stream):
        weights = TargetWeights(
            shape, moe_impl=impl, sglang_files=sglang_files, moe_only=True, expert_sets=sets, seed=seed
        )
    note_sets = (
        ""
        if sets == shape.moe_layers
        else f"; {sets} distinct expert sets of {per_set / 1e9:.1f} GB cycled over {shape.moe_layers} layers"
    )
    for budget in budgets:
        tokens = batch * (budget + 1)
        with runner.torch.cuda.stream(runner.torch_stream):
            state = TargetShard(weights, batch=batch, budget=budget, prefix=0, routing=routing, skew=skew)
        touched = state.experts_touched
        try:
            samples, note = runner.measure(state.moe_part)
        except Exception as exc:  # noqa: BLE001
            rows[budget].append(unavailable("moe", impl, budget, _describe(exc), status="failed"))
            continue
        moe_bytes = shape.part_bytes(tokens, touched, _slice_bytes(shape, impl))["moe"]
        rows[budget].extend(
            _ok_rows(
                base("moe", impl, budget),
                samples,
                flops=shape.part_flops(tokens)["moe"],
                nbytes=moe_bytes,
                experts_touched=touched,
                note=note + note_sets,
            )
        )
        del state
    del weights
