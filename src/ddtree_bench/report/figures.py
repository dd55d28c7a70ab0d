"""The report's figures (PNG) and the layout every figure shares: seaborn's facet grids that fill the width,
its colour-blind palette, text of at least 9 points at the page's width, one legend below (at most 8 entries
each), no panel without data, no title inside the image (the page's heading and caption carry it).

Each ``figure_*`` function takes the model's inputs (``model.FigureInputs``: machines, timings, depth,
distribution, ...) and a path, draws the PNG, and returns the caption's second part: what its rows are."""

from __future__ import annotations

import re
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
)

#: The width of every figure, in inches (at 100 dpi it is the page's width: a point of text is a point).
WIDTH = 12.0
DPI = 100
#: seaborn's palette of every categorical colour ("CN" in the catalog: its Nth colour).
PALETTE = "colorblind"
#: The smallest text in a figure, in points at the page's width.
MIN_FONT = 9
#: The report's font sizes (seaborn's plotting context, overridden).
FONTS = {
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "xtick.labelsize": MIN_FONT,
    "ytick.labelsize": MIN_FONT,
    "legend.fontsize": 10,
    "legend.title_fontsize": 10,
}

_collected: list | None = None


@contextmanager
def theme():
    """Within it, figures take seaborn's white-grid style, its colour-blind palette as the colour cycle and
    the report's font sizes."""
    import seaborn as sns  # noqa: PLC0415

    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", rc=FONTS), sns.color_palette(PALETTE):
        yield


def palette() -> list[str]:
    """The categorical colours (hex), in seaborn's order."""
    import seaborn as sns  # noqa: PLC0415

    return sns.color_palette(PALETTE).as_hex()


def colour(name: str) -> str:
    """A colour of the catalog: "CN" is the palette's Nth, anything else a matplotlib colour as given."""
    match = re.fullmatch(r"C(\d+)", name)
    if match is None:
        return name
    colours = palette()
    return colours[int(match.group(1)) % len(colours)]


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


def facets(data: pd.DataFrame, *, height: float = 3.0, **grid):
    """seaborn's ``FacetGrid`` of ``data`` (``grid``: its row, col, col_wrap, hue, ... arguments) that fills
    the figure's width, each panel with its own axes' scales; ``finish`` lays it out."""
    import seaborn as sns  # noqa: PLC0415

    grid.setdefault("sharex", False)
    grid.setdefault("sharey", False)
    cols = grid.get("col_wrap") or (data[grid["col"]].nunique() if grid.get("col") else 1)
    rows = data[grid["row"]].nunique() if grid.get("row") else 1
    if grid.get("col_wrap"):
        cols = min(cols, data[grid["col"]].nunique())
        rows = -(-data[grid["col"]].nunique() // cols)
    g = sns.FacetGrid(data, height=height, aspect=WIDTH / (cols * height), dropna=False, **grid)
    g.figure.set_size_inches(WIDTH, height * rows + 0.8)
    return g


def builder_facets(data: pd.DataFrame, **grid):
    """Facets of ``data`` with a line per builder (column ``builder``): its colour, marker and line style
    everywhere (``BUILDER_STYLES``); draw with ``g.map_dataframe(builder_series, x=..., y=...)``."""
    builders = [b for b in BUILDER_STYLES if b in set(data["builder"])]
    styles = [BUILDER_STYLES[b] for b in builders]
    return facets(
        data,
        hue="builder",
        hue_order=builders,
        palette=[colour(c) for c, _, _ in styles],
        hue_kws={"marker": [m for _, m, _ in styles], "linestyle": [ls for _, _, ls in styles]},
        **grid,
    )


def builder_series(*, data, x, y, color, label, band=None, name=None, **style) -> None:
    """A builder's one line in a facet (``FacetGrid.map_dataframe``): ``label`` is the builder, set as the
    line's ``gid`` (a check counts lines per builder) and named in the legend by ``BUILDER_LABELS`` (or by
    the rows' column ``name``); ``band``: the columns of a shaded band (low, high); ``style``: the line's
    marker and linestyle (``builder_facets``' per-builder keywords)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    ax = plt.gca()
    line = data.sort_values(x)
    (drawn,) = ax.plot(
        line[x],
        line[y],
        color=color,
        marker=style["marker"],
        linestyle=style["linestyle"],
        markersize=5,
        linewidth=1.7,
        label=str(line[name].iloc[0]) if name else BUILDER_LABELS.get(label, label),
    )
    drawn.set_gid(label)
    if band is not None:
        ax.fill_between(line[x], line[band[0]], line[band[1]], color=color, alpha=0.15, linewidth=0)


def panels(rows: int, cols: int, *, height: float = 3.0, sharey: bool | str = False):
    """A grid of ``rows`` x ``cols`` facets (seaborn's, over the panels' positions) for figures whose panels
    are not one frame's columns; returns (figure, 2-d array of axes)."""
    keys = pd.DataFrame([(i, j) for i in range(rows) for j in range(cols)], columns=["panel row", "panel"])
    g = facets(keys, row="panel row", col="panel", height=height, sharey=sharey)
    return g.figure, g.axes


def finish(fig, axes, path, *, ncol: int = 5, extra=(), xlabel=None, ylabel=None, legends=None) -> None:
    """Remove the panels without data, name the axes on the outer panels (``xlabel`` below each column's
    lowest, ``ylabel`` beside each row's first), put the legend below the panels (every label once, then
    ``extra``'s (handle, label) pairs; or ``legends``: a list of such lists, one legend each, side by side),
    and save."""
    fig.set_layout_engine("constrained")
    kept = []
    for ax in np.ravel(axes):
        if ax.has_data():
            kept.append(ax)
        else:
            ax.remove()
    outer_labels(kept, xlabel, ylabel)
    if legends is None:
        entries = {}
        for ax in kept:
            for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
                entries.setdefault(name, handle)
        legends = [[(handle, name) for name, handle in entries.items()] + list(extra)]
    legends = [legend for legend in legends if legend]
    places = {1: ["center"], 2: ["left", "right"], 3: ["left", "center", "right"]}[len(legends) or 1]
    for place, legend in zip(places, legends, strict=False):
        handles, names = zip(*legend, strict=True)
        columns = min(ncol, len(names)) if len(legends) == 1 else -(-len(names) // 2)
        fig.legend(handles, names, loc=f"outside lower {place}", ncol=columns, frameon=False)
    save_figure(fig, path)


def outer_labels(kept, xlabel, ylabel) -> None:
    """Axis labels on the outer panels of a grid (some of whose panels were removed): ``xlabel`` on the lowest
    panel of each column, ``ylabel`` on the first of each row, no label elsewhere."""
    if xlabel is None and ylabel is None:
        return
    spans = {ax: ax.get_subplotspec() for ax in kept}
    for ax, spec in spans.items():
        row, col = spec.rowspan.start, spec.colspan.start
        if xlabel is not None:
            lowest = not any(s.colspan.start == col and s.rowspan.start > row for s in spans.values())
            ax.set_xlabel(xlabel if lowest else "")
        if ylabel is not None:
            first = not any(s.rowspan.start == row and s.colspan.start < col for s in spans.values())
            ax.set_ylabel(ylabel if first else "")


def budget_axis(ax, ticks, *, every: int = 1) -> None:
    """A log-2 x axis ticked at the real budgets (8, 16, ..., 1024), not at powers written as 2^k; with
    ``every`` > 1 only every so many ticks is labelled (narrow panels)."""
    ticks = sorted(ticks)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(v) if k % every == 0 else "" for k, v in enumerate(ticks)])
    ax.minorticks_off()


def log_y(ax) -> None:
    with warnings.catch_warnings():  # a flat series (one value) is drawn fine; no need to say so
        warnings.simplefilter("ignore", UserWarning)
        ax.set_yscale("log")


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


def _builders(rows: pd.DataFrame) -> list[str]:
    present = set(rows["builder"])
    return [b for b in BUILDER_STYLES if b in present]


def _selection(sel: pd.DataFrame, depth, distribution) -> str:
    budgets = sel.loc[sel["machine"].str.contains(": ") == False, "budget"]  # noqa: E712
    return f"{distribution} trace, {regime(depth, budgets)}{others_note(sel, distribution)}"


# ----------------------------------------------------------------------------------------- figures


def facet_panels(g, rows: pd.DataFrame, *names: str):
    """Each facet's axes with its rows (facets without rows left out); ``names``: the grid's row and column
    variables, as given to it."""
    for key, ax in g.axes_dict.items():
        key = key if isinstance(key, tuple) else (key,)
        panel = rows[np.logical_and.reduce([rows[n] == v for n, v in zip(names, key, strict=True)])]
        if len(panel):
            yield ax, panel


def figure_time_vs_budget(inputs, path) -> str:
    sel, depth, distribution = select_each(inputs.data, inputs.depth, inputs.distribution)
    rows = main_rows(sel) if not sel.empty else sel
    if rows.empty:
        empty_figure(path, "no timings")
        return "No timings."
    us = 1e6
    rows = rows.assign(us=rows["median_s"] * us, p10_us=rows["p10_s"] * us, p90_us=rows["p90_s"] * us)
    g = builder_facets(rows, row="machine", col="batch")
    g.map_dataframe(builder_series, x="budget", y="us", band=("p10_us", "p90_us"))
    ticks = sorted({int(v) for v in rows["budget"]})
    for ax, panel in facet_panels(g, rows, "machine", "batch"):
        budget_axis(ax, ticks)
        log_y(ax)
        ax.set_title(f"{panel['machine'].iloc[0]}, B = {panel['batch'].iloc[0]} ({panel['mode'].iloc[0]})")
    finish(
        g.figure,
        g.axes,
        path,
        xlabel="budget N (nodes per tree)",
        ylabel="tree build, µs per call (median)",
    )
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
    g = builder_facets(sp, row="machine", col="batch")
    g.map_dataframe(builder_series, x="budget", y="speedup")
    ticks = sorted({int(v) for v in sp["budget"]})
    for ax, panel in facet_panels(g, sp, "machine", "batch"):
        budget_axis(ax, ticks)
        log_y(ax)
        ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle="--")
        base = BASELINE_NAMES[panel["baseline"].iloc[0]]
        mode = IN_SITU if (panel["mode"] == IN_SITU).all() else "per call"
        ax.set_title(f"{panel['machine'].iloc[0]}, B = {panel['batch'].iloc[0]}: vs {base} ({mode})")
    finish(
        g.figure,
        g.axes,
        path,
        xlabel="budget N (nodes per tree)",
        ylabel="speedup, x (baseline median / median)",
    )
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
    g = builder_facets(data, col="panel", col_wrap=min(2, len(names)), col_order=names)
    g.map_dataframe(builder_series, x="budget", y="ratio")
    ticks = sorted({int(v) for v in data["budget"]})
    for ax, panel in facet_panels(g, data, "panel"):
        batch = int(panel["batch"].iloc[0])
        budget_axis(ax, ticks)
        log_y(ax)
        ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle="--")
        ax.axhline(1.0 / batch, color="0.6", linewidth=0.8, linestyle=":")
        ax.set_title(panel["panel"].iloc[0])
    finish(
        g.figure,
        g.axes,
        path,
        xlabel="budget N (nodes per tree)",
        ylabel="per-tree time, larger batch / batch 1",
    )
    return (
        f"Dashed: 1 (no gain); dotted: 1/B (the batch costs what one tree costs). Rows: "
        f"{_selection(sel, depth, distribution)}."
    )


def _variant_line(*, data, color, label) -> None:
    """One kind of timing's lines in a timing-variants panel: solid (bool mask, or none) or dashed (packed
    bits only), dots (warm) or crosses (cold L2)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    ax = plt.gca()
    for (packed, cold), line in data.groupby(["packed", "cold"], sort=True):
        line = line.sort_values("budget")
        ax.plot(
            line["budget"],
            line["median_s"] * 1e6,
            color=color,
            linestyle="--" if packed else "-",
            marker="x" if cold else "o",
            markersize=5 if cold else 3.5,
            linewidth=1.4,
            label=f"_{label}",  # the legends are the figure's (kinds; variants)
        )


def figure_timing_variants(inputs, path) -> str:
    """Every series: a panel per builder (columns) and (machine, batch) (rows); a colour per kind of timing,
    dashed where the packed-bit mask only, crosses where the L2 cache was flushed."""
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.ticker import NullFormatter  # noqa: PLC0415

    sel, depth, distribution = select_each(inputs.data, inputs.depth, inputs.distribution)
    if sel.empty:
        empty_figure(path, "no timings")
        return "No timings."
    shown = _selection(sel, depth, distribution)
    series = catalog.all_series()
    kinds = [series[key].kind for key in zip(sel["builder"], sel["timing"], strict=True)]
    sel = sel.assign(
        machine=sel["machine"].str.split(":").str[0],  # the caption names each one's rows
        kind=kinds,
        packed=[series[key].packed for key in zip(sel["builder"], sel["timing"], strict=True)],
        cold=sel["cache"] == "cold" if "cache" in sel else False,
    )
    sel = sel.assign(group=[f"{m}, B = {b}" for m, b in zip(sel["machine"], sel["batch"], strict=True)])
    builders = _builders(sel)
    present = [k for k in catalog.TIMING_KINDS if k in set(sel["kind"])]
    g = facets(
        sel,
        row="group",
        col="builder",
        row_order=list(dict.fromkeys(sel["group"])),
        col_order=builders,
        hue="kind",
        hue_order=present,
        palette=[colour(catalog.TIMING_KINDS[k]) for k in present],
        height=2.5,
        margin_titles=True,
    )
    g.map_dataframe(_variant_line)
    g.set_titles(row_template="{row_name}", col_template="{col_name}")
    for builder, ax in zip(builders, g.axes[0], strict=True):
        copies = catalog.BUILDERS[builder].copies
        ax.set_title(builder if copies == catalog.DEVICE else f"{builder}\n(in-situ: {copies} copies)")
    ticks = sorted({int(v) for v in sel["budget"]})
    for ax in np.ravel(g.axes):
        if not ax.has_data():
            continue
        budget_axis(ax, ticks, every=2)
        log_y(ax)
        ax.yaxis.set_minor_formatter(NullFormatter())
    kinds_legend = [(Line2D([], [], color=colour(catalog.TIMING_KINDS[k]), linewidth=2), k) for k in present]
    variants = []
    if sel["packed"].any():
        variants += [
            (Line2D([], [], color="0.3", linestyle="-", marker="o", markersize=3.5), "gpu: bool mask"),
            (
                Line2D([], [], color="0.3", linestyle="--", marker="o", markersize=3.5),
                "gpu: packed bits only",
            ),
        ]
    if sel["cold"].any():
        variants.append((Line2D([], [], color="0.3", linestyle="-", marker="x", markersize=5), "cold L2"))
    finish(
        g.figure,
        g.axes,
        path,
        ncol=6,
        xlabel="budget N",
        ylabel="µs per call (median)",
        legends=[kinds_legend, variants],
    )
    return f"Rows: {shown}."


def figure_tree_shape(machines, path, depth) -> str:
    """Nodes per depth, a panel per distribution, a line per budget coloured along a sequential scale (a
    colour bar names the budgets: more than a legend's 8 entries)."""
    import seaborn as sns  # noqa: PLC0415
    from matplotlib.cm import ScalarMappable  # noqa: PLC0415
    from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: PLC0415
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    shapes = next((m.shapes for m in machines if not m.shapes.empty), pd.DataFrame())
    if shapes.empty:
        empty_figure(path, "no tree shapes")
        return "No tree shapes."
    if depth not in set(shapes["depth"]):
        depth = int(shapes["depth"].iloc[0])
    sel = shapes[shapes["depth"] == depth]
    distributions = list(dict.fromkeys(sel["distribution"]))
    budgets = sorted(int(b) for b in sel["budget"].unique())
    colors = sns.color_palette("viridis", len(budgets)).as_hex()  # sequential, colour-blind safe
    g = facets(
        sel,
        col="distribution",
        col_wrap=min(2, len(distributions)),
        col_order=distributions,
        hue="budget",
        hue_order=budgets,
        palette=colors,
        height=3.6,
        sharey=True,
    )
    g.map_dataframe(_depth_line)
    for ax, panel in facet_panels(g, sel, "distribution"):
        ax.set_yscale("symlog", linthresh=0.01)  # depths no tree reaches (0) stay visible
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{panel['distribution'].iloc[0]} trees")
    g.figure.set_layout_engine("constrained")  # before the colour bar, which it then places
    bar = g.figure.colorbar(
        ScalarMappable(BoundaryNorm(np.arange(len(budgets) + 1) - 0.5, len(budgets)), ListedColormap(colors)),
        ax=np.ravel(g.axes).tolist(),
        ticks=range(len(budgets)),
        aspect=30,
        pad=0.01,
    )
    bar.ax.set_yticklabels([str(b) for b in budgets])
    bar.set_label("budget N")
    finish(
        g.figure,
        g.axes,
        path,
        xlabel="tree depth d (block position)",
        ylabel="nodes at depth d (mean)",
        legends=[],
    )
    return f"L = {depth}; all requests of each trace."


def _depth_line(*, data, color, label) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    line = data.sort_values("tree_depth")
    plt.gca().plot(line["tree_depth"], line["nodes_mean"], "o-", ms=3, color=color, label=f"N = {label}")


def figure_tree_shape_for_report(inputs, path) -> str:
    return figure_tree_shape(inputs.machines, path, inputs.depth)
