"""The report: ``report/index.html`` (self-contained, figures embedded as base64 PNG) and
``report/summary.md``.

It reads this machine's summary (``results/<machine>/summary.parquet``, its ``tree_shape.parquet`` and
``environment.json``) and every published summary (``results/published/<machine>/``), and sets them side by
side: time vs budget, time vs batch size, speedup over SGLang's builder (or over ``reference``, labelled as
ours, where SGLang is absent), tree shape, a table of medians with p10/p90, each machine's environment, the
builders that could not run and why, and the benchmark targets evaluated on the measured numbers.

With a step summary (``step_summary.parquet``, beside ``summary.parquet``; ``step_report``): the verify
attention and tree accept tables, the GPU's peaks, the step-time breakdown and the expected acceptance per
budget. A machine without one (a publication from before the step stages) says "no data" there.
"""

from __future__ import annotations

import base64
import json
import warnings
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

import numpy as np
import pandas as pd

from ddtree_bench import acceptance_report, step_report, throughput_report
from ddtree_bench.environment import ENVIRONMENT_COLUMNS

FIGURE_NAMES = ("time_vs_budget", "time_vs_batch", "speedup", "tree_shape", "step_share", "which_budget")
#: The figures of the tree build (drawn from summary.parquet); step_share is the step-time breakdown's.
BUILD_FIGURES = ("time_vs_budget", "time_vs_batch", "speedup", "tree_shape")
# the acceptance section's figures (acceptance_report: tau per budget beside the paper, P(tau >= k))
FIGURE_NAMES = (*FIGURE_NAMES, "acceptance_tau", "acceptance_histogram")

#: How each (builder, timing) is named in figures and tables. ``reference`` is ours, never SGLang.
SERIES_NAMES = {
    ("sglang", "wall"): "sglang (SGLang's CPU builder)",
    ("reference", "wall"): "reference (ours, Python)",
    ("native", "wall"): "native (C++, 1 thread)",
    ("native-mt", "wall"): "native-mt (C++, all cores)",
    ("gpu", "kernel-events"): "gpu kernel (CUDA events)",
    ("gpu", "graph-replay"): "gpu CUDA-graph replay",
    ("gpu", "host-inclusive"): "gpu host-inclusive (secondary: copies in + out)",
    ("gpu", "wall"): "gpu (wall)",
    # in-situ (insitu_bench): from the drafter's top-K on the GPU to the padded tree on the GPU
    ("sglang", "in-situ"): "sglang in-situ (pageable copies)",
    ("reference", "in-situ"): "reference in-situ (pageable copies)",
    ("native", "in-situ"): "native in-situ (pinned copies)",
    ("native-mt", "in-situ"): "native-mt in-situ (pinned copies)",
    ("gpu", "in-situ"): "gpu in-situ (graph replay, bool mask)",
    ("gpu", "in-situ-packed"): "gpu in-situ (graph replay, packed bits)",
    ("gpu", "in-situ-launch-sync"): "gpu launch + sync wall (secondary, bool mask)",
    ("gpu", "in-situ-launch-sync-packed"): "gpu launch + sync wall (secondary, packed bits)",
}
BASELINE_NAMES = {"sglang": "SGLang's CPU builder", "reference": "reference (ours)"}
SERIES_ORDER = list(SERIES_NAMES.values())
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728", "#8c564b", "#e377c2", "#17becf")
_PALETTE += ("#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#ff9896", "#c49c94", "#f7b6d2", "#9edae5")
#: One colour per series in every figure and on every machine.
SERIES_COLORS = dict(zip(SERIES_ORDER, _PALETTE, strict=True))
#: The timing values of the in-situ rows (what the decode round pays; ``insitu_bench``).
IN_SITU_TIMINGS = ("in-situ", "in-situ-packed", "in-situ-launch-sync", "in-situ-launch-sync-packed")

# The public Triton builder as measured on our H200 (batch 64, L = 16, K = N), in µs; 1024 does not build.
TRITON_US = {32: 28.0, 64: 52.0, 256: 214.0, 512: 547.0}
# SGLang's own CPU builder as measured on our H200's host (per-request loop over a batch of 64, L = 16,
# K = N), per call in µs (../shared/CONTEXT.md): compared with reference where SGLang cannot run here.
SGLANG_PUBLISHED_BATCH64_US = {8: 3000.0, 32: 9500.0, 256: 55000.0, 1024: 218000.0}


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


def _read_json(path) -> dict:
    path = Path(path)
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def _read_parquet(path) -> pd.DataFrame:
    path = Path(path)
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame()


def load_machine(
    summary_path, shapes_path=None, environment_path=None, step_path=None, *, source="this run"
) -> Machine:
    """A machine's results: ``summary.parquet`` and, beside it unless given, ``tree_shape.parquet``,
    ``environment.json`` and ``step_summary.parquet`` (each optional)."""
    summary_path = Path(summary_path)
    folder = summary_path.parent
    summary = pd.read_parquet(summary_path)
    shapes = _read_parquet(shapes_path or folder / "tree_shape.parquet")
    environment = _read_json(environment_path or folder / "environment.json")
    step_path = Path(step_path or folder / "step_summary.parquet")
    step = _read_parquet(step_path)
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


def load_machines(summary, shapes=None, environment=None, published=(), step=None) -> list[Machine]:
    """This run's machine first, then each published one (labelled "(published)" when a label repeats).
    ``step``: this run's step summary (default: ``step_summary.parquet`` beside ``summary``)."""
    machines = [load_machine(summary, shapes, environment, step)]
    for path in published:
        other = load_machine(path, source="published")
        if other.label in {m.label for m in machines}:
            other.label = f"{other.label} (published)"
        machines.append(other)
    return machines


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
    for name in ("sglang", "reference"):
        if name in builders:
            return name
    return None


def speedups(data: pd.DataFrame, headline: bool = False) -> pd.DataFrame:
    """Per machine, every series' median time divided into the baseline's (same budget, batch, depth,
    distribution): ``speedup`` > 1 means faster than the baseline. ``baseline`` names it. In-situ series
    are set against the baseline's in-situ time, the others against its wall time (``mode`` says which).
    ``headline``: only the in-situ comparison where the baseline has in-situ rows on the machine (what the
    decode round pays), else the wall-clock one."""
    frames = []
    keys = ["budget", "batch", "depth", "distribution"]
    for machine, df in data.groupby("machine", sort=False):
        base = baseline_of(df)
        if base is None:
            continue
        in_situ = df["timing"].isin(IN_SITU_TIMINGS)
        has_in_situ = ((df["builder"] == base) & (df["timing"] == "in-situ")).any()
        for mode, ref_timing, series in (("wall", "wall", df[~in_situ]), ("in-situ", "in-situ", df[in_situ])):
            if headline and has_in_situ and mode == "wall":
                continue
            ref = df[(df["builder"] == base) & (df["timing"] == ref_timing)][keys + ["median_s"]]
            if ref.empty or series.empty:
                continue
            ref = ref.rename(columns={"median_s": "baseline_s"})
            merged = series.merge(ref, on=keys, how="inner")
            merged = merged[merged["builder"] != base]
            merged["speedup"] = merged["baseline_s"] / merged["median_s"]
            merged["baseline"] = base
            merged["mode"] = mode
            suffix = ", in-situ (what the decode round pays)" if mode == "in-situ" else ""
            merged["panel"] = f"{machine}: vs {BASELINE_NAMES[base]}{suffix}"
            frames.append(merged)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# ----------------------------------------------------------------------------------------- figures


def _plot_band(data, x, y, lo, hi, color=None, label=None, **_):
    import matplotlib.pyplot as plt  # noqa: PLC0415

    data = data.sort_values(x)
    ax = plt.gca()
    ax.plot(data[x], data[y], marker="o", markersize=3.5, linewidth=1.4, color=color, label=label)
    if lo and hi:
        ax.fill_between(data[x], data[lo], data[hi], color=color, alpha=0.18, linewidth=0)


def _empty_figure(path, message: str) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=11, wrap=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _palette(series) -> dict:
    extra = iter(("#7f7f7f", "#bcbd22", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896"))
    return {s: SERIES_COLORS.get(s) or next(extra, "#333333") for s in dict.fromkeys(series)}


def _grid(
    data,
    *,
    x,
    y,
    lo,
    hi,
    col,
    row,
    hue_order,
    xlabel,
    ylabel,
    title,
    path,
    logx=True,
    logy=True,
    col_wrap=None,
    hline=None,
):
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import seaborn as sns  # noqa: PLC0415

    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.85)
    rows = data[row].nunique() if row else 1
    grid = sns.FacetGrid(
        data,
        col=col,
        row=row if rows > 1 else None,
        hue="series",
        hue_order=[h for h in hue_order if h in set(data["series"])]
        + sorted(set(data["series"]) - set(hue_order)),
        height=2.9,
        aspect=1.15,
        sharey=False,
        margin_titles=False,
        col_wrap=col_wrap if rows <= 1 else None,
        palette=_palette(data["series"]),
    )
    grid.map_dataframe(_plot_band, x=x, y=y, lo=lo, hi=hi)
    for ax in grid.axes.flat:
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            with warnings.catch_warnings():  # a flat series (one value) is drawn fine; no need to say so
                warnings.simplefilter("ignore", UserWarning)
                ax.set_yscale("log")
        if hline is not None:
            ax.axhline(hline, color="0.4", linewidth=0.8, linestyle="--")
    grid.set_axis_labels(xlabel, ylabel)
    if rows > 1:
        grid.set_titles(row_template="{row_name}", col_template=f"{col} = {{col_name}}")
    else:
        only = data[row].iloc[0] if row else ""
        grid.set_titles(col_template=f"{only}  {col} = {{col_name}}".strip())
    grid.add_legend(title="")
    grid.figure.suptitle(title, y=1.02, fontsize=11)
    grid.figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(grid.figure)


def _select(data: pd.DataFrame, depth, distribution) -> tuple[pd.DataFrame, int | None, str | None]:
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


def figure_time_vs_budget(data, path, depth, distribution) -> str:
    sel, depth, distribution = _select(data, depth, distribution)
    if sel.empty:
        _empty_figure(path, "no timings")
        return "no timings"
    sel = sel.assign(us=sel["median_s"] * 1e6, lo=sel["p10_s"] * 1e6, hi=sel["p90_s"] * 1e6)
    title = f"Time per call vs budget (L = {depth}, {distribution} trace; band: p10-p90)"
    _grid(
        sel,
        x="budget",
        y="us",
        lo="lo",
        hi="hi",
        col="batch",
        row="machine",
        hue_order=SERIES_ORDER,
        xlabel="budget N",
        ylabel="µs per call (median)",
        title=title,
        path=path,
        col_wrap=4,
    )
    return title


def _budget_choice(budgets) -> list[int]:
    budgets = sorted(set(int(b) for b in budgets))
    if len(budgets) <= 4:
        return budgets
    picks = [budgets[0], budgets[len(budgets) // 3], budgets[2 * len(budgets) // 3], budgets[-1]]
    return sorted(set(picks))


def figure_time_vs_batch(data, path, depth, distribution) -> str:
    sel, depth, distribution = _select(data, depth, distribution)
    if sel.empty:
        _empty_figure(path, "no timings")
        return "no timings"
    sel = sel[sel["budget"].isin(_budget_choice(sel["budget"]))]
    sel = sel.assign(
        us=sel["median_per_tree_s"] * 1e6, lo=sel["p10_per_tree_s"] * 1e6, hi=sel["p90_per_tree_s"] * 1e6
    )
    title = f"Time per tree vs batch size (L = {depth}, {distribution} trace; band: p10-p90)"
    _grid(
        sel,
        x="batch",
        y="us",
        lo="lo",
        hi="hi",
        col="budget",
        row="machine",
        hue_order=SERIES_ORDER,
        xlabel="batch size B",
        ylabel="µs per tree (median)",
        title=title,
        path=path,
        col_wrap=4,
    )
    return title


def figure_speedup(data, path, depth, distribution) -> str:
    sel, depth, distribution = _select(data, depth, distribution)
    sp = speedups(sel, headline=True) if not sel.empty else pd.DataFrame()
    if sp.empty:
        _empty_figure(path, "no speedups: neither sglang nor reference was measured")
        return "no speedups"
    bases = sorted({BASELINE_NAMES[b] for b in sp["baseline"]})
    what = "in-situ: what the decode round pays" if (sp["mode"] == "in-situ").all() else "same inputs"
    if sp["mode"].nunique() > 1:
        what = "in-situ where measured, else wall clock"
    title = f"Speedup over {' / '.join(bases)} ({what}; L = {depth}, {distribution} trace)"
    sp = sp.assign(machine=sp["panel"])
    _grid(
        sp,
        x="budget",
        y="speedup",
        lo=None,
        hi=None,
        col="batch",
        row="machine",
        hue_order=SERIES_ORDER,
        xlabel="budget N",
        ylabel="speedup (x, median / median)",
        title=title,
        path=path,
        col_wrap=4,
        hline=1.0,
    )
    return title


def figure_tree_shape(machines: list[Machine], path, depth) -> str:
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import seaborn as sns  # noqa: PLC0415

    shapes = next((m.shapes for m in machines if not m.shapes.empty), pd.DataFrame())
    if shapes.empty:
        _empty_figure(path, "no tree shapes")
        return "no tree shapes"
    if depth not in set(shapes["depth"]):
        depth = int(shapes["depth"].iloc[0])
    sel = shapes[shapes["depth"] == depth].copy()
    budgets = sorted(int(b) for b in sel["budget"].unique())
    sel["budget N"] = sel["budget"].astype(int).astype(str)
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.85)
    grid = sns.relplot(
        data=sel,
        x="tree_depth",
        y="nodes_mean",
        hue="budget N",
        hue_order=[str(b) for b in budgets],
        col="distribution",
        kind="line",
        marker="o",
        markersize=4,
        palette="viridis",
        height=3.0,
        aspect=1.1,
        facet_kws={"sharey": True},
    )
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    for ax in grid.axes.flat:
        ax.set_yscale("symlog", linthresh=0.01)  # depths no tree reaches (0) stay visible
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    grid.set_axis_labels("tree depth d (block position)", "nodes at depth d (mean over requests)")
    grid.set_titles(col_template="{col_name}")
    title = f"Tree shape: nodes per depth of reference's trees (L = {depth}, all requests of each trace)"
    grid.figure.suptitle(title, y=1.03, fontsize=11)
    grid.figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(grid.figure)
    return title


# ----------------------------------------------------------------------------------------- targets


@dataclass
class TargetResult:
    machine: str
    target: str
    source: str
    status: str  # met | not met | no data
    measured: str


def _medians(df: pd.DataFrame, builder: str, timing: str = "wall", cache=("warm", "n/a")) -> pd.DataFrame:
    sel = df[(df["builder"] == builder) & (df["timing"] == timing) & (df["cache"].isin(cache))]
    return sel


def _ratio_pairs(num: pd.DataFrame, den: pd.DataFrame, column: str) -> pd.DataFrame:
    keys = ["budget", "batch", "depth", "distribution"]
    merged = num[keys + [column]].merge(den[keys + [column]], on=keys, suffixes=("_num", "_den"))
    merged["ratio"] = merged[f"{column}_num"] / merged[f"{column}_den"]
    return merged


def _fmt_x(value: float) -> str:
    return f"{value:,.1f}x" if value < 100 else f"{value:,.0f}x"


def _where(row) -> str:
    return f"N={row['budget']}, B={row['batch']}, L={row['depth']}, {row['distribution']}"


def _status_minimum(pairs: pd.DataFrame, threshold: float) -> tuple[str, str]:
    worst = pairs.loc[pairs["ratio"].idxmin()]
    status = "met" if worst["ratio"] >= threshold else "not met"
    return status, f"min {_fmt_x(worst['ratio'])} ({_where(worst)}) over {len(pairs)} configurations"


def evaluate_targets(machines: list[Machine]) -> list[TargetResult]:
    """Issue 2's, 3's and 4's benchmark targets, per machine, on the measured medians."""
    results = _build_targets(machines) + sglang_function_targets(machines)
    for machine in machines:  # issue 4: verify attention and tree accept (step_summary.parquet)
        for target, source, status, measured in step_report.step_targets(
            machine.step, missing=machine.step_missing
        ):
            results.append(TargetResult(machine.label, target, source, status, measured))
    for machine in machines:  # the drafter distribution's acceptance (tree_shape.parquet)
        if not machine.shapes.empty and "drafter" in set(machine.shapes["distribution"]):
            for target, source, status, measured in acceptance_report.acceptance_targets(machine.shapes):
                results.append(TargetResult(machine.label, target, source, status, measured))
    order = {m.label: i for i, m in enumerate(machines)}
    return sorted(results, key=lambda r: order.get(r.machine, len(order)))


def _speedup_notes(pairs, kernel, factor: float, floor_s: float | None, base_name: str) -> str:
    """What a speedup target's measured text adds: the budgets where ``factor`` times faster than the
    baseline would take less than the run's empty-kernel floor ``floor_s`` (no kernel launch can; None: not
    measured), and, where the baseline is our reference, the kernel against SGLang's published H200-host
    figures (not this run)."""
    notes = []
    if floor_s is not None:
        need = pairs.groupby("budget")["median_s_num"].min() / factor
        below = [(int(budget), s) for budget, s in need.items() if s < floor_s]
        if below:
            each = ", ".join(f"N={budget} needs {s * 1e6:.2f} µs" for budget, s in below)
            notes.append(f"unreachable here: {each}, below the empty-kernel floor ({floor_s * 1e6:.2f} µs)")
    if base_name == "reference":
        worst = (
            kernel[kernel["budget"].isin(list(SGLANG_PUBLISHED_BATCH64_US))]
            .groupby("budget")["median_s"]
            .max()
        )
        if len(worst):
            each = ", ".join(
                f"N={int(budget)}: {_fmt_x(SGLANG_PUBLISHED_BATCH64_US[budget] / (s * 1e6))}"
                for budget, s in worst.items()
            )
            notes.append(
                f"vs SGLang's published H200-host figures (batch 64, L = 16, K = N; not this run): {each}"
            )
    return "".join(f"; {note}" for note in notes)


def _build_targets(machines: list[Machine]) -> list[TargetResult]:
    """Issue 2's and issue 3's targets (the tree build), per machine."""
    results = []
    for machine in machines:
        df = machine.summary
        ok = df[(df["status"] == "ok") & (df["n"] > 0)] if not df.empty else df
        label = machine.label

        def add(target, source, status, measured, label=label):
            results.append(TargetResult(label, target, source, status, measured))

        if ok.empty:
            add("any timing", "-", "no data", "no timings on this machine")
            continue
        ref = _medians(ok, "reference")
        native = _medians(ok, "native")
        sglang = _medians(ok, "sglang")

        pairs = _ratio_pairs(ref, native, "median_per_tree_s") if len(ref) and len(native) else pd.DataFrame()
        if pairs.empty:
            add(
                "native (1 thread) >= 50x faster per tree than reference, every budget",
                "issue 2",
                "no data",
                "needs native and reference timings",
            )
        else:
            add(
                "native (1 thread) >= 50x faster per tree than reference, every budget",
                "issue 2",
                *_status_minimum(pairs, 50.0),
            )

        pairs = _ratio_pairs(ref, sglang, "median_per_tree_s") if len(ref) and len(sglang) else pd.DataFrame()
        target = "reference within +-25% of SGLang's per-tree time"
        if pairs.empty:
            published = ref[
                (ref["batch"] == 64)
                & (ref["depth"] == 16)
                & (ref["topk"] == ref["budget"])
                & ref["budget"].isin(list(SGLANG_PUBLISHED_BATCH64_US))
            ]
            measured = "SGLang's builder not measured here"
            if len(published):
                ratios = published["median_s"] * 1e6 / published["budget"].map(SGLANG_PUBLISHED_BATCH64_US)
                measured += (
                    f"; vs SGLang's published H200-host figures (batch 64, L = 16, K = N; not this run): "
                    f"reference / SGLang from {ratios.min():.2f} to {ratios.max():.2f} "
                    f"({len(ratios)} configurations)"
                )
            add(target, "issue 2", "no data", measured)
        else:
            lo, hi = pairs["ratio"].min(), pairs["ratio"].max()
            status = "met" if lo >= 0.75 and hi <= 1.25 else "not met"
            measured = f"reference / sglang from {lo:.2f} to {hi:.2f} ({len(pairs)} configurations)"
            add(target, "issue 2", status, measured)

        # GPU targets (issue 3): L = 16, K = N, peaked and uniform traces; kernel time by CUDA events (warm).
        def gpu_rows(timing, cache=("warm", "n/a"), ok=ok):
            sel = _medians(ok, "gpu", timing, cache)
            return sel[
                (sel["depth"] == 16)
                & (sel["topk"] == sel["budget"])
                & sel["distribution"].isin(["peaked", "uniform"])
            ]

        kernel = gpu_rows("kernel-events")
        floor = ok[(ok["builder"] == "gpu") & (ok["timing"] == "floor")]
        floor_s = float(floor["median_s"].median()) if not floor.empty else None
        base_name = "sglang" if len(sglang) else "reference"
        base = sglang if len(sglang) else ref
        base_label = BASELINE_NAMES[base_name]
        nodata = "no gpu timings (L = 16, K = N, peaked/uniform)"

        for budgets, batch, factor, text in (
            ([8, 16, 32], 64, 500.0, "gpu kernel >= 500x faster than {base}, batch 64, budgets 8/16/32"),
            ([1024], 64, 1000.0, "gpu kernel >= 1000x faster than {base}, batch 64, budget 1024"),
        ):
            target = text.format(base=base_label)
            sel = kernel[(kernel["batch"] == batch) & kernel["budget"].isin(budgets)]
            pairs = _ratio_pairs(base, sel, "median_s") if len(sel) and len(base) else pd.DataFrame()
            if pairs.empty:
                add(target, "issue 3", "no data", nodata if sel.empty else f"{base_label} not measured")
            else:
                status, measured = _status_minimum(pairs, factor)
                add(
                    target,
                    "issue 3",
                    status,
                    measured + _speedup_notes(pairs, sel, factor, floor_s, base_name),
                )

        for batch, limit_us in ((64, 150.0),):
            target = f"gpu kernel <= {limit_us:.0f} µs at budget 1024, batch {batch}"
            sel = kernel[(kernel["batch"] == batch) & (kernel["budget"] == 1024)]
            if sel.empty:
                add(target, "issue 3", "no data", nodata)
            else:
                worst = sel["median_s"].max() * 1e6
                add(target, "issue 3", "met" if worst <= limit_us else "not met", f"{worst:.1f} µs (worst)")

        for target, status, measured in in_situ_targets(ok):
            add(target, IN_SITU_SOURCE, status, measured)

        target = "gpu kernel vs the public Triton builder (H200, batch 64): >= 1.5x at 32, >= 5x from 256"
        sel = kernel[kernel["batch"] == 64]
        if sel.empty:
            add(target, "issue 3", "no data", nodata)
        else:
            notes, status = [], "met"
            for budget, factor in ((32, 1.5), (256, 5.0), (512, 5.0)):
                at = sel[sel["budget"] == budget]
                if at.empty:
                    notes.append(f"N={budget}: no data")
                    status = "no data" if status == "met" else status
                    continue
                ratio = TRITON_US[budget] / (at["median_s"].max() * 1e6)
                notes.append(f"N={budget}: {_fmt_x(ratio)}")
                if ratio < factor:
                    status = "not met"
            if (sel["budget"] == 1024).any():
                notes.append("N=1024: builds (Triton does not)")
            add(target, "issue 3", status, "; ".join(notes))
    return results


# ------------------------------------------------------------------- SGLang's measured function

REF_VS_SGLANG_TITLE = "reference (ours) / SGLang's function"
REF_VS_SGLANG_NOTE = (
    "Where SGLang's own build_ddtree_tree_from_topk ran beside our Python stand-in reference, on the same "
    "inputs: median per call of each and their ratio (below 1: the stand-in is faster). Speedups over "
    "reference on a machine without SGLang relate to SGLang's function by this ratio (the host CPU is "
    "shared, so it moves between runs)."
)

SGLANG_FUNCTION_TARGET = (
    "GPU kernel vs SGLang's measured function, batch 64: >= 500x at every budget <= 64, >= 1000x from 256 up"
)
#: (budgets, factor) of that target: every budget up to 64 needs 500x, every budget from 256 up 1000x.
SGLANG_FUNCTION_FACTORS = ((lambda budget: budget <= 64, 500.0), (lambda budget: budget >= 256, 1000.0))


def _sglang_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows where SGLang's own function ran (builder sglang, status ok, timed calls)."""
    if df.empty:
        return df
    return df[(df["builder"] == "sglang") & (df["status"] == "ok") & (df["n"] > 0) & (df["timing"] == "wall")]


def sglang_function_targets(machines: list[Machine]) -> list[TargetResult]:
    """The kernel against SGLang's function where it was measured on the machine (its own rows, never our
    stand-in): batch 64, L = 16, K = N, peaked and uniform traces, kernel time by CUDA events (warm)."""
    results = []
    source = "SGLang's builder"
    measured_on = [m.label for m in machines if not _sglang_rows(m.summary).empty]
    for machine in machines:
        df = machine.summary
        sglang = _sglang_rows(df)
        if sglang.empty:
            elsewhere = f" (measured on {', '.join(measured_on)})" if measured_on else ""
            why = f"SGLang's function did not run on this machine{elsewhere}"
            results.append(TargetResult(machine.label, SGLANG_FUNCTION_TARGET, source, "no data", why))
            continue
        ok = df[(df["status"] == "ok") & (df["n"] > 0)]
        kernel = _medians(ok, "gpu", "kernel-events")
        kernel = kernel[
            (kernel["batch"] == 64)
            & (kernel["depth"] == 16)
            & (kernel["topk"] == kernel["budget"])
            & kernel["distribution"].isin(["peaked", "uniform"])
        ]
        pairs = _ratio_pairs(sglang, kernel, "median_s") if len(kernel) else pd.DataFrame()
        if pairs.empty:
            results.append(
                TargetResult(
                    machine.label,
                    SGLANG_FUNCTION_TARGET,
                    source,
                    "no data",
                    "needs gpu kernel and sglang timings at batch 64 (L = 16, K = N, peaked/uniform)",
                )
            )
            continue
        notes, short, checked = [], [], 0
        for wanted, factor in SGLANG_FUNCTION_FACTORS:
            sel = pairs[pairs["budget"].map(wanted)]
            if sel.empty:
                continue
            checked += len(sel)
            worst = sel.loc[sel["ratio"].idxmin()]
            notes.append(f"min {_fmt_x(worst['ratio'])} where {_fmt_x(factor)} is asked ({_where(worst)})")
            for _, row in sel[sel["ratio"] < factor].sort_values(["budget", "distribution"]).iterrows():
                need_us = row["median_s_num"] / factor * 1e6
                short.append(
                    f"{_where(row)}: {_fmt_x(row['ratio'])}, {(1 - row['ratio'] / factor) * 100:.0f}% short "
                    f"(the kernel took {row['median_s_den'] * 1e6:.1f} µs; {factor:.0f}x needs "
                    f"<= {need_us:.1f} µs)"
                )
        outside = sorted({int(b) for b in pairs["budget"] if 64 < b < 256})
        if outside:
            notes.append(f"budgets {outside} are between the two bands and not judged")
        if checked == 0:
            results.append(
                TargetResult(machine.label, SGLANG_FUNCTION_TARGET, source, "no data", "; ".join(notes))
            )
            continue
        status = "not met" if short else "met"
        measured = "; ".join(notes) + f" ({checked} configurations)"
        if short:
            measured += "; short: " + "; ".join(short)
        results.append(TargetResult(machine.label, SGLANG_FUNCTION_TARGET, source, status, measured))
    return results


def reference_vs_sglang_table(machines: list[Machine]) -> pd.DataFrame:
    """Per configuration where both ran: our Python stand-in ``reference`` against SGLang's own function,
    medians per call, and their ratio (< 1: the stand-in is faster than SGLang's function)."""
    rows = []
    for machine in machines:
        sglang = _sglang_rows(machine.summary)
        if sglang.empty:
            continue
        ok = machine.summary[(machine.summary["status"] == "ok") & (machine.summary["n"] > 0)]
        ref = _medians(ok, "reference")
        pairs = _ratio_pairs(ref, sglang, "median_s") if len(ref) else pd.DataFrame()
        for _, row in pairs.sort_values(["depth", "distribution", "budget", "batch"]).iterrows():
            rows.append(
                {
                    "machine": machine.label,
                    "distribution": row["distribution"],
                    "L": int(row["depth"]),
                    "N": int(row["budget"]),
                    "B": int(row["batch"]),
                    "reference (ours)": _us(row["median_s_num"]),
                    "SGLang's function": _us(row["median_s_den"]),
                    "reference / SGLang": f"{row['ratio']:.2f}",
                }
            )
    return pd.DataFrame(rows)


def sglang_source_table(machines: list[Machine]) -> pd.DataFrame:
    """Where each machine's SGLang function came from (the provenance columns of its sglang rows)."""
    rows = []
    for machine in machines:
        sglang = _sglang_rows(machine.summary)
        if sglang.empty:
            continue

        def last(column, sglang=sglang):
            if column not in sglang:
                return None
            values = sglang[column].dropna()
            return values.iloc[-1] if len(values) else None

        where = last("builder_source")
        if where is None:
            rows.append(
                {
                    "machine": machine.label,
                    "SGLang's function from": "not recorded in these rows (published before provenance was "
                    "recorded; see the publication's README)",
                    "file sha256": "-",
                    "git checkout": "-",
                    "workspace passed": "-",
                }
            )
            continue
        sha = last("builder_source_sha256")
        workspace = last("builder_workspace")
        rows.append(
            {
                "machine": machine.label,
                "SGLang's function from": str(where),
                "file sha256": str(sha) if sha else "-",
                "git checkout": "file tracked; commit in summary.parquet"
                if last("builder_source_git_commit")
                else "none (the file is not tracked by git)",
                "workspace passed": "-" if workspace is None else ("yes" if bool(workspace) else "no"),
            }
        )
    return pd.DataFrame(rows)


IN_SITU_SOURCE = "decode round (in-situ)"
CPU_BUILDERS = ("sglang", "reference", "native", "native-mt")


def _in_situ_medians(ok: pd.DataFrame, builder: str) -> pd.DataFrame:
    keys = ["budget", "batch", "depth", "distribution"]
    sel = ok[(ok["builder"] == builder) & (ok["timing"] == "in-situ")] if not ok.empty else ok
    return sel[keys + ["median_s"]] if len(sel) else pd.DataFrame(columns=keys + ["median_s"])


def _factor_target(pairs: pd.DataFrame, need, other: str) -> tuple[str, str]:
    """``pairs`` (ratio = other's time / gpu's, per configuration) against the factor ``need(budget)``: the
    status and the measured text; where not met, each configuration short of it with what the gpu took and
    what it would have to take."""
    pairs = pairs.assign(need=pairs["budget"].map(need))
    pairs = pairs.assign(margin=pairs["ratio"] / pairs["need"])
    worst = pairs.loc[pairs["margin"].idxmin()]
    text = (
        f"min {_fmt_x(worst['ratio'])} against {_fmt_x(worst['need'])} needed ({_where(worst)}) over "
        f"{len(pairs)} configurations"
    )
    short = pairs[pairs["margin"] < 1.0].sort_values(["batch", "budget", "distribution"])
    if short.empty:
        return "met", text
    each = "; ".join(
        f"N={int(r['budget'])} {r['distribution']}: {_fmt_x(r['ratio'])} of {_fmt_x(r['need'])}, gpu "
        f"{_us(r['median_s_den'])} where {_us(r['median_s_num'] / r['need'])} is needed"
        for _, r in short.iterrows()
    )
    return "not met", f"{text}; short at {len(short)}: {each} (against {other})"


def in_situ_targets(ok: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The decode round's targets on the in-situ rows (``gpu``: its bool-mask graph replay, the outputs the
    CPU builders hand over): ``(target, status, measured)``; a target not met says by how much."""
    out = []
    gpu = _in_situ_medians(ok, "gpu")
    nodata = "no gpu in-situ timings on this machine (timing.in_situ needs a CUDA GPU)"

    def versus(other: pd.DataFrame, batch: int, budgets) -> pd.DataFrame:
        sel = gpu[(gpu["batch"] == batch) & budgets(gpu["budget"])]
        if sel.empty or other.empty:
            return pd.DataFrame()
        return _ratio_pairs(other, sel, "median_s")

    target = "in-situ, batch 64: gpu >= 10x native-mt at every budget >= 64, and >= 5x below"
    pairs = versus(_in_situ_medians(ok, "native-mt"), 64, lambda b: b > 0)
    if pairs.empty:
        why = nodata if gpu.empty else "needs native-mt in-situ timings at batch 64"
        out.append((target, "no data", why))
    else:
        out.append((target, *_factor_target(pairs, lambda n: 10.0 if n >= 64 else 5.0, "native-mt")))

    target = "in-situ, batch 64: gpu >= 1000x sglang (SGLang's function) at every budget >= 32"
    pairs = versus(_in_situ_medians(ok, "sglang"), 64, lambda b: b >= 32)
    if pairs.empty:
        why = nodata if gpu.empty else "needs sglang in-situ timings at batch 64, budgets >= 32"
        ref = versus(_in_situ_medians(ok, "reference"), 64, lambda b: b >= 32)
        if len(ref):
            why += f"; gpu vs reference (ours) in-situ: min {_fmt_x(ref['ratio'].min())} (not SGLang)"
        out.append((target, "no data", why))
    else:
        out.append((target, *_factor_target(pairs, lambda n: 1000.0, "sglang")))

    target = "in-situ, batch 1: gpu >= 3x the fastest CPU builder at every budget"
    cpu = pd.concat([_in_situ_medians(ok, b).assign(builder=b) for b in CPU_BUILDERS], ignore_index=True)
    if len(cpu):
        keys = ["budget", "batch", "depth", "distribution"]
        cpu = cpu.loc[cpu.groupby(keys)["median_s"].idxmin()]
    pairs = versus(cpu, 1, lambda b: b > 0)
    if pairs.empty:
        out.append((target, "no data", nodata if gpu.empty else "needs CPU in-situ timings at batch 1"))
    else:
        fastest = cpu.set_index(["budget", "batch", "depth", "distribution"])["builder"]
        names = sorted(
            {str(fastest.get((r.budget, r.batch, r.depth, r.distribution))) for r in pairs.itertuples()}
        )
        status, measured = _factor_target(pairs, lambda n: 3.0, "the fastest CPU builder")
        out.append((target, status, f"{measured}; fastest CPU builder: {', '.join(names)}"))
    return out


# ----------------------------------------------------------------------------------------- tables


def _us(value) -> str:
    return step_report.fmt_us(value)


def medians_table(data: pd.DataFrame) -> pd.DataFrame:
    """Every configuration: median, p10, p90 per call and per tree, n, and the speedup over the baseline."""
    if data.empty:
        return pd.DataFrame()
    sp = speedups(data)
    keys = ["machine", "series", "budget", "batch", "depth", "distribution", "cache"]
    if sp.empty:
        data = data.assign(speedup=np.nan)
    else:
        data = data.merge(sp[keys + ["speedup"]], on=keys, how="left")
    data = data.sort_values(
        ["machine", "depth", "distribution", "budget", "batch", "series"],
        ascending=[True, False, True, True, True, True],
    )
    return pd.DataFrame(
        {
            "machine": data["machine"],
            "builder": data["series"],
            "distribution": data["distribution"],
            "L": data["depth"],
            "N": data["budget"],
            "B": data["batch"],
            "n": data["n"],
            "median / call": data["median_s"].map(_us),
            "p10": data["p10_s"].map(_us),
            "p90": data["p90_s"].map(_us),
            "median / tree": data["median_per_tree_s"].map(_us),
            "speedup": data["speedup"].map(lambda v: "-" if pd.isna(v) else _fmt_x(v)),
        }
    )


def compact_table(data: pd.DataFrame, machine: str, depth, distribution) -> pd.DataFrame:
    """One machine, one depth and distribution: rows (N, B), a column per builder, "median (p10-p90)"."""
    sel, _, _ = _select(data[data["machine"] == machine], depth, distribution)
    if sel.empty:
        return pd.DataFrame()
    sel = sel.assign(
        cell=[
            f"{_us(m)} ({_us(a)}-{_us(b)})"
            for m, a, b in zip(sel["median_s"], sel["p10_s"], sel["p90_s"], strict=True)
        ]
    )
    table = sel.pivot_table(index=["budget", "batch"], columns="series", values="cell", aggfunc="first")
    order = [c for c in SERIES_ORDER if c in table.columns]
    table = table[order + [c for c in table.columns if c not in SERIES_ORDER]]
    table = table.reset_index().rename(columns={"budget": "N", "batch": "B"})
    table.columns.name = None
    return table.fillna("-")


IN_SITU_INTRO = (
    "From the drafter's top-K on the GPU to the padded tree on the GPU, what the decode round's critical "
    "path pays, per builder, on the same inputs (docs/in_situ.md): sglang and reference as SGLang's worker "
    "does it (pageable copies of the top-K to the host, build and pad per request, the padded visibility, "
    "links, token ids and depths back to the device, synchronise; wall clock); native and native-mt with "
    "pinned buffers allocated once (one copy each way on one stream; wall clock); gpu with inputs and "
    "outputs on the device, its time on the stream (CUDA events around a CUDA-graph replay), with the bool "
    "mask and with packed bits only, and the launch + synchronise wall time as a secondary column."
)


def in_situ_tables(data: pd.DataFrame, machines: list[Machine], depth, distribution) -> dict:
    """Per machine, the in-situ series as ``compact_table`` lays them out, or a line saying why none."""
    out = {}
    for machine in machines:
        sel = data[data["timing"].isin(IN_SITU_TIMINGS)] if not data.empty else data
        table = compact_table(sel, machine.label, depth, distribution) if not sel.empty else pd.DataFrame()
        if table.empty:
            failed = machine.summary
            if not failed.empty:
                failed = failed[(failed["timing"] == "in-situ") & (failed["status"] != "ok")]
            reasons = sorted({str(r) for r in failed["status_reason"].dropna()}) if len(failed) else []
            why = "; ".join(reasons) or "timing.in_situ off, or results from before the mode existed"
            table = f"no in-situ rows ({why})"
        out[machine.label] = table
    return out


def unavailable_table(machines: list[Machine]) -> pd.DataFrame:
    rows = []
    for machine in machines:
        df = machine.summary
        seen = set()
        if not df.empty:
            bad = df[df["status"] != "ok"]
            for _, row in bad.iterrows():
                key = (row["builder"], row["status"], row["status_reason"])
                if key in seen:
                    continue
                seen.add(key)
                rows.append(
                    {
                        "machine": machine.label,
                        "builder": row["builder"],
                        "status": row["status"],
                        "reason": row["status_reason"] or "-",
                    }
                )
        env = machine.environment
        wanted = "gpu" in (env.get("config") or {}).get("builders", [])
        if wanted and not (env.get("builds") or {}).get("fatbin"):
            rows.append(
                {
                    "machine": machine.label,
                    "builder": "gpu (kernel build)",
                    "status": "not compiled",
                    "reason": "no nvcc found" if not env.get("nvcc") else "gpu: off",
                }
            )
    return pd.DataFrame(rows, columns=["machine", "builder", "status", "reason"])


def correctness_table(machines: list[Machine]) -> pd.DataFrame:
    rows = []
    for machine in machines:
        df = machine.summary
        if df.empty:
            continue
        ok = df[(df["status"] == "ok") & (df["n"] > 0)]
        for builder, group in ok.groupby("builder", sort=False):
            correct = group["correct"]
            verdict = "yes" if correct.notna().all() and correct.astype(bool).all() else "NO"
            rows.append(
                {
                    "machine": machine.label,
                    "builder": builder,
                    "configurations": len(group),
                    "trees equal reference's": verdict,
                }
            )
    return pd.DataFrame(rows)


ENV_KEYS = (*ENVIRONMENT_COLUMNS, "platform")  # the benchmark rows' environment, and the platform


def environment_table(machines: list[Machine]) -> pd.DataFrame:
    table = {}
    for machine in machines:
        env = machine.environment
        table[f"{machine.label} ({machine.source})"] = [
            "-" if env.get(key) in (None, "") else str(env.get(key)) for key in ENV_KEYS
        ]
    return pd.DataFrame(table, index=list(ENV_KEYS)).reset_index(names="")


# ----------------------------------------------------------------------------------------- output


def markdown_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(none)_\n"

    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    header = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def html_table(df: pd.DataFrame, *, status_column: str | None = None) -> str:
    if df.empty:
        return "<p><em>(none)</em></p>"
    head = "".join(f"<th>{escape(str(c))}</th>" for c in df.columns)
    rows = []
    for row in df.itertuples(index=False):
        cells = []
        for column, value in zip(df.columns, row, strict=True):
            cls = ""
            if column == status_column:
                cls = f' class="{str(value).replace(" ", "-")}"'
            cells.append(f"<td{cls}>{escape(str(value))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1250px;
color:#222;padding:0 1em;line-height:1.45}
h1{font-size:1.6em}h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;font-size:.82em;margin:.6em 0}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.met{background:#dff5df}td.not-met{background:#f9dcdc}td.no-data{color:#777}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}details{margin:.5em 0}.note{color:#555}
"""


def _target_frame(results: list[TargetResult]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "machine": r.machine,
                "target": r.target,
                "from": r.source,
                "status": r.status,
                "measured": r.measured,
            }
            for r in results
        ],
        columns=["machine", "target", "from", "status", "measured"],
    )


def render_report(
    *,
    summary,
    shapes=None,
    environment=None,
    published=(),
    html: str | Path = "report/index.html",
    markdown: str | Path = "report/summary.md",
    figures=None,
    depth: int | None = 16,
    distribution: str | None = "peaked",
    step_summary=None,
    step_layers: int = 61,
    step_depth: int | None = None,
    step_distribution: str | None = None,
    step_enabled: bool = True,
    throughput_options: dict | None = None,
    distributions: list[str] | None = None,
    grid: dict | None = None,
) -> None:
    """Render the HTML page and the Markdown summary (and the figures as PNG files next to them).

    ``grid``: the configuration's grid lists (``consistency.configured_grid``); where given, a summary or
    tree-shape table that does not hold exactly that grid is refused (``ValueError``) before anything is
    written.

    ``step_summary``: this run's step summary (default: ``step_summary.parquet`` beside ``summary``);
    ``step_layers``, ``step_depth``, ``step_distribution``: the step section of this run's configuration
    (published machines use their own, from their environment.json); ``step_enabled`` False: this run left
    the step stages out (its step tables say so). ``throughput_options``: the "Which budget?" model's
    settings (``config.throughput_options``; None: the defaults); ``distributions``: this run's configured
    distributions (the section shows the first, and ``recorded`` where configured)."""
    import matplotlib  # noqa: PLC0415

    from ddtree_bench import consistency  # noqa: PLC0415

    if grid is not None:
        this = load_machine(summary, shapes, environment, step_summary)
        consistency.check_summary(this.summary, grid, where=f"summary {summary}")
        consistency.check_shapes(this.shapes, grid, where=f"tree shapes beside {summary}")
    matplotlib.use("Agg")
    html_path, md_path = Path(html), Path(markdown)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    if figures is None:
        figures = [html_path.parent / "figures" / f"{name}.png" for name in FIGURE_NAMES]
    figure_paths = {Path(p).stem: Path(p) for p in figures}
    for path in figure_paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)

    machines = load_machines(summary, shapes, environment, published, step=step_summary)
    if not step_enabled:
        machines[0].step = pd.DataFrame()
        machines[0].step_missing = "step stages off (step.enabled: false in the configuration)"
    settings = {
        machine.label: _step_settings(machine, step_layers)
        if machine is not machines[0]
        else {"layers": step_layers, "depth": step_depth, "distribution": step_distribution}
        for machine in machines
    }
    breakdowns = {m.label: step_report.breakdown_for(m, **settings[m.label]) for m in machines}
    budget_sections = throughput_report.sections(
        machines, settings, throughput_options, distributions=distributions, depth=depth
    )
    data = timings(machines)
    titles = {}
    makers = {
        "time_vs_budget": lambda p: figure_time_vs_budget(data, p, depth, distribution),
        "time_vs_batch": lambda p: figure_time_vs_batch(data, p, depth, distribution),
        "speedup": lambda p: figure_speedup(data, p, depth, distribution),
        "tree_shape": lambda p: figure_tree_shape(machines, p, depth),
        "step_share": lambda p: step_report.figure_step_share(breakdowns, p),
        "which_budget": lambda p: throughput_report.figure(budget_sections, p, throughput_options),
    }
    makers["acceptance_tau"] = lambda p: acceptance_report.figure_tau(machines, p)
    makers["acceptance_histogram"] = lambda p: acceptance_report.figure_histogram(
        machines, p, distribution, depth
    )
    for name, path in figure_paths.items():
        if data.empty and name in BUILD_FIGURES and name != "tree_shape":
            _empty_figure(path, "no timings")
            titles[name] = "no timings"
        else:
            titles[name] = makers[name](path)

    target_results = evaluate_targets(machines)
    target_results += [
        TargetResult(*found) for found in throughput_report.budget_targets(budget_sections, machines)
    ]
    machine_order = {m.label: i for i, m in enumerate(machines)}
    target_results.sort(key=lambda r: machine_order.get(r.machine, len(machine_order)))
    targets = _target_frame(target_results)
    medians = medians_table(data)
    unavailable = unavailable_table(machines)
    correctness = correctness_table(machines)
    env_table = environment_table(machines)
    ref_vs_sglang = reference_vs_sglang_table(machines)
    sglang_sources = sglang_source_table(machines)
    compact = {}
    if not data.empty:
        compact = {m.label: compact_table(data, m.label, depth, distribution) for m in machines}
    in_situ = in_situ_tables(data, machines, depth, distribution)
    baselines = {}
    for machine in machines:
        base = baseline_of(data[data["machine"] == machine.label]) if not data.empty else None
        baselines[machine.label] = BASELINE_NAMES.get(base, "none measured")

    intro = (
        "Time to build DDTree draft trees (best-first, SGLang's `build_ddtree_tree_from_topk` contract) "
        "from the same top-K traces with every builder: median of every timed call (warm-up excluded), "
        "p10-p90 band. Every builder's trees were checked equal to `reference`'s on the whole trace before "
        "its timings count. `reference` is our own Python implementation of SGLang's algorithm, not SGLang."
    )
    machines_line = ", ".join(f"{m.label} ({m.source})" for m in machines)
    baseline_line = "; ".join(f"{label}: speedups over {name}" for label, name in baselines.items())
    identity = consistency.trace_identity(machines)  # machines side by side: the same inputs or not
    step = _step_sections(machines, breakdowns, settings)
    tau_table = acceptance_report.tau_table(machines)
    gpu_agreement = acceptance_report.gpu_agreement_line(machines)

    # Markdown
    md = [f"# ddtree-bench report\n\n{intro}\n\nMachines: {machines_line}.\n\nBaselines: {baseline_line}.\n"]
    if identity:
        md.append("Inputs: " + " ".join(identity) + "\n")
    md.append("## Benchmark targets\n\n" + markdown_table(targets))
    if not ref_vs_sglang.empty:
        md.append(f"## {REF_VS_SGLANG_TITLE}\n\n{REF_VS_SGLANG_NOTE}\n\n" + markdown_table(ref_vs_sglang))
    md.append("## Builders that could not run\n\n" + markdown_table(unavailable))
    md.append("## Correctness\n\n" + markdown_table(correctness))
    md.append(f"## What the decode round pays (in-situ)\n\n{IN_SITU_INTRO}\n")
    for label, table in in_situ.items():
        heading = f"### {label} (L = {depth}, {distribution}; per call, p10-p90)"
        md.append(f"{heading}\n\n" + (markdown_table(table) if isinstance(table, pd.DataFrame) else table))
    for label, table in compact.items():
        heading = f"## Medians on {label} (L = {depth}, {distribution}; per call, p10-p90)"
        md.append(f"{heading}\n\n" + markdown_table(table))
    for name, path in figure_paths.items():
        if name in BUILD_FIGURES:
            md.append(f"## {titles[name]}\n\n![{name}](figures/{path.name})\n")
    md.append(f"## Acceptance per budget\n\n{acceptance_report.INTRO}\n")
    if gpu_agreement:
        md.append(gpu_agreement + "\n")
    md.append(markdown_table(tau_table) if not tau_table.empty else "No tree shapes with acceptance.\n")
    for name in acceptance_report.FIGURES:
        if name in figure_paths:
            md.append(f"### {titles[name]}\n\n![{name}](figures/{figure_paths[name].name})\n")
    md += _step_markdown(step, figure_paths.get("step_share"), titles.get("step_share"))
    md += throughput_report.markdown(
        budget_sections,
        throughput_options,
        figure_paths.get("which_budget"),
        titles.get("which_budget"),
        markdown_table,
    )
    md.append("## Environment\n\n" + markdown_table(env_table))
    if not sglang_sources.empty:
        md.append("### SGLang's function: where it came from\n\n" + markdown_table(sglang_sources))
    md.append("## All configurations\n\n" + markdown_table(medians))
    from ddtree_bench.io import atomic_output  # noqa: PLC0415

    with atomic_output(md_path) as tmp:
        Path(tmp).write_text("\n".join(md))

    # HTML (self-contained: figures as base64 PNG)
    def img(name: str) -> str:
        data64 = base64.b64encode(figure_paths[name].read_bytes()).decode("ascii")
        return f'<img alt="{name}" src="data:image/png;base64,{data64}">'

    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>ddtree-bench report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>ddtree-bench report</h1>",
        f"<p>{escape(intro)}</p>",
        f"<p><b>Machines:</b> {escape(machines_line)}<br><b>Baselines:</b> {escape(baseline_line)}</p>",
        *([f"<p><b>Inputs:</b> {escape(' '.join(identity))}</p>"] if identity else []),
        "<h2>Benchmark targets</h2>",
        "<p class='note'>Targets from the pipeline issue (CPU) and the GPU builder issue (stated for the "
        "H200, L = 16, K = N, peaked and uniform traces), evaluated on the medians measured on each "
        "machine.</p>",
        html_table(targets, status_column="status"),
    ]
    if not ref_vs_sglang.empty:
        parts += [
            f"<h2>{escape(REF_VS_SGLANG_TITLE)}</h2>",
            f"<p class='note'>{escape(REF_VS_SGLANG_NOTE)}</p>",
            html_table(ref_vs_sglang),
        ]
    parts += [
        "<h2>Builders that could not run</h2>",
        html_table(unavailable),
        "<h2>Correctness</h2>",
        html_table(correctness),
        "<h2>What the decode round pays (in-situ)</h2>",
        f"<p>{escape(IN_SITU_INTRO)}</p>",
    ]
    for label, table in in_situ.items():
        parts.append(
            f"<h3>{escape(label)} (L = {depth}, {escape(str(distribution))}; per call, p10-p90)</h3>"
        )
        is_table = isinstance(table, pd.DataFrame)
        parts.append(html_table(table) if is_table else f"<p><em>{escape(table)}</em></p>")
    for name in BUILD_FIGURES:
        if name in figure_paths:
            parts += [f"<h2>{escape(titles[name])}</h2>", img(name)]
    for label, table in compact.items():
        parts += [
            f"<h2>Medians on {escape(label)} (L = {depth}, {escape(str(distribution))}; per call, "
            "p10-p90)</h2>",
            html_table(table),
        ]
    parts += ["<h2>Acceptance per budget</h2>", f"<p class='note'>{escape(acceptance_report.INTRO)}</p>"]
    if gpu_agreement:
        parts.append(f"<p>{escape(gpu_agreement)}</p>")
    parts.append(html_table(tau_table) if not tau_table.empty else "<p>No tree shapes with acceptance.</p>")
    for name in acceptance_report.FIGURES:
        if name in figure_paths:
            parts += [f"<h3>{escape(titles[name])}</h3>", img(name)]
    parts += _step_html(
        step, img("step_share") if "step_share" in figure_paths else "", titles.get("step_share")
    )
    parts += throughput_report.html(
        budget_sections,
        throughput_options,
        img("which_budget") if "which_budget" in figure_paths else "",
        titles.get("which_budget"),
        html_table,
    )
    parts += [
        "<h2>Environment</h2>",
        html_table(env_table),
    ]
    if not sglang_sources.empty:
        parts += ["<h3>SGLang's function: where it came from</h3>", html_table(sglang_sources)]
    parts += [
        "<h2>All configurations</h2>",
        f"<details><summary>{len(medians)} rows: median, p10, p90 per call, per tree, speedup</summary>",
        html_table(medians),
        "</details></body></html>",
    ]
    with atomic_output(html_path) as tmp:
        Path(tmp).write_text("\n".join(parts))


# ----------------------------------------------------------------------------------------------- step part


def _step_settings(machine: Machine, layers: int) -> dict:
    """A published machine's step settings, from the configuration in its environment.json (this run's
    layers, and the first in its step rows, where that has none)."""
    config = machine.environment.get("config") or {}
    step = config.get("step") or {}
    depths, distributions = config.get("depths") or [None], config.get("distributions") or [None]
    return {
        "layers": int(step.get("layers") or layers),
        "depth": step.get("depth") or depths[0],
        "distribution": step.get("distribution") or distributions[0],
    }


@dataclass
class StepSections:
    attention: pd.DataFrame
    accept: pd.DataFrame
    peaks: list[tuple[str, str]]
    backends: list[tuple[str, str]]  # (machine, how each attention impl ran)
    breakdown: list[tuple[str, str, pd.DataFrame]]  # (machine, heading note, table)
    acceptance: pd.DataFrame
    missing: list[tuple[str, str]]  # (machine, why it has no step data)


def _step_sections(machines: list[Machine], breakdowns: dict, settings: dict) -> StepSections:
    attention, accept, acceptance, peaks, backends, breakdown, missing = [], [], [], [], [], [], []
    for machine in machines:
        label = machine.label
        layers, depth, distribution = (settings[label][k] for k in ("layers", "depth", "distribution"))
        if machine.step.empty:
            missing.append((label, machine.step_missing))
        else:
            attention.append(step_report.attention_table(machine.step, label))
            accept.append(step_report.accept_table(machine.step, label))
            peaks.append((label, step_report.peaks_line(machine.step)))
            line = step_report.backends_line(machine.step)
            if line:
                backends.append((label, line))
            table = step_report.breakdown_table(breakdowns[label], label, layers)
            where = ", ".join(x for x in (f"L = {depth}" if depth else "", str(distribution or "")) if x)
            note = f"{layers} layers; {where} trees" if where else f"{layers} layers"
            breakdown.append((label, note, table))
        table = step_report.acceptance_table(machine.shapes, label, depth, distribution)
        if table.empty and not machine.step.empty:  # shapes from before the expected acceptance was kept
            table = step_report.acceptance_from_accept(machine.step, label)
        acceptance.append(table)

    def concat(frames):
        frames = [f for f in frames if not f.empty]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    return StepSections(
        concat(attention), concat(accept), peaks, backends, breakdown, concat(acceptance), missing
    )


STEP_INTRO = (
    "The decode step around the tree build, measured on the same GPU in the same run: the tree-verify "
    "attention of one layer at Kimi K2.6's shapes (absorbed MLA: 576-wide latent keys, 512-wide values, one "
    "shared latent KV head; every request's N+1 tree queries see its S prefix keys and their tree "
    "ancestors), by our kernel and its peers (PyTorch's; FlashMLA, which has no tree mask and runs causal, "
    "as its rows' mask says; SGLang's Triton tree kernel), timed by CUDA events (warm L2; cold-L2 samples "
    "are "
    "in step_summary.parquet); the tree accept walk; and the GPU's peaks. TFLOP/s and TB/s are the work of "
    "one call (FLOPs of the visible keys; bytes moved at least once) over its time, median over the calls, "
    "and as % of the measured bf16 GEMM and device-copy peaks."
)
BREAKDOWN_INTRO = (
    "Per (S, batch B, budget N): each builder's tree build (median per call; in-situ where measured: what "
    "the decode round pays from the drafter's top-K on the GPU to the tree on the GPU; else CPU builders "
    "by wall clock and the GPU builder both kernel-only and host-inclusive), our verify attention for all "
    "layers (per-layer median x layers), and the accept (the GPU kernel); in brackets the build's share of "
    "build + attention + accept. E[accepted] is the expected number of accepted draft tokens of the "
    "budget's trees (the sum over nodes of the path probability under the drafter's distributions): what a "
    "larger budget buys, beside what it costs."
)


def _missing_lines(step: StepSections) -> list[str]:
    return [f"{label}: no data ({why})" for label, why in step.missing]


def _step_markdown(step: StepSections, figure_path, title) -> list[str]:
    md = [f"## Verify attention\n\n{STEP_INTRO}\n"]
    md += [f"- {line}" for line in _missing_lines(step)] + ([""] if step.missing else [])
    peaks = "; ".join(f"{label}: {line}" for label, line in step.peaks) or "no data"
    md.append(f"GPU peaks: {peaks}\n")
    md += [f"How each impl ran ({label}): {line}\n" for label, line in step.backends]
    md.append(markdown_table(step.attention) if not step.attention.empty else "_no data_\n")
    md.append(
        "## Tree accept\n\nGPU kernel (CUDA events), host-inclusive (launch, copies out, sync), the "
        "CPU walk including the device-to-host copy of the target's tokens, and the empty-kernel floor "
        "of the same run.\n"
    )
    md.append(markdown_table(step.accept) if not step.accept.empty else "_no data_\n")
    md.append(f"## Step-time breakdown\n\n{BREAKDOWN_INTRO}\n\n**Left out:** {step_report.LEFT_OUT}\n")
    md += [f"- {line}" for line in _missing_lines(step)] + ([""] if step.missing else [])
    for label, note, table in step.breakdown:
        md.append(f"### {label} ({note})\n\n" + (markdown_table(table) if not table.empty else "_no data_\n"))
    if figure_path is not None:
        md.append(f"### {title}\n\n![step_share](figures/{Path(figure_path).name})\n")
    md.append(
        "### Expected acceptance per budget\n\n"
        + (markdown_table(step.acceptance) if not step.acceptance.empty else "_no data_\n")
    )
    return md


def _step_html(step: StepSections, image: str, title) -> list[str]:
    def table(df):
        return html_table(df) if not df.empty else "<p><em>no data</em></p>"

    missing = "".join(f"<li>{escape(line)}</li>" for line in _missing_lines(step))
    missing = f"<ul>{missing}</ul>" if missing else ""
    peaks = "; ".join(f"{label}: {line}" for label, line in step.peaks) or "no data"
    parts = [
        "<h2>Verify attention</h2>",
        f"<p>{escape(STEP_INTRO)}</p>",
        missing,
        f"<p><b>GPU peaks:</b> {escape(peaks)}</p>",
        *(
            f"<p><b>How each impl ran ({escape(label)}):</b> {escape(line)}</p>"
            for label, line in step.backends
        ),
        f"<details open><summary>{len(step.attention)} rows</summary>{table(step.attention)}</details>",
        "<h2>Tree accept</h2>",
        "<p>GPU kernel (CUDA events), host-inclusive (launch, copies out, sync), the CPU walk including the "
        "device-to-host copy of the target's tokens, and the empty-kernel floor of the same run.</p>",
        table(step.accept),
        "<h2>Step-time breakdown</h2>",
        f"<p>{escape(BREAKDOWN_INTRO)}</p>",
        f"<p><b>Left out:</b> {escape(step_report.LEFT_OUT)}</p>",
        missing,
    ]
    for label, note, df in step.breakdown:
        parts += [f"<h3>{escape(label)} ({escape(note)})</h3>", table(df)]
    if image:
        parts += [f"<h3>{escape(str(title))}</h3>", image]
    parts += ["<h3>Expected acceptance per budget</h3>", table(step.acceptance)]
    return parts
