"""Combining the per-job timing rows into one summary per configuration, and the trees' shape.

Statistics are over the timed calls only (warm-up rows are kept in the per-job files but never enter a
statistic): ``n`` calls, their median, 10th and 90th percentiles (numpy's linear interpolation between order
statistics), mean and minimum, for the per-call ``seconds`` and the per-tree ``per_tree_seconds``. A
configuration timed by several jobs (``timing.jobs``: separate processes) pools their calls and records the
spread across jobs (``summary.spread``: the job count, the smallest and largest per-job median). Rows that
say a builder was unavailable (or failed) are carried as rows with ``n = 0`` and the reason.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.acceptance import expected_accepted_tokens, sample_target_tokens
from ddtree_bench.builders import get_builder
from ddtree_bench.io import write_frame, write_json
from ddtree_bench.ops.accept import GpuAccept, accept_cpu
from ddtree_bench.stages.build import COLUMNS, JOB_COLUMN
from ddtree_bench.summary.spread import SPREAD_COLUMNS, job_spread
from ddtree_bench.traces import load_trace

if TYPE_CHECKING:
    import pandas as pd

#: What identifies one configuration in the summary.
KEYS = (
    "machine",
    "builder",
    "label",
    "distribution",
    "depth",
    "budget",
    "topk",
    "input_columns",
    "batch",
    "timing",
    "cache",
    "threads",
    "status",
)

STAT_COLUMNS = (
    "n",
    "median_s",
    "p10_s",
    "p90_s",
    "mean_s",
    "min_s",
    "median_per_tree_s",
    "p10_per_tree_s",
    "p90_per_tree_s",
)

SUMMARY_COLUMNS = (
    *KEYS,
    "status_reason",
    "correct",
    "nodes_mean",
    "device_memory_bytes",
    *STAT_COLUMNS,
    # the spread across timing jobs (summary.spread); absent from older summaries: one job
    *SPREAD_COLUMNS,
    "git_commit",
    "timestamp",
    "trace_sha256",
    # where the builder's code came from (bench.PROVENANCE_COLUMNS; sglang only)
    "builder_source",
    "builder_source_sha256",
    "builder_source_git_commit",
    "builder_workspace",
)


def read_rows(paths) -> pd.DataFrame:
    """All rows of the per-job parquet files ``paths``, concatenated (an empty list gives no rows). Files
    written before there were several timing jobs have no ``job`` column: their rows are job 1."""
    frames = [pd.read_parquet(path) for path in paths]
    frames = [f for f in frames if len(f)]
    for frame in frames:
        if JOB_COLUMN not in frame:
            frame[JOB_COLUMN] = 1
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    return pd.concat(frames, ignore_index=True)


def _stats(seconds: np.ndarray, per_tree: np.ndarray) -> dict:
    if seconds.size == 0:
        return dict.fromkeys(STAT_COLUMNS, np.nan) | {"n": 0}
    p10, p50, p90 = np.percentile(seconds, [10, 50, 90])
    t10, t50, t90 = np.percentile(per_tree, [10, 50, 90])
    return {
        "n": int(seconds.size),
        "median_s": float(p50),
        "p10_s": float(p10),
        "p90_s": float(p90),
        "mean_s": float(seconds.mean()),
        "min_s": float(seconds.min()),
        "median_per_tree_s": float(t50),
        "p10_per_tree_s": float(t10),
        "p90_per_tree_s": float(t90),
    }


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration (``KEYS``) with the statistics of its timed calls (module docstring)."""
    if rows.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    rows = rows.copy()
    for key in KEYS:
        if key not in rows:
            rows[key] = None
    timed = rows[(rows["phase"] == "timed") | (rows["status"] != "ok")]
    out = []
    for key, group in timed.groupby(list(KEYS), dropna=False, sort=True):
        record = dict(zip(KEYS, key, strict=True))
        ok = group[group["status"] == "ok"]
        seconds = ok["seconds"].to_numpy(dtype=np.float64)
        per_tree = ok["per_tree_seconds"].to_numpy(dtype=np.float64)
        # the job of each call (rows from before several jobs: job 1)
        jobs = ok[JOB_COLUMN].fillna(1) if JOB_COLUMN in ok else pd.Series(1, index=ok.index)
        jobs = jobs.to_numpy(dtype=np.int64)
        record.update(_stats(seconds, per_tree))
        record.update(job_spread(seconds, per_tree, jobs))
        reasons = group["status_reason"].dropna().unique() if "status_reason" in group else []
        record["status_reason"] = "; ".join(str(r) for r in reasons) or None
        correct = group["correct"].dropna() if "correct" in group else pd.Series(dtype=bool)
        record["correct"] = bool(correct.all()) if len(correct) else None
        for column in ("nodes_mean", "device_memory_bytes"):
            values = group[column].dropna() if column in group else pd.Series(dtype=float)
            record[column] = float(values.iloc[-1]) if len(values) else np.nan
        for column in ("git_commit", "timestamp", "trace_sha256"):
            values = group[column].dropna() if column in group else pd.Series(dtype=object)
            record[column] = str(values.iloc[-1]) if len(values) else None
        for column in ("builder_source", "builder_source_sha256", "builder_source_git_commit"):
            values = group[column].dropna() if column in group else pd.Series(dtype=object)
            record[column] = str(values.iloc[-1]) if len(values) else None
        values = (
            group["builder_workspace"].dropna() if "builder_workspace" in group else pd.Series(dtype=bool)
        )
        record["builder_workspace"] = bool(values.iloc[-1]) if len(values) else None
        out.append(record)
    summary = pd.DataFrame.from_records(out, columns=list(SUMMARY_COLUMNS))
    for column in ("budget", "batch", "n", "jobs"):
        summary[column] = summary[column].astype("int64")
    for column in ("depth", "topk", "input_columns", "threads"):
        summary[column] = pd.to_numeric(summary[column], errors="coerce").astype("Int64")
    summary["correct"] = summary["correct"].astype("boolean")
    summary["builder_workspace"] = summary["builder_workspace"].astype("boolean")
    return summary


def expected_accept_stats(lp, ids, trees) -> dict:
    """Mean, p10 and p90 over requests of the trees' expected accepted draft tokens (the sum over nodes of
    the path probability under the drafter's distributions: ``acceptance.expected_accepted_tokens``)."""
    values = np.asarray(expected_accepted_tokens(lp, ids, trees), dtype=np.float64)
    p10, p90 = np.percentile(values, [10, 90])
    return {
        "expected_accept_mean": float(values.mean()),
        "expected_accept_p10": float(p10),
        "expected_accept_p90": float(p90),
    }


#: The paper's block 16: trees over the first 15 drafted positions are what its tau per budget measures.
PAPER_DEPTH = 15


def simulated_accept_stats(lp, ids, trees, *, seed: int = 0, gpu: bool = True) -> dict:
    """The realised acceptance when the target's token at every tree position is drawn from the drafter's
    own distribution of that position (``acceptance.sample_target_tokens``: drafter equals target) and the
    tree is walked greedily (``ops.accept.accept_cpu``, SGLang's walk): tokens per round (accepted nodes, the
    root standing for the bonus token) per request, their mean, its standard error, and the histogram of
    tokens per round (``simulated_accept_hist[k]``: rounds that committed ``k`` tokens, k = 0 .. L + 1).
    Where a CUDA device works (and ``gpu``), the GPU accept kernel walks the same draws too and
    ``simulated_gpu_agrees`` records whether its accepted paths, lengths and bonus tokens equal the CPU
    walk's (None: no GPU)."""
    target = sample_target_tokens(lp, ids, trees, seed=int(seed))
    result = accept_cpu(trees, target)
    lengths = np.asarray(result[1], dtype=np.int64)
    agrees = None
    if gpu:
        accept = GpuAccept()
        # CuPy present too: a job that only believes in a GPU (a probe replaced, as the workflow tests do)
        # has nothing to walk it with
        if accept.unavailable_reason() is None and importlib.util.find_spec("cupy") is not None:
            gpu_result = accept.accept(trees, target)
            agrees = all(
                np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(gpu_result, result, strict=True)
            )
    depth = int(lp.shape[1])
    hist = np.bincount(lengths, minlength=depth + 2)[: depth + 2]
    se = float(lengths.std(ddof=1) / np.sqrt(lengths.size)) if lengths.size > 1 else float("nan")
    return {
        "simulated_tau_mean": float(lengths.mean()),
        "simulated_tau_se": se,
        "simulated_accept_hist": [int(v) for v in hist],
        "simulated_gpu_agrees": agrees,
    }


def paper_depth_accept_mean(lp, ids, budget: int) -> float | None:
    """The trees' mean expected tau (1 + expected acceptance) on the first ``PAPER_DEPTH`` positions of
    every request (the paper's block 16), or None for traces with fewer positions."""
    if lp.shape[1] < PAPER_DEPTH:
        return None
    sub_lp = np.ascontiguousarray(lp[:, :PAPER_DEPTH])
    sub_ids = np.ascontiguousarray(ids[:, :PAPER_DEPTH])
    trees = get_builder(catalog.ORACLE).build(sub_lp, sub_ids, budget)
    return float(1.0 + np.mean(expected_accepted_tokens(sub_lp, sub_ids, trees)))


def chain_tau_mean(lp, depth: int | None = None) -> float | None:
    """The top-1 chain's expected tau (DFlash's: ``1 + sum_d prod_{j <= d} p_top1[j]``) over the first
    ``depth`` positions (all by default), averaged over requests; None for traces with fewer positions."""
    depth = lp.shape[1] if depth is None else depth
    if lp.shape[1] < depth:
        return None
    top1 = np.exp(lp[:, :depth, 0].astype(np.float64))
    return float(1.0 + np.cumprod(top1, axis=1).sum(axis=1).mean())


def tree_shape(trace_path, budget: int, *, distribution: str | None = None) -> list[dict]:
    """Nodes per tree depth of ``reference``'s trees for every request of a trace at ``budget``: one record
    per tree depth d (1..L) with the mean, p10 and p90 over requests of the tree's node count at that depth,
    and on every record the trees' expected acceptance (``expected_accept_stats``: what the budget buys).
    (Plain records, no pandas: the workflow runs this once per budget and writes JSON.)"""
    trace = load_trace(trace_path)
    lp, ids = trace.batch()
    trees = get_builder(catalog.ORACLE).build(lp, ids, budget)
    depth = trace.depth
    counts = np.zeros((trees.batch_size, depth + 1), np.int64)
    for request in range(trees.batch_size):
        n = int(trees.node_count[request])
        counts[request] = np.bincount(trees.node_depths[request, :n], minlength=depth + 1)[: depth + 1]
    per_depth = counts[:, 1:]
    p10, p90 = np.percentile(per_depth, [10, 90], axis=0)
    mean = per_depth.mean(axis=0)
    common = {
        "distribution": distribution or str(trace.metadata.get("distribution")),
        "depth": depth,
        "budget": int(budget),
        "topk": min(int(budget), trace.topk),
        "requests": trees.batch_size,
        "tree_nodes_mean": float(trees.node_count.mean()),
        "trace_sha256": trace.sha256,
        **expected_accept_stats(lp, ids, trees),
        **simulated_accept_stats(lp, ids, trees, seed=int(budget)),
        "paper_depth_tau_mean": paper_depth_accept_mean(lp, ids, int(budget)),
        "chain_tau_mean": chain_tau_mean(lp),
        "paper_depth_chain_tau": chain_tau_mean(lp, PAPER_DEPTH),
    }
    return [
        {
            **common,
            "tree_depth": d + 1,
            "nodes_mean": float(mean[d]),
            "nodes_p10": float(p10[d]),
            "nodes_p90": float(p90[d]),
        }
        for d in range(depth)
    ]


SHAPE_ACCEPT_COLUMNS = ("expected_accept_mean", "expected_accept_p10", "expected_accept_p90")
#: The simulated acceptance (``simulated_accept_stats``) and the paper-depth tau, as float columns.
SHAPE_SIMULATED_COLUMNS = (
    "simulated_tau_mean",
    "simulated_tau_se",
    "paper_depth_tau_mean",
    "chain_tau_mean",
    "paper_depth_chain_tau",
)


def combine_shapes(paths) -> pd.DataFrame:
    """The per-budget tree-shape files (JSON records from ``tree_shape``) as one table."""
    records = [record for path in paths for record in json.loads(Path(path).read_text())]
    columns = [
        "distribution",
        "depth",
        "budget",
        "topk",
        "requests",
        "tree_nodes_mean",
        "tree_depth",
        "nodes_mean",
        "nodes_p10",
        "nodes_p90",
        *SHAPE_ACCEPT_COLUMNS,
        "trace_sha256",
        *SHAPE_SIMULATED_COLUMNS,
        "simulated_accept_hist",
        "simulated_gpu_agrees",
    ]
    shapes = pd.DataFrame.from_records(records, columns=columns)
    for column in (*SHAPE_ACCEPT_COLUMNS, *SHAPE_SIMULATED_COLUMNS):  # absent from older records: NaN
        shapes[column] = shapes[column].astype("float64")
    shapes["simulated_gpu_agrees"] = shapes["simulated_gpu_agrees"].astype("boolean")
    return shapes


def aggregate(
    bench_paths, summary_path, *, shape_paths=(), shape_path=None, environment=None, environment_path=None
) -> pd.DataFrame:
    """Summarise the per-job files into ``summary_path`` (parquet); optionally combine the tree-shape files
    into ``shape_path`` and write ``environment`` (a dict) to ``environment_path`` (JSON)."""
    summary = summarize(read_rows(bench_paths))
    write_frame(summary, summary_path)
    if shape_path is not None:
        write_frame(combine_shapes(shape_paths), shape_path)
    if environment_path is not None:
        write_json(environment or {}, environment_path)
    return summary
