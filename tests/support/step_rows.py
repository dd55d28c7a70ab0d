"""Synthetic step-stage rows for the step and report tests: stage records (``stage_rows``), the GPU's peaks,
verify attention and tree accept rows, a whole synthetic step summary, tree shapes, and the step goals'
status by target."""

from __future__ import annotations

import pandas as pd

from ddtree_bench.report.step import step_targets
from ddtree_bench.timing.records import stage_frame

GEMM_TFLOPS, COPY_TBPS, FLOOR_S = 800.0, 4.0, 8e-6


def stage_rows(stage, impl, seconds, *, warmup=(), timing="cuda-events", cache="warm", **fields):
    base = {"stage": stage, "impl": impl, "timing": timing, "cache": cache, "status": "ok", "machine": "m"}
    if stage != "peak":
        base.update(distribution="peaked", depth=16)
    base.update(fields)
    rows = [dict(base, phase="warmup", repetition=i, seconds=s) for i, s in enumerate(warmup)]
    rows += [dict(base, phase="timed", repetition=i, seconds=s) for i, s in enumerate(seconds)]
    return rows


def peak_rows(gemm=GEMM_TFLOPS, copy=COPY_TBPS, floor=FLOOR_S):
    flops, nbytes = 2 * 8192**3, 2**30
    return (
        stage_rows("peak", "bf16-gemm", [flops / (gemm * 1e12)] * 3, flops=flops)
        + stage_rows("peak", "device-copy", [nbytes / (copy * 1e12)] * 3, bytes=nbytes)
        + stage_rows("peak", "floor", [floor] * 3)
    )


def attention_rows(impl, budget, batch, prefix, *, tbps, tflops, heads=8, correct=True, slow=1.0):
    """Three calls whose median runs at ``tbps`` TB/s and ``tflops`` TFLOP/s (work chosen to fit), taking
    ``slow`` times the base time of the shape."""
    seconds = 1e-4 * (1 + budget / 64) * batch * slow
    common = dict(budget=budget, batch=batch, prefix=prefix, heads=heads, correct=correct, error=1e-3)
    rows = stage_rows(
        "verify-attention",
        impl,
        [seconds * 0.9, seconds, seconds * 1.1],
        warmup=[seconds * 50],
        flops=tflops * 1e12 * seconds,
        bytes=tbps * 1e12 * seconds,
        **common,
    )
    rows += stage_rows(
        "verify-attention", impl, [seconds * 1.5], cache="cold", flops=1.0, bytes=1.0, **common
    )
    return rows


def accept_rows(budget, batch, *, kernel_s, floor_s=FLOOR_S):
    common = dict(budget=budget, batch=batch, accept_length_mean=3.0, expected_accept_mean=2.5, correct=True)
    return (
        stage_rows("accept", "gpu-kernel", [kernel_s] * 3, **common)
        + stage_rows("accept", "gpu-host-inclusive", [kernel_s * 5] * 3, timing="wall", cache="n/a", **common)
        + stage_rows("accept", "cpu-walk", [kernel_s * 20] * 3, timing="wall", cache="n/a", **common)
        + stage_rows("accept", "floor", [floor_s] * 3, **common)
    )


def synthetic_step(*, fast=True, flex=True, accept_factor=1.5):
    """A machine's step rows: budgets 8 and 64, batch 1 and 64, S 4096 and 32768 (8 heads)."""
    rows = peak_rows()
    for budget in (8, 64):
        for batch in (1, 64):
            for prefix in (4096, 32768):
                rows += attention_rows(
                    "ours", budget, batch, prefix, tbps=3.5 if fast else 2.0, tflops=400 if fast else 100
                )
                if flex:
                    rows += attention_rows(
                        "flexattention", budget, batch, prefix, tbps=1.0, tflops=50, slow=2
                    )
            rows += accept_rows(budget, batch, kernel_s=FLOOR_S * accept_factor)
    rows += [
        {
            "stage": "verify-attention",
            "impl": "sdpa",
            "budget": 64,
            "batch": 64,
            "prefix": 32768,
            "heads": 8,
            "depth": 16,
            "distribution": "peaked",
            "phase": "timed",
            "repetition": 0,
            "timing": "cuda-events",
            "cache": "n/a",
            "status": "unavailable",
            "status_reason": "out of memory at B=64, N=64, S=32768, H=8",
            "machine": "m",
        }
    ]
    return stage_frame(rows)


def shapes_frame():
    return pd.DataFrame(
        [
            {
                "distribution": "peaked",
                "depth": 16,
                "budget": b,
                "topk": b,
                "requests": 4,
                "tree_nodes_mean": float(b),
                "tree_depth": 1,
                "nodes_mean": 1.0,
                "nodes_p10": 1.0,
                "nodes_p90": 1.0,
                "expected_accept_mean": e,
                "expected_accept_p10": e - 0.5,
                "expected_accept_p90": e + 0.5,
            }
            for b, e in ((8, 2.0), (64, 3.5))
        ]
    )


def target_status(step):
    return {target: (status, measured) for target, _, status, measured in step_targets(step)}
