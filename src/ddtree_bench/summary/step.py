"""The decode step around the tree build: summarising the step stages' rows (``timing.records``) and the
step-time breakdown the report shows.

``summarize_steps(rows)`` gives one row per step configuration (``STEP_KEYS``: stage, impl, batch, budget,
heads, prefix length, depth, distribution, timing, cache, status) with the median, p10, p90 (numpy's linear
interpolation), mean, minimum and count of its timed calls (warm-up rows never enter a statistic); for rows
with work (``flops``, ``bytes``: the verify attention, the peaks) the median of the per-call rates in TFLOP/s
and TB/s; for the verify attention those rates as a percentage of the GPU's measured peaks (bf16 GEMM for
TFLOP/s, device copy for TB/s, from the same machine's ``peak`` rows; the peaks themselves are on every row:
``peak_gemm_tflops``, ``peak_copy_tbps``, ``peak_floor_s``). Rows saying an impl could not run carry their
status and reason with ``n = 0``.

``step_breakdown(...)`` puts, per (prefix length, heads, batch, budget), the tree build of every builder (from
``summary.parquet``) beside the verify attention of every layer (our kernel's per-layer median times the
layers) and the tree accept (the GPU kernel), and the build's share of their sum. What it leaves out is
``LEFT_OUT``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.io import write_frame
from ddtree_bench.stages.peaks import peak_rates as rates
from ddtree_bench.timing.records import stage_frame

STEP_KEYS = (
    "machine",
    "stage",
    "impl",
    "distribution",
    "depth",
    "budget",
    "batch",
    "heads",
    "prefix",
    "timing",
    "cache",
    "status",
)
STEP_STAT_COLUMNS = ("n", "median_s", "p10_s", "p90_s", "mean_s", "min_s")
STEP_SUMMARY_COLUMNS = (
    *STEP_KEYS,
    "status_reason",
    "correct",
    "error_max",
    "mask",
    *STEP_STAT_COLUMNS,
    "flops",
    "bytes",
    "median_tflops",
    "median_tbps",
    "pct_gemm_peak",
    "pct_copy_peak",
    "accept_length_mean",
    "expected_accept_mean",
    "tokens",
    "experts_touched",
    "world_size",
    "launches",
    "note",
    "peak_gemm_tflops",
    "peak_copy_tbps",
    "peak_floor_s",
    "git_commit",
    "timestamp",
    "trace_sha256",
)
PEAK_KEYS = ("gemm_tflops", "copy_tbps", "floor_seconds")

#: What the breakdown leaves out, said wherever it is shown.
LEFT_OUT = (
    "The breakdown is not the whole decode step. It leaves out the drafter's forward pass (the DFlash "
    "block), the MoE and dense MLP layers and everything else in the target's layers besides the "
    "attention core (the q/kv projections, RoPE, the output projection, norms), the LM head over the "
    "163840-token vocabulary and sampling, KV-cache writes, communication between GPUs and host-side "
    "scheduling. The real step is longer, so the tree build's share of it is smaller than the share shown."
)

#: The tree builds the breakdown shows: (builder, timing, cache states, label), from ``summary.parquet``.
BUILD_SERIES = tuple(
    (b.name, s.timing, s.caches, s.step) for b in catalog.BUILDERS.values() for s in b.series if s.step
)
#: The in-situ builds (``stages.insitu``: from the drafter's top-K on the GPU to the padded tree on the GPU,
#: the copies each builder needs included): where a builder has them, the breakdown shows them instead.
IN_SITU_BUILD_SERIES = tuple(
    (b.name, s.timing, s.caches, s.step) for b in catalog.BUILDERS.values() for s in b.in_situ if s.step
)
#: Every build label the breakdown may show, in its order.
BUILD_LABELS = tuple(label for *_, label in IN_SITU_BUILD_SERIES + BUILD_SERIES)
#: The timing kinds of a step row, best first: device time of warm calls where there is one.
TIMING_PREFERENCE = (
    ("cuda-graph", "warm"),
    ("cuda-events", "warm"),
    ("cuda-events", "n/a"),
    ("wall", "n/a"),
    ("wall", "warm"),
    ("cuda-graph", "cold"),
    ("cuda-events", "cold"),
    ("wall", "cold"),
)


# ----------------------------------------------------------------------------------------------- records


def read_stage_rows(paths) -> pd.DataFrame:
    """All rows of the step jobs' parquet files ``paths`` (an empty list gives no rows, with the columns)."""
    frames = [pd.read_parquet(path) for path in paths]
    frames = [f for f in frames if len(f)]
    if not frames:
        return stage_frame([])
    return pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------------------------- peaks


def peak_rates(rows: pd.DataFrame) -> dict:
    """``stages.peaks.peak_rates`` of the ``peak`` rows among ``rows`` (the medians over timed calls of the
    GEMM's TFLOP/s, the copy's TB/s and the empty kernel's seconds); every key None where no peak ran."""
    rows = rows[rows["stage"] == "peak"]
    if not (rows["status"] == "ok").any():
        return dict.fromkeys(PEAK_KEYS)
    found = rates(rows.reset_index(drop=True))
    return {key: (None if found.get(key) is None else float(found[key])) for key in PEAK_KEYS}


# ----------------------------------------------------------------------------------------------- summary


def _rate(work: pd.Series, seconds: pd.Series) -> float:
    ok = work.notna() & seconds.notna() & (seconds > 0)
    if not ok.any():
        return math.nan
    return float(np.median(work[ok].to_numpy(np.float64) / seconds[ok].to_numpy(np.float64)) / 1e12)


def _last(group: pd.DataFrame, column: str, kind=float):
    values = group[column].dropna() if column in group else pd.Series(dtype=object)
    if not len(values):
        return math.nan if kind is float else None
    return kind(values.iloc[-1])


def summarize_steps(rows: pd.DataFrame, peaks: dict | None = None) -> pd.DataFrame:
    """One row per step configuration (``STEP_KEYS``) with its statistics (module docstring). ``peaks``:
    per machine, the peaks (``PEAK_KEYS``) where ``rows`` hold none of their own (a later run's rows merged
    into a summary: ``merge_step_summary``)."""
    if rows.empty:
        return _typed(pd.DataFrame(columns=list(STEP_SUMMARY_COLUMNS)))
    rows = rows.copy()
    for key in STEP_KEYS:
        if key not in rows:
            rows[key] = None
    given = peaks or {}
    peaks = {machine: peak_rates(group) for machine, group in rows.groupby("machine", dropna=False)}
    for machine, found in peaks.items():
        if all(value is None for value in found.values()) and machine in given:
            peaks[machine] = given[machine]
    selected = rows[(rows["phase"] == "timed") | (rows["status"] != "ok")]
    out = []
    for key, group in selected.groupby(list(STEP_KEYS), dropna=False, sort=True):
        record = dict(zip(STEP_KEYS, key, strict=True))
        ok = group[(group["status"] == "ok") & group["seconds"].notna()]
        seconds = ok["seconds"].to_numpy(np.float64)
        if seconds.size:
            p10, p50, p90 = np.percentile(seconds, [10, 50, 90])
            record.update(
                n=int(seconds.size),
                median_s=float(p50),
                p10_s=float(p10),
                p90_s=float(p90),
                mean_s=float(seconds.mean()),
                min_s=float(seconds.min()),
            )
        else:
            record.update(dict.fromkeys(STEP_STAT_COLUMNS, math.nan), n=0)
        reasons = group["status_reason"].dropna().unique()
        record["status_reason"] = "; ".join(str(r) for r in reasons) or None
        correct = group["correct"].dropna()
        record["correct"] = bool(correct.all()) if len(correct) else None
        errors = group["error"].dropna()
        record["error_max"] = float(errors.max()) if len(errors) else math.nan
        record["mask"] = _last(group, "mask", str)  # the mask the attention impl applies (null elsewhere)
        record["flops"] = _last(ok, "flops")
        record["bytes"] = _last(ok, "bytes")
        record["median_tflops"] = _rate(ok["flops"], ok["seconds"])
        record["median_tbps"] = _rate(ok["bytes"], ok["seconds"])
        for column in ("accept_length_mean", "expected_accept_mean", "experts_touched"):
            values = group[column].dropna() if column in group else group.iloc[:0]
            record[column] = float(values.mean()) if len(values) else math.nan
        for column in ("tokens", "world_size", "launches"):
            record[column] = _last(group, column)
        record["note"] = _last(group, "note", str)
        machine_peaks = peaks.get(record["machine"]) or dict.fromkeys(PEAK_KEYS)
        record["peak_gemm_tflops"] = _nan(machine_peaks["gemm_tflops"])
        record["peak_copy_tbps"] = _nan(machine_peaks["copy_tbps"])
        record["peak_floor_s"] = _nan(machine_peaks["floor_seconds"])
        # the share of the peaks: the verify attention, and the rest of the round's parts (weights read)
        attention = record["stage"] in ("verify-attention", "forward", "moe", "dense", "lm-head", "draft")
        record["pct_gemm_peak"] = (
            _pct(record["median_tflops"], record["peak_gemm_tflops"]) if attention else math.nan
        )
        record["pct_copy_peak"] = (
            _pct(record["median_tbps"], record["peak_copy_tbps"]) if attention else math.nan
        )
        record["git_commit"] = _last(group, "git_commit", str)
        record["timestamp"] = _last(group, "timestamp", str)
        record["trace_sha256"] = _last(group, "trace_sha256", str)
        out.append(record)
    return _typed(pd.DataFrame.from_records(out, columns=list(STEP_SUMMARY_COLUMNS)))


def _nan(value) -> float:
    return math.nan if value is None else float(value)


def _pct(rate: float, peak: float) -> float:
    if math.isnan(rate) or math.isnan(peak) or peak <= 0:
        return math.nan
    return 100.0 * rate / peak


def _typed(summary: pd.DataFrame) -> pd.DataFrame:
    for column in ("budget", "batch", "n"):
        summary[column] = pd.to_numeric(summary[column]).fillna(0).astype("int64")
    for column in ("depth", "heads", "prefix"):
        summary[column] = pd.to_numeric(summary[column], errors="coerce").astype("Int64")
    for column in STEP_SUMMARY_COLUMNS:
        if column not in (
            *STEP_KEYS,
            "status_reason",
            "correct",
            "mask",
            "git_commit",
            "timestamp",
            "trace_sha256",
            "note",
            "n",
        ):
            summary[column] = pd.to_numeric(summary[column], errors="coerce").astype("float64")
    for column in (
        "machine",
        "stage",
        "impl",
        "distribution",
        "timing",
        "cache",
        "status",
        "status_reason",
        "mask",
        "git_commit",
        "timestamp",
        "trace_sha256",
        "note",
    ):
        summary[column] = summary[column].astype("object")
    summary["correct"] = summary["correct"].astype("boolean")
    return summary


def merge_step_summary(summary_path, paths) -> pd.DataFrame:
    """A later run's step files ``paths`` summarised into the summary at ``summary_path``: their rows replace
    the summary's rows of the same configuration (``STEP_KEYS``), the others stay; their percentages of peak
    use the summary's peaks of the same machine where the new rows measured none. Writes and returns it."""
    summary = pd.read_parquet(summary_path)
    peaks = {}
    for machine, group in summary.groupby("machine", dropna=False):
        first = group.iloc[0]
        peaks[machine] = {
            "gemm_tflops": None if pd.isna(first["peak_gemm_tflops"]) else float(first["peak_gemm_tflops"]),
            "copy_tbps": None if pd.isna(first["peak_copy_tbps"]) else float(first["peak_copy_tbps"]),
            "floor_seconds": None if pd.isna(first["peak_floor_s"]) else float(first["peak_floor_s"]),
        }
    new = summarize_steps(read_stage_rows(paths), peaks)
    keys = list(STEP_KEYS)
    replaced = summary.merge(new[keys].drop_duplicates(), on=keys, how="left", indicator=True)["_merge"]
    kept = summary[(replaced == "left_only").to_numpy()]
    merged = _typed(pd.concat([kept, new], ignore_index=True).reindex(columns=list(STEP_SUMMARY_COLUMNS)))
    write_frame(merged, Path(summary_path))
    return merged


def aggregate_steps(paths, summary_path) -> pd.DataFrame:
    """Summarise the step jobs' files ``paths`` into ``summary_path`` (parquet)."""
    summary = summarize_steps(read_stage_rows(paths))
    write_frame(summary, Path(summary_path))
    return summary


# ----------------------------------------------------------------------------------------------- breakdown


def preferred(step: pd.DataFrame) -> pd.DataFrame:
    """Measured step rows (status ok, n > 0), one per configuration: the best timing kind of
    ``TIMING_PREFERENCE`` that configuration has (warm device time first)."""
    if step.empty:
        return step
    ok = step[(step["status"] == "ok") & (step["n"] > 0)].copy()
    rank = {kind: i for i, kind in enumerate(TIMING_PREFERENCE)}
    ok["_rank"] = [rank.get((t, c), len(rank)) for t, c in zip(ok["timing"], ok["cache"], strict=True)]
    keys = ["machine", "stage", "impl", "distribution", "depth", "budget", "batch", "heads", "prefix"]
    ok = ok.sort_values("_rank", kind="stable").drop_duplicates(keys, keep="first")
    return ok.drop(columns="_rank").sort_values(keys[1:], kind="stable").reset_index(drop=True)


def expected_acceptance(shapes: pd.DataFrame, depth=None, distribution=None) -> pd.DataFrame:
    """Per budget: the expected accepted draft tokens of reference's trees (mean, p10, p90 over requests)
    and the mean node count, at ``depth`` and ``distribution`` (all where None). Empty where the shapes lack
    it."""
    columns = [
        "distribution",
        "depth",
        "budget",
        "tree_nodes_mean",
        "expected_accept_mean",
        "expected_accept_p10",
        "expected_accept_p90",
    ]
    if shapes is None or shapes.empty or "expected_accept_mean" not in shapes:
        return pd.DataFrame(columns=columns)
    sel = shapes
    if depth is not None:
        sel = sel[sel["depth"] == depth]
    if distribution is not None:
        sel = sel[sel["distribution"] == distribution]
    sel = sel.drop_duplicates(["distribution", "depth", "budget"])[columns]
    sel = sel[sel["expected_accept_mean"].notna()]
    return sel.sort_values(["distribution", "depth", "budget"]).reset_index(drop=True)


_BREAKDOWN_COLUMNS = (
    "prefix",
    "heads",
    "batch",
    "budget",
    "builder",
    "build_s",
    "attention_layer_s",
    "attention_s",
    "accept_s",
    "total_s",
    "share",
    "expected_accept_mean",
)


def step_breakdown(
    summary: pd.DataFrame,
    step: pd.DataFrame,
    shapes: pd.DataFrame | None = None,
    *,
    layers: int,
    depth=None,
    distribution=None,
) -> pd.DataFrame:
    """One row per (prefix, heads, batch, budget, builder): ``build_s`` (the builder's median per call,
    from ``summary``), ``attention_layer_s`` (our verify attention per layer), ``attention_s`` (times
    ``layers``), ``accept_s`` (the GPU accept kernel), ``total_s`` (their sum; NaN where one is missing),
    ``share`` (build / total), and ``expected_accept_mean`` of the budget's trees (the accept job's, i.e. the
    first ``batch`` requests' trees; else the tree-shape table's mean over all requests). ``depth`` and
    ``distribution``: the step's trees (default: the first in the step rows)."""
    columns = list(_BREAKDOWN_COLUMNS)
    measured = preferred(step) if step is not None else pd.DataFrame()
    if measured.empty:
        return pd.DataFrame(columns=columns)
    if depth is None and measured["depth"].notna().any():
        depth = int(measured["depth"].dropna().iloc[0])
    if distribution is None and measured["distribution"].notna().any():
        distribution = str(measured["distribution"].dropna().iloc[0])
    measured = measured[(measured["depth"] == depth) & (measured["distribution"] == distribution)]
    attention = measured[(measured["stage"] == "verify-attention") & (measured["impl"] == catalog.OURS)]
    accept = measured[(measured["stage"] == "accept") & (measured["impl"] == "gpu-kernel")]
    attention = attention[["prefix", "heads", "batch", "budget", "median_s"]].rename(
        columns={"median_s": "attention_layer_s"}
    )
    # the accept job's trees are exactly this (batch, budget)'s: its expected acceptance comes first
    accept = accept[["batch", "budget", "median_s", "expected_accept_mean"]].rename(
        columns={"median_s": "accept_s", "expected_accept_mean": "accept_expected"}
    )
    grid = attention[["prefix", "heads", "batch", "budget"]].drop_duplicates()
    if grid.empty:
        return pd.DataFrame(columns=columns)
    build = _breakdown_builds(summary, depth, distribution)
    present = [label for label in BUILD_LABELS if label in set(build["builder"])]
    rows = grid.merge(pd.DataFrame({"builder": present or [None]}), how="cross")
    rows = rows.merge(build, on=["batch", "budget", "builder"], how="left")
    rows = rows.merge(attention, on=["prefix", "heads", "batch", "budget"], how="left")
    rows = rows.merge(accept, on=["batch", "budget"], how="left")
    rows["attention_s"] = rows["attention_layer_s"] * int(layers)
    rows["total_s"] = rows[["build_s", "attention_s", "accept_s"]].astype("float64").sum(axis=1, min_count=3)
    rows["share"] = rows["build_s"].astype("float64") / rows["total_s"]
    accepts = expected_acceptance(shapes, depth, distribution)
    rows = rows.merge(accepts[["budget", "expected_accept_mean"]], on="budget", how="left")
    rows["expected_accept_mean"] = (
        rows["accept_expected"].astype("float64").fillna(rows["expected_accept_mean"].astype("float64"))
    )
    order = {label: i for i, label in enumerate(BUILD_LABELS)}
    rows["_order"] = rows["builder"].map(order)
    rows = rows.sort_values(["prefix", "heads", "batch", "budget", "_order"]).drop(columns="_order")
    for column in columns[columns.index("build_s") :]:  # every measured column
        rows[column] = rows[column].astype("float64")
    return rows[columns].reset_index(drop=True)


def _breakdown_builds(summary: pd.DataFrame | None, depth, distribution) -> pd.DataFrame:
    """(batch, budget, build_s, builder): each builder's fastest median per call at ``depth`` and
    ``distribution``, labelled by its series (``BUILD_LABELS``): its in-situ timing where measured, else
    its own (``BUILD_SERIES``)."""
    builds = []
    if summary is not None and not summary.empty:
        ok = summary[
            (summary["status"] == "ok")
            & (summary["n"] > 0)
            & (summary["depth"] == depth)
            & (summary["distribution"] == distribution)
        ]
        in_situ = set(ok.loc[ok["timing"] == catalog.IN_SITU, "builder"])  # prefer in-situ where measured
        chosen = [x for x in IN_SITU_BUILD_SERIES if x[0] in in_situ]
        chosen += [x for x in BUILD_SERIES if x[0] not in in_situ]
        for builder, timing, caches, label in chosen:
            sel = ok[(ok["builder"] == builder) & (ok["timing"] == timing) & ok["cache"].isin(caches)]
            if len(sel):
                sel = sel.groupby(["batch", "budget"], as_index=False)["median_s"].min()
                builds.append(sel.assign(builder=label).rename(columns={"median_s": "build_s"}))
    if not builds:
        return pd.DataFrame(columns=["batch", "budget", "build_s", "builder"])
    return pd.concat(builds, ignore_index=True)
