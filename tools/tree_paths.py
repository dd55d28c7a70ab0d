"""Calibrate the gpu builder's path plan (``builders.gpu.PathCosts``) on the GPU at hand: time each kernel
path (warp heap, parallel pool, wide) on the same drafter trace per batch and budget, by CUDA events around
the build with the packed-bit mask (what the in-situ round consumes), check that every path's trees equal
each other's, fit the cost model to the medians and print the fitted constants beside the current ones.

    python tools/tree_paths.py --out results/h200/tree_paths.csv

Timing: ``--repeats`` launches per point after ``--warmup``, each queued behind the spin kernel (the project's
one GPU timer, ``timing.gpu.EventTimer``), warm L2; the empty kernel's time (the floor) is a row of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

PATHS = ("warp-heap", "parallel", "wide")
PER_SM_CHOICES = (1, 2, 4, 8, 16, 32)


def fit_path(rows, sm_count: int, quadratic: bool) -> dict:
    """Least-squares fit of ``waves * (base + per_node N [+ per_pair N^2])`` to one path's (batch, budget,
    microseconds) rows, ``waves = ceil(batch / (per_sm * sm_count))``, with ``per_sm`` the choice of
    ``PER_SM_CHOICES`` of least relative error. Returns base, per_node, per_pair, per_sm and the error."""
    rows = np.asarray(rows, dtype=float)
    if rows.ndim != 2 or rows.shape[1] != 3 or len(rows) < 3:
        raise ValueError("fit_path needs at least three (batch, budget, us) rows")
    batch, budget, us = rows.T
    best = None
    for per_sm in PER_SM_CHOICES:
        waves = np.ceil(batch / (per_sm * sm_count))
        cols = [waves, waves * budget] + ([waves * budget**2] if quadratic else [])
        a = np.stack(cols, axis=1) / us[:, None]  # relative error: divide each row by its time
        coef, *_ = np.linalg.lstsq(a, np.ones_like(us), rcond=None)
        err = float(np.sqrt(np.mean((a @ coef - 1.0) ** 2)))
        if best is None or err < best["error"]:
            best = {
                "base": float(coef[0]),
                "per_node": float(coef[1]),
                "per_pair": float(coef[2]) if quadratic else 0.0,
                "per_sm": per_sm,
                "error": err,
            }
    return best


def fitted_costs(frame, sm_count: int, current):
    """``PathCosts`` with each measured path's constants fitted (``frame``: path, batch, budget, us rows),
    and ``wide_max_batch`` the largest batch at which the wide path was fastest at some budget."""
    fields = {}
    prefixes = {"warp-heap": "warp", "parallel": "pool", "wide": "wide"}
    for path, prefix in prefixes.items():
        sub = frame[frame["path"] == path]
        if len(sub) < 3:
            continue
        fit = fit_path(sub[["batch", "budget", "us"]].to_numpy(), sm_count, quadratic=path == "wide")
        fields.update(
            {f"{prefix}_base": round(fit["base"], 3), f"{prefix}_per_node": round(fit["per_node"], 5)}
        )
        fields[f"{prefix}_per_sm"] = fit["per_sm"]
        if path == "wide":
            fields["wide_per_pair"] = float(f"{fit['per_pair']:.3g}")
    fastest = frame.loc[frame.groupby(["batch", "budget"])["us"].idxmin()]
    wide_wins = fastest.loc[fastest["path"] == "wide", "batch"]
    fields["wide_max_batch"] = int(wide_wins.max()) if len(wide_wins) else 0
    return dataclasses.replace(current, **fields)


def measure(batches, budgets, depth, repeats, warmup):  # pragma: no cover - needs a GPU
    import cupy as cp  # noqa: PLC0415
    import pandas as pd  # noqa: PLC0415

    from ddtree_bench.builders import get_builder  # noqa: PLC0415
    from ddtree_bench.builders.gpu import DeviceTrees, GpuBuilder, plan_launch  # noqa: PLC0415
    from ddtree_bench.timing.gpu import EventTimer  # noqa: PLC0415
    from ddtree_bench.traces import TraceSpec, generate  # noqa: PLC0415
    from ddtree_bench.tree import first_difference  # noqa: PLC0415

    gpu = GpuBuilder()
    reason = gpu.unavailable_reason()
    if reason:
        raise SystemExit(f"tree_paths: {reason}")
    k_ = gpu.kernels
    reference = get_builder("reference")
    trace = generate(TraceSpec("drafter", max(batches), depth, 1024, vocab_size=163840, seed=0), device="cpu")
    stream = cp.cuda.Stream(non_blocking=True)
    timer = EventTimer(stream, k_.spin)
    rows = []
    with stream:
        for batch in batches:
            d_lp = cp.asarray(np.ascontiguousarray(trace.top_log_probs[:batch]), dtype=cp.float32)
            d_ids = cp.asarray(np.ascontiguousarray(trace.top_token_ids[:batch]), dtype=cp.int64)
            for budget in budgets:
                trees = {}
                for path in PATHS:
                    try:
                        plan = plan_launch(batch, depth, 1024, budget, k_.max_shared_bytes, path=path)
                    except ValueError:
                        continue
                    if path == "warp-heap" and plan.path != "warp-heap":
                        continue
                    out = DeviceTrees(batch, budget)

                    def build(plan=plan, out=out, d_lp=d_lp, d_ids=d_ids):
                        gpu.launch(plan, d_lp, d_ids, out, stream=stream, bool_visibility=False)

                    samples = [timer(build) for _ in range(warmup + repeats)][warmup:]
                    gpu.launch(plan, d_lp, d_ids, out, stream=stream, bool_visibility=True)  # for the check
                    stream.synchronize()
                    trees[path] = out.to_host()
                    rows.append(
                        {
                            "path": path,
                            "batch": batch,
                            "budget": budget,
                            "depth": depth,
                            "us": 1e6 * float(np.median(samples)),
                            "p10_us": 1e6 * float(np.percentile(samples, 10)),
                            "p90_us": 1e6 * float(np.percentile(samples, 90)),
                            "n": repeats,
                        }
                    )
                # every path's trees equal the reference's (small batches) or the first path's
                expected = next(iter(trees.values()))
                if batch <= 4:
                    lp, ids = trace.top_log_probs[:batch], trace.top_token_ids[:batch]
                    expected = reference.build(lp, ids, budget)
                for path, tree in trees.items():
                    diff = first_difference(expected, tree)
                    if diff:
                        raise SystemExit(f"tree_paths: {path} at batch {batch}, budget {budget}: {diff}")
        floor = [timer(lambda: k_.empty((1,), (1,), (), stream=stream)) for _ in range(warmup + repeats)]
        rows.append(
            {
                "path": "floor",
                "batch": 1,
                "budget": 0,
                "depth": 0,
                "us": 1e6 * float(np.median(floor[warmup:])),
                "p10_us": 0.0,
                "p90_us": 0.0,
                "n": repeats,
            }
        )
    return pd.DataFrame(rows), k_.sm_count


def main(argv=None) -> int:  # pragma: no cover - needs a GPU
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="CSV of the per-point medians")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64,132,264")
    parser.add_argument("--budgets", default="8,16,32,64,128,256,512,1024")
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    from ddtree_bench.builders.gpu import PATH_COSTS  # noqa: PLC0415

    frame, sm_count = measure(
        [int(b) for b in args.batches.split(",")],
        [int(n) for n in args.budgets.split(",")],
        args.depth,
        args.repeats,
        args.warmup,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False)
    print(frame.pivot_table(index=["batch", "budget"], columns="path", values="us").round(2).to_string())
    print("current:", PATH_COSTS)
    print("fitted: ", fitted_costs(frame[frame["path"] != "floor"], sm_count, PATH_COSTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
