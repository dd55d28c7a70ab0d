"""The report's figures (PNG): time vs budget, time vs batch, speedup, tree shape."""

from __future__ import annotations

import warnings

import pandas as pd

from ddtree_bench.catalog import IN_SITU
from ddtree_bench.report.load import (
    BASELINE_NAMES,
    SERIES_COLORS,
    SERIES_ORDER,
    Machine,
    _select,
    speedups,
)

# ----------------------------------------------------------------------------------------- figures


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*", "p", "d", "H", "8", "1")
_LINES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
#: One marker and line style per series (beside its colour), so that lines of one colour family (the GPU's)
#: stay apart where they overlap.
SERIES_STYLES = {
    s: (_MARKERS[i % len(_MARKERS)], _LINES[i % len(_LINES)]) for i, s in enumerate(SERIES_ORDER)
}


def budget_axis(ax, ticks, fontsize: int = 7) -> None:
    """A log-2 x axis ticked at the real budgets (8, 16, ..., 1024), not at powers written as 2^k."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(v) for v in ticks], fontsize=fontsize)
    ax.minorticks_off()


def _plot_band(data, x, y, lo, hi, color=None, label=None, **_):
    import matplotlib.pyplot as plt  # noqa: PLC0415

    data = data.sort_values(x)
    ax = plt.gca()
    marker, line = SERIES_STYLES.get(label, ("o", "-"))
    ax.plot(
        data[x], data[y], marker=marker, markersize=4, linewidth=1.4, linestyle=line, color=color, label=label
    )
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
        sharey=True,
        margin_titles=False,
        col_wrap=col_wrap if rows <= 1 else None,
        palette=_palette(data["series"]),
    )
    grid.map_dataframe(_plot_band, x=x, y=y, lo=lo, hi=hi)
    ticks = sorted({int(v) for v in data[x]})
    for ax in grid.axes.flat:
        if logx:
            budget_axis(ax, ticks)
        if logy:
            with warnings.catch_warnings():  # a flat series (one value) is drawn fine; no need to say so
                warnings.simplefilter("ignore", UserWarning)
                ax.set_yscale("log")
        if hline is not None:
            ax.axhline(hline, color="0.4", linewidth=0.8, linestyle="--")
    grid.set_axis_labels(xlabel, ylabel)
    short = {"batch": "B", "budget": "N"}.get(col, col)
    if rows > 1:
        grid.set_titles(template=f"{{row_name}}, {short} = {{col_name}}", size=9)
    else:
        only = data[row].iloc[0] if row else ""
        grid.set_titles(col_template=f"{only}, {short} = {{col_name}}".strip(", "), size=9)
    grid.add_legend(title="")
    sns.move_legend(
        grid, "upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, title=None, frameon=False, fontsize=8
    )
    grid.figure.suptitle(title, y=1.02, fontsize=11)
    grid.figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(grid.figure)


def _select_each(data: pd.DataFrame, depth, distribution) -> tuple[pd.DataFrame, int | None, str | None]:
    """Each machine's rows at the report's depth and distribution, or, where it has none, at its own first
    (its panels then name what they show): every machine's numbers are in the figures."""
    if data.empty:
        return data, depth, distribution
    frames, shown = [], []
    for machine, rows in data.groupby("machine", sort=False):
        sel, used_depth, used = _select(rows, depth, distribution)
        if (used_depth, used) != (depth, distribution):
            sel = sel.assign(machine=f"{machine}: {used}, L = {used_depth}")
        shown.append((used_depth, used))
        frames.append(sel)
    out = pd.concat(frames, ignore_index=True)
    if (depth, distribution) not in shown:
        depth, distribution = shown[0]
    return out, depth, distribution


def _others(sel: pd.DataFrame, distribution) -> str:
    """The title's note on the machines shown at their own depth or distribution (their panels say which)."""
    other = sorted({m for m in sel["machine"] if ": " in m})
    if not other:
        return ""
    each = ", ".join(f"{name} ({what})" for name, what in (m.split(": ", 1) for m in other))
    return f"; machines without these rows at their own: {each}"


def figure_time_vs_budget(data, path, depth, distribution) -> str:
    sel, depth, distribution = _select_each(data, depth, distribution)
    if sel.empty:
        _empty_figure(path, "no timings")
        return "no timings"
    sel = sel.assign(us=sel["median_s"] * 1e6, lo=sel["p10_s"] * 1e6, hi=sel["p90_s"] * 1e6)
    note = _others(sel, distribution)
    title = f"Time per call vs budget (L = {depth}, {distribution} trace{note}; band: p10-p90)"
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
        ylabel="µs per call, median\n(tree build only; no verify, accept)",
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
    sel, depth, distribution = _select_each(data, depth, distribution)
    if sel.empty:
        _empty_figure(path, "no timings")
        return "no timings"
    sel = sel[sel["budget"].isin(_budget_choice(sel["budget"]))]
    sel = sel.assign(
        us=sel["median_per_tree_s"] * 1e6, lo=sel["p10_per_tree_s"] * 1e6, hi=sel["p90_per_tree_s"] * 1e6
    )
    note = _others(sel, distribution)
    title = f"Time per tree vs batch size (L = {depth}, {distribution} trace{note}; band: p10-p90)"
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
        ylabel="µs per tree, median\n(tree build only; no verify, accept)",
        title=title,
        path=path,
        col_wrap=4,
    )
    return title


def figure_speedup(data, path, depth, distribution) -> str:
    sel, depth, distribution = _select_each(data, depth, distribution)
    sp = speedups(sel, headline=True) if not sel.empty else pd.DataFrame()
    if sp.empty:
        _empty_figure(path, "no speedups: neither sglang nor reference was measured")
        return "no speedups"
    bases = sorted({BASELINE_NAMES[b] for b in sp["baseline"]})
    what = "in-situ: what the decode round pays" if (sp["mode"] == IN_SITU).all() else "same inputs"
    if sp["mode"].nunique() > 1:
        what = "in-situ where measured, else wall clock"
    note = _others(sel, distribution)
    title = f"Speedup over {' / '.join(bases)} ({what}; L = {depth}, {distribution} trace{note})"
    mode = sp["mode"].map({IN_SITU: f" ({IN_SITU})", "wall": " (wall clock)"}).fillna("")
    sp = sp.assign(machine=sp["machine"] + mode)
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
        ylabel="speedup, x (median / median;\ntree build only)",
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
