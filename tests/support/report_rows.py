"""Synthetic tree-build rows and machines for the report tests: timing rows of one builder (``rows_for``), a
summary of a few builders (``synthetic_summary``) and a results folder of one machine (``write_machine``)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from ddtree_bench.stages.build import frame, unavailable_frame
from ddtree_bench.summary.build import summarize


def rows_for(
    builder,
    seconds,
    *,
    warmup=(),
    batch=2,
    budget=8,
    machine="m",
    distribution="uniform",
    depth=16,
    timing="wall",
    cache="n/a",
):
    base = dict(
        builder=builder,
        label=builder,
        budget=budget,
        batch=batch,
        depth=depth,
        topk=budget,
        distribution=distribution,
        timing=timing,
        cache=cache,
        status="ok",
        status_reason=None,
        correct=True,
        nodes_mean=float(budget),
        device_memory_bytes=np.nan,
        threads=1,
        machine=machine,
    )
    rows = [
        dict(base, phase="warmup", repetition=i, seconds=s, per_tree_seconds=s / batch)
        for i, s in enumerate(warmup)
    ]
    rows += [
        dict(base, phase="timed", repetition=i, seconds=s, per_tree_seconds=s / batch)
        for i, s in enumerate(seconds)
    ]
    return frame(rows)


def synthetic_summary(machine, *, sglang=False, native_speedup=100.0, gpu=False):
    frames = []
    for budget in (8, 64):
        for batch in (1, 64):
            ref = 1e-4 * budget * batch
            frames.append(
                rows_for(
                    "reference",
                    [ref * f for f in (0.9, 1.0, 1.1)],
                    budget=budget,
                    batch=batch,
                    machine=machine,
                )
            )
            frames.append(
                rows_for(
                    "native",
                    [ref / native_speedup * f for f in (0.9, 1.0, 1.1)],
                    budget=budget,
                    batch=batch,
                    machine=machine,
                )
            )
            if sglang:
                frames.append(rows_for("sglang", [ref * 1.1], budget=budget, batch=batch, machine=machine))
            if gpu:
                frames.append(
                    rows_for(
                        "gpu",
                        [2e-5],
                        budget=budget,
                        batch=batch,
                        machine=machine,
                        timing="kernel-events",
                        cache="warm",
                    )
                )
                frames.append(
                    rows_for(
                        "gpu",
                        [1e-5],
                        budget=budget,
                        batch=batch,
                        machine=machine,
                        timing="floor",
                        cache="warm",
                    )
                )
    if not sglang:
        frames.append(unavailable_frame("sglang", "SGLang has no DDTree module", machine=machine))
    if not gpu:
        frames.append(unavailable_frame("gpu", "no CUDA device", machine=machine))
    return summarize(pd.concat(frames, ignore_index=True))


def write_machine(folder, machine, **kwargs):
    folder.mkdir(parents=True, exist_ok=True)
    synthetic_summary(machine, **kwargs).to_parquet(folder / "summary.parquet")
    shapes = [
        {
            "distribution": d,
            "depth": 16,
            "budget": b,
            "topk": b,
            "requests": 4,
            "tree_nodes_mean": b,
            "tree_depth": t,
            "nodes_mean": b / 16,
            "nodes_p10": 1.0,
            "nodes_p90": 2.0,
        }
        for d in ("uniform", "bf16")
        for b in (8, 64)
        for t in range(1, 17)
    ]
    pd.DataFrame(shapes).to_parquet(folder / "tree_shape.parquet")
    environment = {
        "machine": machine,
        "cpu_model": "Test CPU",
        "cpu_count": 2,
        "gpu_name": None,
        "config": {"builders": ["sglang", "reference", "native", "gpu"]},
        "builds": {},
        "nvcc": None,
    }
    (folder / "environment.json").write_text(json.dumps(environment))
    return folder / "summary.parquet"
