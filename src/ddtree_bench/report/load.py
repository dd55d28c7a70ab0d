"""The machines side by side: each machine's summaries (parquet, json) loaded once, the timing rows named by
series, the baseline of each machine and the speedups over it, and the row selections the tables, figures and
goals share."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ddtree_bench.catalog import BASELINE, IN_SITU, REFERENCE, SGLANG
from ddtree_bench.report.fmt import regime
from ddtree_bench.report.names import BASELINE_NAMES, IN_SITU_TIMINGS, SERIES_NAMES
from ddtree_bench.summary.spread import SPREAD_COLUMNS, ratio_ranges

# ----------------------------------------------------------------------------------------- loading


@dataclass
class Machine:
    label: str
    source: str  # "this run" or "published"
    summary: pd.DataFrame
    shapes: pd.DataFrame
    environment: dict
    #: the step summary (step.summarize_steps); empty where the machine has none
    step: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: why ``step`` is empty (for the "no data" cells)
    step_missing: str = "no step data"


def read_json(path) -> dict:
    path = Path(path)
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def read_parquet(path) -> pd.DataFrame:
    path = Path(path)
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame()


def load_machine(
    summary_path, shapes_path=None, environment_path=None, step_path=None, *, source="this run"
) -> Machine:
    """A machine's results: ``summary.parquet`` and, beside it unless given, ``tree_shape.parquet``,
    ``environment.json`` and ``step_summary.parquet`` (each optional; a published run of the step stages
    alone has no ``summary.parquet``: no tree-build rows)."""
    summary_path = Path(summary_path)
    folder = summary_path.parent
    summary = read_parquet(summary_path)
    shapes = read_parquet(shapes_path or folder / "tree_shape.parquet")
    environment = read_json(environment_path or folder / "environment.json")
    step_path = Path(step_path or folder / "step_summary.parquet")
    step = read_parquet(step_path)
    label = environment.get("machine")
    if not label and len(summary) and "machine" in summary:
        label = str(summary["machine"].dropna().iloc[0]) if summary["machine"].notna().any() else None
    label = label or folder.name
    if step_path.is_file():
        missing = "no step rows"
    elif (
        source == "published"
        and ((environment.get("config") or {}).get("step") or {}).get("enabled") is False
    ):
        missing = "no step_summary.parquet; the step stages were off in that run"
    elif source == "published":
        missing = "no step_summary.parquet; published before the step stages"
    else:
        missing = "no step_summary.parquet"
    return Machine(label, source, summary, shapes, environment, step, missing)


def source_of(summary) -> str:
    """ "published" for a summary in a folder under ``published/`` (``results/published/<label>/``, the
    committed results), else "this run"."""
    return "published" if Path(summary).resolve().parent.parent.name == "published" else "this run"


def load_machines(summary, shapes=None, environment=None, published=(), step=None) -> list[Machine]:
    """This run's machine first, then each published one (labelled "(published)" when a label repeats).
    ``step``: this run's step summary (default: ``step_summary.parquet`` beside ``summary``)."""
    machines = [load_machine(summary, shapes, environment, step, source=source_of(summary))]
    for path in published:
        other = load_machine(path, source="published")
        if other.label in {m.label for m in machines}:
            other.label = f"{other.label} (published)"
        machines.append(other)
    return machines


def named_machine(machines, label: str | None):
    """The machine labelled ``label`` (a published one may carry " (published)" where this run has the same
    label), or None."""
    if not label:
        return None
    for machine in machines:
        if machine.label == label:
            return machine
    return next((m for m in machines if m.source == "published" and m.label == f"{label} (published)"), None)


def series_name(builder: str, timing: str, cache: str | None = None) -> str:
    name = SERIES_NAMES.get((builder, timing), f"{builder} ({timing})")
    if cache == "cold":
        name += ", cold L2"
    return name


def timings(machines: list[Machine]) -> pd.DataFrame:
    """Every measured configuration of every machine, one row each, with ``series`` and ``machine`` set.
    Cold-L2 GPU samples are kept as their own series; the empty-kernel floor is left out."""
    frames = []
    for machine in machines:
        df = machine.summary
        if df.empty:
            continue
        df = df[(df["status"] == "ok") & (df["n"] > 0) & (df["timing"] != "floor")].copy()
        if df.empty:
            continue
        df["machine"] = machine.label
        df["series"] = [
            series_name(b, t, c) for b, t, c in zip(df["builder"], df["timing"], df["cache"], strict=True)
        ]
        frames.append(df)
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    for column in ("budget", "batch", "depth"):
        out[column] = out[column].astype("int64")
    return out


def baseline_of(df: pd.DataFrame) -> str | None:
    """``sglang`` where SGLang's builder was measured, else ``reference``, else ``None``."""
    builders = set(df.loc[df["timing"] == "wall", "builder"]) if not df.empty else set()
    for name in (BASELINE, REFERENCE):
        if name in builders:
            return name
    return None


#: The baseline's columns in ``speedups``' merge.
BASE_SUFFIX = "_baseline"


def speedups(data: pd.DataFrame, headline: bool = False) -> pd.DataFrame:
    """Per machine, every series' median time divided into the baseline's (same budget, batch, depth,
    distribution): ``speedup`` > 1 means faster than the baseline. ``baseline`` names it. In-situ series
    are set against the baseline's in-situ time, the others against its wall time (``mode`` says which).
    ``headline``: only the in-situ comparison where the baseline has in-situ rows on the machine (what the
    decode round pays), else the wall-clock one.

    Each speedup carries its range across the timing jobs (``summary.spread.ratio_ranges``): ``speedup_low``
    (the baseline's fastest job median over the series' slowest), ``speedup_high``, ``baseline_jobs``,
    ``series_jobs`` and ``includes_one`` (the range includes 1.0x: the jobs do not agree on which is
    faster). A summary without spread columns is one job per configuration: the range is the speedup."""
    frames = []
    keys = ["budget", "batch", "depth", "distribution"]
    for machine, df in data.groupby("machine", sort=False):
        base = baseline_of(df)
        if base is None:
            continue
        in_situ = df["timing"].isin(IN_SITU_TIMINGS)
        has_in_situ = ((df["builder"] == base) & (df["timing"] == IN_SITU)).any()
        for mode, ref_timing, series in (("wall", "wall", df[~in_situ]), (IN_SITU, IN_SITU, df[in_situ])):
            if headline and has_in_situ and mode == "wall":
                continue
            spread = [c for c in SPREAD_COLUMNS if c in df]
            ref = df[(df["builder"] == base) & (df["timing"] == ref_timing)][keys + ["median_s", *spread]]
            if ref.empty or series.empty:
                continue
            ref = ref.rename(columns={c: f"{c}{BASE_SUFFIX}" for c in ["median_s", *spread]})
            merged = series.merge(ref, on=keys, how="inner")
            merged = merged[merged["builder"] != base]
            ranges = ratio_ranges(merged, BASE_SUFFIX)
            merged["baseline_s"] = merged[f"median_s{BASE_SUFFIX}"]
            merged = merged.drop(columns=[f"{c}{BASE_SUFFIX}" for c in ["median_s", *spread]])
            merged["speedup"] = merged["baseline_s"] / merged["median_s"]
            merged["speedup_low"] = ranges["ratio_low"]
            merged["speedup_high"] = ranges["ratio_high"]
            merged["baseline_jobs"] = ranges["numerator_jobs"]
            merged["series_jobs"] = ranges["denominator_jobs"]
            merged["includes_one"] = ranges["includes_one"]
            merged["baseline"] = base
            merged["mode"] = mode
            suffix = ", in-situ (what the decode round pays)" if mode == IN_SITU else ""
            merged["panel"] = f"{machine}: vs {BASELINE_NAMES[base]}{suffix}"
            frames.append(merged)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def select_rows(data: pd.DataFrame, depth, distribution) -> tuple[pd.DataFrame, int | None, str | None]:
    """The rows at the report's depth and distribution (or the first present, where those are absent); warm
    caches only (cold-L2 GPU samples are in the tables)."""
    if data.empty:
        return data, depth, distribution
    data = data[data["cache"] != "cold"]
    if depth is None or depth not in set(data["depth"]):
        depth = int(data["depth"].iloc[0])
    data = data[data["depth"] == depth]
    if distribution is None or distribution not in set(data["distribution"]):
        distribution = str(data["distribution"].iloc[0])
    return data[data["distribution"] == distribution], depth, distribution


def medians_of(df: pd.DataFrame, builder: str, timing: str = "wall", cache=("warm", "n/a")) -> pd.DataFrame:
    sel = df[(df["builder"] == builder) & (df["timing"] == timing) & (df["cache"].isin(cache))]
    return sel


def ratio_pairs(num: pd.DataFrame, den: pd.DataFrame, column: str) -> pd.DataFrame:
    keys = ["budget", "batch", "depth", "distribution"]
    merged = num[keys + [column]].merge(den[keys + [column]], on=keys, suffixes=("_num", "_den"))
    merged["ratio"] = merged[f"{column}_num"] / merged[f"{column}_den"]
    return merged


def sglang_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows where SGLang's own function ran (builder sglang, status ok, timed calls)."""
    if df.empty:
        return df
    return df[(df["builder"] == SGLANG) & (df["status"] == "ok") & (df["n"] > 0) & (df["timing"] == "wall")]


def selection_heading(rows: pd.DataFrame, machine: str, depth, distribution) -> str:
    """The heading of one machine's rows at the report's depth and distribution, built from the rows
    ``select_rows`` keeps: where the requested depth or distribution is absent, it says so and names what is
    shown instead."""
    shown, used_depth, used_distribution = select_rows(rows, depth, distribution)
    budgets = shown["budget"] if not shown.empty else ()
    heading = f"{machine} ({regime(used_depth, budgets)}; {used_distribution}; per call, p10-p90)"
    absent = []
    if depth is not None and used_depth != depth:
        absent.append(f"L = {depth}")
    if distribution is not None and used_distribution != distribution:
        absent.append(f"{distribution} trees")
    if absent:
        heading += f"; {' and '.join(absent)} not measured on {machine}"
    return heading
