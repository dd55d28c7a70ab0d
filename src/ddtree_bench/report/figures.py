"""The report's figures (PNG) and the layout every figure shares: panels that fill the width, one legend
below, no panel without data, no title inside the image (the page's heading and caption carry it).

Each ``figure_*`` function takes the model's inputs (``model.FigureInputs``: machines, timings, depth,
distribution, ...) and a path, draws the PNG, and returns the caption's second part: what its rows are."""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import numpy as np
import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.catalog import IN_SITU
from ddtree_bench.report.fmt import regime
from ddtree_bench.report.load import BASELINE_NAMES, select_rows, speedups
from ddtree_bench.report.names import (
    BUILDER_LABELS,
    BUILDER_STYLES,
    IN_SITU_TIMINGS,
    PER_CALL_TIMING,
    SERIES_COLORS,
    SERIES_ORDER,
)

#: The width of every figure, in inches (at 100 dpi it is the page's width).
WIDTH = 12.0
DPI = 100

_collected: list | None = None


@contextmanager
def collect_figures():
    """Within it, every figure saved is kept open and appended to the yielded list as ``(name, figure)``
    (to inspect its panels), and closed on leaving."""
    global _collected
    import matplotlib.pyplot as plt  # noqa: PLC0415

    previous, _collected = _collected, []
    kept = _collected
    try:
        yield kept
    finally:
        _collected = previous
        for _, fig in kept:
            plt.close(fig)


def save_figure(fig, path) -> None:
    """Save a figure (PNG) and close it (or keep it, inside ``collect_figures``)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig.savefig(path, dpi=DPI)
    if _collected is not None:
        _collected.append((getattr(path, "stem", str(path)), fig))
    else:
        plt.close(fig)


def empty_figure(path, message: str) -> None:
    """A figure holding only a message (no axes: no empty panel)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig = plt.figure(figsize=(WIDTH, 0.9))
    fig.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, wrap=True)
    save_figure(fig, path)


def panels(rows: int, cols: int, *, height: float = 3.0, sharey: bool | str = False):
    """A grid of panels that fills the figure's width, laid out so that titles and labels do not overlap."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(WIDTH, height * rows + 0.8),
        squeeze=False,
        sharey=sharey,
        layout="constrained",
    )
    return fig, axes


def finish(fig, axes, path, *, ncol: int = 5, extra=()) -> None:
    """Remove the panels without data, put one legend (every label once) below the panels, save."""
    handles, names = [], []
    for ax in np.ravel(axes):
        if not ax.has_data():
            ax.remove()
            continue
        for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
            if name not in names:
                handles.append(handle)
                names.append(name)
    for handle, name in extra:
        handles.append(handle)
        names.append(name)
    if handles:
        fig.legend(handles, names, loc="outside lower center", ncol=min(ncol, len(names)), frameon=False)
    save_figure(fig, path)


def budget_axis(ax, ticks, fontsize: int = 8) -> None:
    """A log-2 x axis ticked at the real budgets (8, 16, ..., 1024), not at powers written as 2^k."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(v) for v in ticks], fontsize=fontsize)
    ax.minorticks_off()


def log_y(ax) -> None:
    with warnings.catch_warnings():  # a flat series (one value) is drawn fine; no need to say so
        warnings.simplefilter("ignore", UserWarning)
        ax.set_yscale("log")


def builder_line(ax, builder: str, x, y, *, band=None, label: str | None = None) -> None:
    """A builder's one line in a panel (its colour, marker and line style everywhere); ``gid`` names the
    builder, so that a check can count lines per builder."""
    color, marker, style = BUILDER_STYLES.get(builder, ("#333333", "o", "-"))
    (line,) = ax.plot(
        x,
        y,
        color=color,
        marker=marker,
        linestyle=style,
        markersize=4.5,
        linewidth=1.6,
        label=label or BUILDER_LABELS.get(builder, builder),
    )
    line.set_gid(builder)
    if band is not None:
        ax.fill_between(x, band[0], band[1], color=color, alpha=0.15, linewidth=0)


# ----------------------------------------------------------------------------------------- row selection


def select_each(data: pd.DataFrame, depth, distribution) -> tuple[pd.DataFrame, int | None, str | None]:
    """Each machine's rows at the report's depth and distribution, or, where it has none, at its own first
    (its panels then name what they show): every machine's numbers are in the figures."""
    if data.empty:
        return data, depth, distribution
    frames, shown = [], []
    for machine, rows in data.groupby("machine", sort=False):
        if len(rows["budget"].unique()) > 1 and (rows["depth"] == rows["budget"]).all():
            # SGLang's regime (depth_follows_budget): one depth per budget, L = N; every budget is shown
            has = (rows["distribution"] == distribution).any()
            used = distribution if has else rows["distribution"].iloc[0]
            frames.append(rows[rows["distribution"] == used].assign(machine=f"{machine}: {used}, L = N"))
            shown.append((depth, used))
            continue
        sel, used_depth, used = select_rows(rows, depth, distribution)
        if (used_depth, used) != (depth, distribution):
            sel = sel.assign(machine=f"{machine}: {used}, L = {used_depth}")
        shown.append((used_depth, used))
        frames.append(sel)
    out = pd.concat(frames, ignore_index=True)
    if (depth, distribution) not in shown:
        depth, distribution = shown[0]
    return out, depth, distribution


def others_note(sel: pd.DataFrame, distribution) -> str:
    """The caption's note on the machines shown at their own depth or distribution (their panels say
    which)."""
    other = sorted({m for m in sel["machine"] if ": " in m})
    if not other:
        return ""
    each = ", ".join(f"{name} ({what})" for name, what in (m.split(": ", 1) for m in other))
    return f"; machines without these rows at their own: {each}"


def main_rows(sel: pd.DataFrame) -> pd.DataFrame:
    """One series per builder and machine: the in-situ one (``in-situ``: the gpu's bool-mask graph replay)
    where the machine measured in-situ rows, else its per-call one (``PER_CALL_TIMING``). ``mode`` says
    which."""
    frames = []
    for _, rows in sel.groupby("machine", sort=False):
        in_situ = rows["timing"].isin(IN_SITU_TIMINGS).any()
        if in_situ:
            pick = rows[rows["timing"] == IN_SITU].assign(mode=IN_SITU)
        else:
            wanted = rows["builder"].map(lambda b: PER_CALL_TIMING.get(b, "wall"))
            pick = rows[rows["timing"] == wanted].assign(mode="per call")
        frames.append(pick[pick["builder"].isin(list(BUILDER_STYLES))])
    return pd.concat(frames, ignore_index=True) if frames else sel.iloc[:0]


def _panel_grid(rows: pd.DataFrame, col: str):
    machines = list(dict.fromkeys(rows["machine"]))
    cols = sorted({int(v) for v in rows[col]})
    return machines, cols


def _builders(rows: pd.DataFrame) -> list[str]:
    present = set(rows["builder"])
    return [b for b in BUILDER_STYLES if b in present]


def _selection(sel: pd.DataFrame, depth, distribution) -> str:
    budgets = sel.loc[sel["machine"].str.contains(": ") == False, "budget"]  # noqa: E712
    return f"{distribution} trace, {regime(depth, budgets)}{others_note(sel, distribution)}"


# ----------------------------------------------------------------------------------------- figures


def figure_time_vs_budget(inputs, path) -> str:
    sel, depth, distribution = select_each(inputs.data, inputs.depth, inputs.distribution)
    rows = main_rows(sel) if not sel.empty else sel
    if rows.empty:
        empty_figure(path, "no timings")
        return "No timings."
    machines, batches = _panel_grid(rows, "batch")
    fig, axes = panels(len(machines), len(batches))
    ticks = sorted({int(v) for v in rows["budget"]})
    for i, machine in enumerate(machines):
        for j, batch in enumerate(batches):
            ax = axes[i][j]
            panel = rows[(rows["machine"] == machine) & (rows["batch"] == batch)]
            for builder in _builders(panel):
                line = panel[panel["builder"] == builder].sort_values("budget")
                us = 1e6
                builder_line(
                    ax,
                    builder,
                    line["budget"],
                    line["median_s"] * us,
                    band=(line["p10_s"] * us, line["p90_s"] * us),
                )
            if not panel.empty:
                budget_axis(ax, ticks)
                log_y(ax)
                ax.grid(True, alpha=0.3)
                ax.set_title(f"{machine}, B = {batch} ({panel['mode'].iloc[0]})", fontsize=10)
                ax.set_xlabel("budget N (nodes per tree)")
                ax.set_ylabel("tree build, µs per call (median)")
    finish(fig, axes, path)
    return f"Rows: {_selection(sel, depth, distribution)}."


def figure_speedup(inputs, path) -> str:
    sel, depth, distribution = select_each(inputs.data, inputs.depth, inputs.distribution)
    rows = main_rows(sel) if not sel.empty else sel
    # the baseline's own row of the same mode, beside each machine's main rows
    sp = speedups(pd.concat([rows, _baseline_rows(sel, rows)], ignore_index=True)) if len(rows) else rows
    if sp.empty:
        empty_figure(path, "no speedups: neither sglang nor reference was measured")
        return "No speedups."
    keys = ["machine", "builder", "timing", "budget", "batch"]
    shown = set(rows[keys].itertuples(index=False, name=None))  # each builder's one series, no other
    sp = sp[[key in shown for key in sp[keys].itertuples(index=False, name=None)]]
    machines, batches = _panel_grid(sp, "batch")
    fig, axes = panels(len(machines), len(batches))
    ticks = sorted({int(v) for v in sp["budget"]})
    for i, machine in enumerate(machines):
        for j, batch in enumerate(batches):
            ax = axes[i][j]
            panel = sp[(sp["machine"] == machine) & (sp["batch"] == batch)]
            for builder in _builders(panel):
                line = panel[panel["builder"] == builder].sort_values("budget")
                builder_line(ax, builder, line["budget"], line["speedup"])
            if panel.empty:
                continue
            budget_axis(ax, ticks)
            log_y(ax)
            ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle="--")
            ax.grid(True, alpha=0.3)
            base = BASELINE_NAMES[panel["baseline"].iloc[0]]
            mode = IN_SITU if (panel["mode"] == IN_SITU).all() else "per call"
            ax.set_title(f"{machine}, B = {batch}: vs {base} ({mode})", fontsize=10)
            ax.set_xlabel("budget N (nodes per tree)")
            ax.set_ylabel("speedup, x (baseline median / median)")
    finish(fig, axes, path)
    modes = set(sp["mode"])
    what = "in-situ: what the decode round pays" if modes == {IN_SITU} else "in-situ where measured"
    if IN_SITU not in modes:
        what = "per call, wall clock"
    elif len(modes) > 1:
        what += ", else per call"
    return f"Speedups ({what}); rows: {_selection(sel, depth, distribution)}."


def _baseline_rows(sel: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The baselines' rows ``speedups`` divides by (their wall clock and in-situ rows), not in ``rows``."""
    base = sel[sel["builder"].isin(list(BASELINE_NAMES)) & sel["timing"].isin([catalog.WALL, IN_SITU])]
    keys = ["machine", "builder", "timing", "budget", "batch", "depth", "distribution"]
    shown = set(rows[keys].itertuples(index=False, name=None))
    return base[[key not in shown for key in base[keys].itertuples(index=False, name=None)]]


def figure_time_vs_batch(inputs, path) -> str:
    """Per-tree time at each larger batch over per-tree time at the smallest, per builder and budget."""
    sel, depth, distribution = select_each(inputs.data, inputs.depth, inputs.distribution)
    rows = main_rows(sel) if not sel.empty else sel
    keys = ["machine", "builder", "budget"]
    frames = []
    for machine, group in rows.groupby("machine", sort=False) if len(rows) else ():
        batches = sorted({int(b) for b in group["batch"]})
        if len(batches) < 2:
            continue
        first = group[group["batch"] == batches[0]][[*keys, "median_per_tree_s"]]
        for batch in batches[1:]:
            other = group[group["batch"] == batch]
            pair = other.merge(first, on=keys, suffixes=("", "_first"))
            frames.append(
                pair.assign(
                    ratio=pair["median_per_tree_s"] / pair["median_per_tree_s_first"],
                    panel=f"{machine}: B = {batch} vs B = {batches[0]} ({pair['mode'].iloc[0]})"
                    if len(pair)
                    else machine,
                )
            )
    data = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if data.empty:
        empty_figure(path, "one batch size measured: nothing to compare")
        return "One batch size measured."
    names = list(dict.fromkeys(data["panel"]))
    cols = min(2, len(names))
    fig, axes = panels((len(names) + cols - 1) // cols, cols)
    ticks = sorted({int(v) for v in data["budget"]})
    for k, name in enumerate(names):
        ax = axes[k // cols][k % cols]
        panel = data[data["panel"] == name]
        batch = int(panel["batch"].iloc[0])
        for builder in _builders(panel):
            line = panel[panel["builder"] == builder].sort_values("budget")
            builder_line(ax, builder, line["budget"], line["ratio"])
        budget_axis(ax, ticks)
        log_y(ax)
        ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle="--")
        ax.axhline(1.0 / batch, color="0.6", linewidth=0.8, linestyle=":")
        ax.grid(True, alpha=0.3)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("budget N (nodes per tree)")
        ax.set_ylabel("per-tree time, larger batch / batch 1")
    finish(fig, axes, path)
    return (
        f"Dashed: 1 (no gain); dotted: 1/B (the batch costs what one tree costs). Rows: "
        f"{_selection(sel, depth, distribution)}."
    )


def figure_timing_variants(inputs, path) -> str:
    """Every series: a panel per builder (columns) and (machine, batch) (rows), a line per timing."""
    from matplotlib.ticker import NullFormatter  # noqa: PLC0415

    sel, depth, distribution = select_each(inputs.data, inputs.depth, inputs.distribution)
    if sel.empty:
        empty_figure(path, "no timings")
        return "No timings."
    shown = _selection(sel, depth, distribution)
    sel = sel.assign(machine=sel["machine"].str.split(":").str[0])  # the caption names each one's rows
    builders = _builders(sel)
    groups = list(dict.fromkeys(zip(sel["machine"], sel["batch"], strict=True)))
    fig, axes = panels(len(groups), len(builders), height=2.6)
    ticks = sorted({int(v) for v in sel["budget"]})
    order = {s: i for i, s in enumerate(SERIES_ORDER)}
    for i, (machine, batch) in enumerate(groups):
        for j, builder in enumerate(builders):
            ax = axes[i][j]
            panel = sel[(sel["machine"] == machine) & (sel["batch"] == batch) & (sel["builder"] == builder)]
            for series in sorted(set(panel["series"]), key=lambda s: order.get(s, len(order))):
                line = panel[panel["series"] == series].sort_values("budget")
                ax.plot(
                    line["budget"],
                    line["median_s"] * 1e6,
                    marker="o",
                    markersize=3.5,
                    linewidth=1.3,
                    color=SERIES_COLORS.get(series, "#333333"),
                    label=series,
                )
            if panel.empty:
                continue
            budget_axis(ax, ticks[:: max(1, len(ticks) // 4)], fontsize=8)
            log_y(ax)
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, alpha=0.3)
            ax.set_title(f"{builder}: {machine}, B = {batch}", fontsize=8)
            if i == len(groups) - 1:
                ax.set_xlabel("budget N", fontsize=8)
            if j == 0:
                ax.set_ylabel("µs per call (median)", fontsize=8)
    finish(fig, axes, path, ncol=3)
    return f"Rows: {shown}."


def figure_tree_shape(machines, path, depth) -> str:
    shapes = next((m.shapes for m in machines if not m.shapes.empty), pd.DataFrame())
    if shapes.empty:
        empty_figure(path, "no tree shapes")
        return "No tree shapes."
    if depth not in set(shapes["depth"]):
        depth = int(shapes["depth"].iloc[0])
    sel = shapes[shapes["depth"] == depth]
    distributions = list(dict.fromkeys(sel["distribution"]))
    cols = min(2, len(distributions))
    fig, axes = panels((len(distributions) + cols - 1) // cols, cols, height=3.6, sharey=True)
    budgets = sorted(int(b) for b in sel["budget"].unique())
    import matplotlib as mpl  # noqa: PLC0415
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    colors = mpl.colormaps["viridis"](np.linspace(0.0, 0.9, len(budgets)))
    for k, distribution in enumerate(distributions):
        ax = axes[k // cols][k % cols]
        part = sel[sel["distribution"] == distribution]
        for color, budget in zip(colors, budgets, strict=True):
            line = part[part["budget"] == budget].sort_values("tree_depth")
            ax.plot(line["tree_depth"], line["nodes_mean"], "o-", ms=3, color=color, label=f"N = {budget}")
        ax.set_yscale("symlog", linthresh=0.01)  # depths no tree reaches (0) stay visible
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.set_title(f"{distribution} trees", fontsize=10)
        ax.set_xlabel("tree depth d (block position)")
        ax.set_ylabel("nodes at depth d (mean)")
    finish(fig, axes, path, ncol=8)
    return f"L = {depth}; all requests of each trace."


def figure_tree_shape_for_report(inputs, path) -> str:
    return figure_tree_shape(inputs.machines, path, inputs.depth)
