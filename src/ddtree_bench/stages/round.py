"""The round, run: ``run_round_stage`` times whole DDTree rounds (``model.round.RoundRunner``) per builder on
one GPU's share of Kimi K2.6, at one (batch, prefix length), for every budget.

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

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.environment import ENVIRONMENT_COLUMNS, collect_environment
from ddtree_bench.k26 import moe as moe_ops
from ddtree_bench.k26.round import FUSED_BUILDERS, ROUND_BUILDERS
from ddtree_bench.k26.shapes import DrafterShape, ModelShape
from ddtree_bench.stages.draft import draft_block
from ddtree_bench.stages.model import HEADROOM, _describe, gpu_reason
from ddtree_bench.timing.policy import TimingPolicy
from ddtree_bench.timing.records import stage_frame, unavailable_row

ROUND_TIMINGS = ("wall", "sum-of-parts")


def run_round_stage(
    *,
    batch: int,
    prefix: int,
    budgets,
    builders,
    builder_options: dict,
    shape: ModelShape,
    drafter_shape: DrafterShape,
    forward_impl: str,
    block_size: int,
    follow_budget: bool,
    topk: int,
    routing: str,
    skew: float,
    sglang_files,
    timing: dict,
    machine: str | None,
    attention_fatbin=None,
    accept_fatbin=None,
    seed: int = 0,
    stacks: dict | None = None,
) -> dict[int, pd.DataFrame]:
    """Whole rounds per builder (module docstring), then, where ``stacks`` names some (``{"stacks": names,
    "max_seconds": limit, "attention_files": SGLang's Triton attention files}``), per stack
    (``run_stack_rounds``) in the same job, on the same weights."""
    budgets = [int(b) for b in budgets]
    builders = list(builders)
    unknown = [b for b in builders if b not in ROUND_BUILDERS]
    if unknown:
        raise ValueError(f"round: unknown builder {unknown[0]!r}; expected one of {list(ROUND_BUILDERS)}")
    policy = TimingPolicy(**timing)
    env = collect_environment(machine)

    def base(builder, budget, timing_name):
        fused = builder in FUSED_BUILDERS
        return {
            **{key: env.get(key) for key in ENVIRONMENT_COLUMNS},
            "stage": "round",
            "impl": builder,
            "batch": batch,
            "budget": budget,
            "heads": shape.local_heads,
            "prefix": prefix,
            "tokens": batch * (budget + 1),
            "timing": timing_name,
            "cache": "n/a",
            "clock": "time.perf_counter_ns",
            "note": "one CUDA graph" if fused else "split: draft graph, host build, verify graph",
        }

    def unavailable(builder, budget, reason, status="unavailable"):
        return unavailable_row(base(builder, budget, "wall"), reason, status)

    rows: dict[int, list[dict]] = {budget: [] for budget in budgets}
    stack_names = list(stacks["stacks"]) if stacks else []

    def unavailable_all(budget, reason):
        return [unavailable(builder, budget, reason) for builder in builders] + [
            {**unavailable(name, budget, reason), "stage": "stack", "note": None} for name in stack_names
        ]

    reason = gpu_reason() or moe_ops.moe_unavailable_reason(forward_impl, sglang_files)
    if reason is not None:
        for budget in budgets:
            rows[budget] += unavailable_all(budget, reason)
        return {budget: stage_frame(r) for budget, r in rows.items()}

    import torch  # noqa: PLC0415

    from ddtree_bench.k26.draft import draft_bytes  # noqa: PLC0415
    from ddtree_bench.k26.round import RoundRunner  # noqa: PLC0415
    from ddtree_bench.k26.target import TargetWeights, state_bytes, weights_bytes  # noqa: PLC0415
    from ddtree_bench.ops.accept import GpuAccept  # noqa: PLC0415
    from ddtree_bench.ops.attention import VerifyAttention  # noqa: PLC0415

    torch.cuda.empty_cache()
    free = float(torch.cuda.mem_get_info()[0])
    need = weights_bytes(shape, forward_impl)
    if need > free * (1 - HEADROOM):
        for budget in budgets:
            rows[budget] += unavailable_all(
                budget, f"does not fit: needs about {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
            )
        return {budget: stage_frame(r) for budget, r in rows.items()}
    weights = TargetWeights(shape, moe_impl=forward_impl, sglang_files=sglang_files, seed=seed)
    attention = VerifyAttention(attention_fatbin)
    accept = GpuAccept(accept_fatbin)
    clock = time.perf_counter_ns
    inputs = {
        "batch": batch,
        "prefix": prefix,
        "block_size": block_size,
        "follow_budget": follow_budget,
        "topk": topk,
        "attention": attention,
        "accept": accept,
        "routing": routing,
        "skew": skew,
        "seed": seed,
    }
    if stacks and stacks.get("stacks"):
        stack_rows = run_stack_rounds(
            weights,
            drafter_shape,
            budgets=budgets,
            inputs=inputs,
            stacks=stacks,
            sglang_builder=builder_options.get(catalog.SGLANG, {}),
            policy=policy,
            base=lambda stack, budget, timing_name: {
                **base(stack, budget, timing_name),
                "stage": "stack",
                "depth": draft_block(budget, block_size, topk, follow_budget)[0] - 1,  # the trees' L
                "note": None,
            },
        )
        for budget in budgets:
            rows[budget] += stack_rows[budget]
    for budget in budgets:
        for builder in builders:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            free = float(torch.cuda.mem_get_info()[0])
            needed = state_bytes(shape, batch, budget, prefix) + draft_bytes(
                drafter_shape, batch, budget + 1 if follow_budget else block_size, prefix, shape.vocab_shard
            )
            if needed > free * (1 - HEADROOM):
                total = needed + need
                rows[budget].append(
                    unavailable(
                        builder,
                        budget,
                        f"does not fit: needs about {total / 1e9:.1f} GB, {(free + need) / 1e9:.1f} GB free",
                    )
                )
                continue
            try:
                runner = RoundRunner(
                    weights,
                    drafter_shape,
                    builder=builder,
                    builder_options=builder_options.get(builder),
                    batch=batch,
                    budget=budget,
                    prefix=prefix,
                    block_size=block_size,
                    follow_budget=follow_budget,
                    topk=topk,
                    attention=attention,
                    accept=accept,
                    routing=routing,
                    skew=skew,
                    seed=seed,
                )
                runner.capture()
                parts = runner.parts()

                def whole(runner=runner):
                    t0 = clock()
                    runner.run_round()
                    return (clock() - t0) / 1e9

                def summed(parts=parts):
                    total = 0.0
                    for part in parts.values():
                        t0 = clock()
                        part()
                        torch.cuda.current_stream().synchronize()
                        total += (clock() - t0) / 1e9
                    return total

                samples = {"wall": [], "sum-of-parts": []}

                def both(samples=samples, whole=whole, summed=summed):
                    samples["wall"].append(whole())
                    samples["sum-of-parts"].append(summed())
                    return samples["wall"][-1] + samples["sum-of-parts"][-1]

                calls = policy.samples(both)  # the round and its parts in turn, call by call
                samples = {
                    name: [(phase, rep, v) for (phase, rep, _), v in zip(calls, values, strict=True)]
                    for name, values in samples.items()
                }
                runner.run_round()
                correct = runner.check_accept()
                note = runner.note
            except Exception as exc:  # noqa: BLE001 (a builder failing: recorded, the others still run)
                rows[budget].append(unavailable(builder, budget, _describe(exc), status="failed"))
                continue
            rows[budget] += timed_rows(
                lambda t, b=builder, n=budget: base(b, n, t),
                samples,
                correct=correct,
                note=note,
                experts_touched=runner.target.experts_touched,
            )
            del runner, parts
    return {budget: stage_frame(r) for budget, r in rows.items()}


def _stack_fits(torch, shape, drafter_shape, inputs: dict, budget: int, need: float) -> str | None:
    from ddtree_bench.k26.draft import draft_bytes  # noqa: PLC0415
    from ddtree_bench.k26.target import state_bytes  # noqa: PLC0415

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free = float(torch.cuda.mem_get_info()[0])
    batch, prefix = inputs["batch"], inputs["prefix"]
    block = budget + 1 if inputs["follow_budget"] else inputs["block_size"]
    # the round's state plus SGLang's mask (q x (S + q) bools a request) and FA3's scratch
    needed = (
        state_bytes(shape, batch, budget, prefix)
        + draft_bytes(drafter_shape, batch, block, prefix, shape.vocab_shard)
        + batch * (budget + 1) * (prefix + budget + 1)
        + 2 * batch * (budget + 1) * shape.local_heads * 512 * 4 * 2
    )
    if needed > free * (1 - HEADROOM):
        return f"does not fit: needs about {(needed + need) / 1e9:.1f} GB, {(free + need) / 1e9:.1f} GB free"
    return None


def run_stack_rounds(
    weights, drafter_shape, *, budgets, inputs: dict, stacks: dict, sglang_builder: dict, policy, base
) -> dict[int, list[dict]]:
    """Per budget and stack (``catalog.STACKS``): whole rounds (``model.stack.StackRound``) timed as
    ``wall`` (one round, host-inclusive) and its parts (``part-draft`` ... ``part-accept``, each waited for,
    and their ``sum-of-parts``), call by call; ``correct``: the accepted paths equal the CPU walk. A stack
    whose forward or round exceeds ``stacks["max_seconds"]`` gets a row saying so, untimed."""
    import torch  # noqa: PLC0415

    from ddtree_bench.k26.stack import StackRound  # noqa: PLC0415
    from ddtree_bench.k26.target import weights_bytes  # noqa: PLC0415

    names = list(stacks["stacks"])
    sglang = {
        "builder": dict(sglang_builder),
        "accept": sglang_builder.get("source"),
        "attention_files": stacks.get("attention_files"),
    }
    clock = time.perf_counter_ns
    need = weights_bytes(weights.shape, weights.moe_impl)
    rows: dict[int, list[dict]] = {budget: [] for budget in budgets}
    for budget in budgets:
        reason = _stack_fits(torch, weights.shape, drafter_shape, inputs, budget, need)
        if reason is not None:
            rows[budget] += [unavailable_row(base(n, budget, "wall"), reason) for n in names]
            continue
        try:
            runner = StackRound(
                weights,
                drafter_shape,
                stacks=names,
                sglang=sglang,
                max_seconds=stacks["max_seconds"],
                budget=budget,
                **inputs,
            )
            runner.capture()
        except Exception as exc:  # noqa: BLE001 (every stack of this budget: recorded)
            rows[budget] += [
                unavailable_row(base(n, budget, "wall"), _describe(exc), "failed") for n in names
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
        return [unavailable_row(base("wall"), _describe(exc), status="failed")]
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
