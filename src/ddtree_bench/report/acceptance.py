"""The report's acceptance section: tau per budget of every distribution's trees next to the DDTree paper's
curve, expected against simulated, and the per-round acceptance histogram in the style of the paper's Fig. 4.

Everything comes from a machine's ``tree_shape.parquet`` (``aggregate.tree_shape``): per (distribution,
depth, budget) the trees' expected acceptance, the simulated one (drafter equals target, mean, standard
error and histogram of tokens per round), the expected tau on the first 15 positions (the paper's block 16)
and the top-1 chain's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ddtree_bench.calibrate import PAPER_CHAIN, PAPER_DEPTH, PAPER_TAU
from ddtree_bench.report.figures import WIDTH, budget_axis, palette, save_figure

#: The paper's Fig. 4 (Qwen3-8B, MATH-500, block 16): P(tau >= k) for k = 1 .. 16.
PAPER_CHAIN_SURVIVAL = (1.0, 0.897, 0.779, 0.679, 0.597, 0.527, 0.472, 0.427, 0.386, 0.350, 0.317, 0.287)
PAPER_CHAIN_SURVIVAL += (0.259, 0.233, 0.210, 0.186)
PAPER_TREE512_SURVIVAL = (1.0, 0.999, 0.992, 0.957, 0.893, 0.814, 0.742, 0.670, 0.608, 0.552, 0.507, 0.460)
PAPER_TREE512_SURVIVAL += (0.420, 0.381, 0.348, 0.320)

FIGURES = ("acceptance_tau", "acceptance_histogram")
SIMULATED_COLUMNS = (
    "simulated_tau_mean",
    "simulated_tau_se",
    "paper_depth_tau_mean",
    "chain_tau_mean",
    "paper_depth_chain_tau",
)


def per_budget(shapes: pd.DataFrame) -> pd.DataFrame:
    """One row per (distribution, depth, budget) of a tree-shape table (its per-budget columns)."""
    if shapes is None or shapes.empty or "expected_accept_mean" not in shapes:
        return pd.DataFrame()
    rows = shapes.drop_duplicates(["distribution", "depth", "budget"]).copy()
    for column in SIMULATED_COLUMNS:  # tree shapes written before these existed: NaN
        if column not in rows:
            rows[column] = np.nan
    rows = rows[rows["expected_accept_mean"].notna()]
    return rows.sort_values(["distribution", "depth", "budget"]).reset_index(drop=True)


def _fmt(value, digits=2) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.{digits}f}"


def tau_table(machines) -> pd.DataFrame:
    """Per machine, distribution, depth and budget: expected tau (1 + the sum of the trees' path
    probabilities), simulated tau (mean +- standard error, and its distance from the expected in standard
    errors), the expected tau on the first 15 positions beside the paper's Fig. 3 value, and the top-1
    chain's."""
    out = []
    for machine in machines:
        rows = per_budget(machine.shapes)
        for _, row in rows.iterrows():
            expected = 1.0 + row["expected_accept_mean"]
            sim, se = row.get("simulated_tau_mean"), row.get("simulated_tau_se")
            at15 = row.get("paper_depth_tau_mean")
            # the paper's value only beside trees over its depth (traces with fewer positions have none)
            paper = PAPER_TAU.get(int(row["budget"])) if at15 is not None and not pd.isna(at15) else None
            z = (sim - expected) / se if sim is not None and se and not pd.isna(se) and se > 0 else None
            residual = (
                at15 / paper - 1.0 if paper is not None and at15 is not None and not pd.isna(at15) else None
            )
            out.append(
                {
                    "machine": machine.label,
                    "distribution": row["distribution"],
                    "L": int(row["depth"]),
                    "N": int(row["budget"]),
                    "tau expected": _fmt(expected),
                    "tau simulated +- s.e.": f"{_fmt(sim)} +- {_fmt(se)}" if sim is not None else "-",
                    "(sim - exp) / s.e.": _fmt(z, 1),
                    f"tau, first {PAPER_DEPTH} positions": _fmt(at15),
                    "paper tau (Fig. 3)": _fmt(paper),
                    "vs paper": "-" if residual is None else f"{residual:+.1%}",
                    f"chain tau, first {PAPER_DEPTH}": _fmt(row.get("paper_depth_chain_tau")),
                }
            )
    return pd.DataFrame(out)


def figure_tau(machines, path) -> str:
    """tau vs budget: every distribution's trees (a colour each; solid on the first 15 positions where the
    trace has them, dashed on all L), expected as lines and simulated as points with 2-standard-error bars,
    and the paper's curve and chain."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = per_budget(next((m.shapes for m in machines if not m.shapes.empty), pd.DataFrame()))
    fig, ax = plt.subplots(figsize=(WIDTH, 4.6), layout="constrained")
    budgets = sorted(PAPER_TAU)
    ax.plot(budgets, [PAPER_TAU[n] for n in budgets], "ks-", lw=2, label="DDTree paper, Fig. 3 (block 16)")
    ax.axhline(PAPER_CHAIN, color="k", ls=":", lw=1, label=f"paper's top-1 chain (DFlash), {PAPER_CHAIN}")
    if rows.empty:
        ax.text(0.5, 0.5, "no tree shapes", transform=ax.transAxes, ha="center")
    groups = rows.groupby(["distribution", "depth"], sort=True) if not rows.empty else ()
    colours = palette()
    for k, ((distribution, depth), group) in enumerate(groups):
        color = colours[k % len(colours)]
        at15 = group.get("paper_depth_tau_mean")
        if at15 is not None and at15.notna().all():
            ax.plot(
                group["budget"],
                at15,
                "o-",
                color=color,
                label=f"{distribution}, L = {depth}: first {PAPER_DEPTH}",
            )
            chain = group["paper_depth_chain_tau"].iloc[0] if "paper_depth_chain_tau" in group else np.nan
            if not pd.isna(chain):
                ax.axhline(chain, color=color, ls=":", lw=1)
        line = ax.plot(
            group["budget"],
            1.0 + group["expected_accept_mean"],
            "--",
            color=color,
            label=f"{distribution}, L = {depth}: all",
        )
        if "simulated_tau_mean" in group and group["simulated_tau_mean"].notna().any():
            ax.errorbar(
                group["budget"],
                group["simulated_tau_mean"],
                yerr=2 * group["simulated_tau_se"].fillna(0),
                fmt="x",
                color=line[0].get_color(),
                capsize=2,
            )
    ticks = sorted({int(x) for line in ax.get_lines() for x in line.get_xdata() if x >= 2})  # not axhline
    budget_axis(ax, ticks)
    ax.set_xlabel("budget N (nodes per tree)")
    ax.set_ylabel("tau: tokens per verify round (bonus included)")
    ax.grid(alpha=0.3)
    fig.legend(fontsize=9, loc="outside right center", frameon=False)
    save_figure(fig, path)
    return "Expected (lines), simulated (x, 2 s.e.), beside the DDTree paper's Fig. 3 (Qwen3-8B, block 16)."


def survival(hist) -> np.ndarray:
    """P(tau >= k) for k = 1 .. len(hist) - 1 from a histogram of tokens per round (index = tokens)."""
    counts = np.asarray(hist, dtype=np.float64)
    total = counts.sum()
    if total == 0:
        return np.zeros(max(len(counts) - 1, 0))
    tail = np.cumsum(counts[::-1])[::-1]  # tail[k] = rounds with >= k tokens
    return tail[1:] / total


def figure_histogram(machines, path, distribution=None, depth=None) -> str:
    """P(tau >= k) per k of the simulated rounds (drafter equals target) of one distribution's trees at a
    few budgets, beside the paper's Fig. 4 (its top-1 chain and its trees at N = 512)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = per_budget(next((m.shapes for m in machines if not m.shapes.empty), pd.DataFrame()))
    fig, ax = plt.subplots(figsize=(WIDTH, 4.6), layout="constrained")
    k = np.arange(1, 17)
    ax.plot(k, PAPER_CHAIN_SURVIVAL, "k:", lw=2, label="paper: top-1 chain (DFlash)")
    ax.plot(k, PAPER_TREE512_SURVIVAL, "k-", lw=2, label="paper: DDTree, N = 512")
    title = "Simulated rounds beside the paper's Fig. 4 (Qwen3-8B, block 16)."
    if not rows.empty and "simulated_accept_hist" in rows:
        if distribution not in set(rows["distribution"]):
            distribution = rows["distribution"].iloc[0]
        sel = rows[rows["distribution"] == distribution]
        if depth not in set(sel["depth"]):
            depth = int(sel["depth"].iloc[0])
        sel = sel[sel["depth"] == depth]
        budgets = list(sel["budget"])
        chosen = sorted({budgets[0], *(n for n in (64, 512) if n in budgets), budgets[-1]})
        colours = iter(palette())
        for _, row in sel[sel["budget"].isin(chosen)].iterrows():
            hist = row["simulated_accept_hist"]
            if hist is None or (isinstance(hist, float) and pd.isna(hist)):
                continue
            p = survival(list(hist))
            ax.plot(
                np.arange(1, p.size + 1),
                p,
                "o-",
                ms=3,
                color=next(colours),
                label=f"{distribution}, L = {depth}, N = {row['budget']}",
            )
        title = f"{distribution} trees (L = {depth}) beside the paper's Fig. 4 (Qwen3-8B, block 16)."
    ax.set_xlabel("k (tokens committed in a round, bonus included)")
    ax.set_ylabel("P(tau >= k)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    fig.legend(fontsize=9, loc="outside right center", frameon=False)
    save_figure(fig, path)
    return title


def figure_tau_for_report(inputs, path) -> str:
    return figure_tau(inputs.machines, path)


def figure_histogram_for_report(inputs, path) -> str:
    return figure_histogram(inputs.machines, path, inputs.distribution, inputs.depth)


INTRO = (
    "tau is the tokens committed per verify round, the bonus token included (the DDTree paper's acceptance "
    "length). Expected: 1 + the sum over the tree's nodes of the path probability (the drafter's own "
    "distribution, restricted to its top-K). Simulated: the target's token at every tree position drawn "
    "from that same distribution and the tree walked greedily (SGLang's walk), per request. The paper's "
    f"block 16 has {PAPER_DEPTH} drafted positions: the drafter distribution is fitted there, so the "
    f"comparison with the paper uses each trace's first {PAPER_DEPTH} positions."
)


def gpu_agreement_line(machines) -> str | None:
    """Whether the GPU accept kernel walked the simulated draws like the CPU walk (where it ran)."""
    flags = []
    for machine in machines:
        shapes = machine.shapes
        if shapes is None or shapes.empty or "simulated_gpu_agrees" not in shapes:
            continue
        values = shapes["simulated_gpu_agrees"].dropna()
        if len(values):
            flags.append(
                f"{machine.label}: {'agrees' if bool(values.all()) else 'DIFFERS'} ({len(values)} rows)"
            )
    if not flags:
        return None
    return "GPU accept kernel on the same draws as the CPU walk: " + "; ".join(flags) + "."


#: The fewest requests a trace needs before its mean tau is set against the paper's.
MIN_REQUESTS = 8


def acceptance_targets(
    shapes: pd.DataFrame, distribution: str = "drafter"
) -> list[tuple[str, str, str, str]]:
    """The drafter distribution's targets as ``(target, source, status, measured)``: its trees' tau (first
    15 positions) within 3 % of the paper's Fig. 3 at every budget the run has, its top-1 chain within 3 % of
    DFlash's 7.79, and the simulated tau within 2 standard errors of the expected at every budget."""
    rows = per_budget(shapes)
    if not rows.empty:
        rows = rows[rows["distribution"] == distribution]
    fig3 = f"{distribution} trees' tau within 3 % of the DDTree paper's at every budget (first 15 positions)"
    chain = f"{distribution} top-1 chain's tau within 3 % of DFlash's {PAPER_CHAIN} (first 15 positions)"
    simulated = f"{distribution} simulated tau within 2 standard errors of the expected, per budget"
    source = "acceptance"
    why = f"no {distribution} tree shapes" if rows.empty else None
    if why is None and "requests" in rows and rows["requests"].min() < MIN_REQUESTS:
        why = (
            f"{int(rows['requests'].min())} request(s) per trace: too few to set against the paper's means "
            f"(at least {MIN_REQUESTS})"
        )
    if why:
        return [
            (fig3, source, "no data", why),
            (chain, source, "no data", why),
            (simulated, source, "no data", why),
        ]
    out = []
    at15 = rows[rows["paper_depth_tau_mean"].notna() & rows["budget"].isin(list(PAPER_TAU))]
    if at15.empty:
        why = f"no trees over {PAPER_DEPTH} positions at the paper's budgets"
        out += [(fig3, source, "no data", why), (chain, source, "no data", why)]
    else:
        residual = at15["paper_depth_tau_mean"] / at15["budget"].map(PAPER_TAU) - 1.0
        worst = int(np.argmax(residual.abs().to_numpy()))
        status = "met" if residual.abs().max() <= 0.03 else "not met"
        measured = (
            f"worst {residual.iloc[worst]:+.1%} at N = {int(at15['budget'].iloc[worst])} "
            f"({len(at15)} of {len(PAPER_TAU)} budgets, L = {int(at15['depth'].iloc[worst])})"
        )
        out.append((fig3, source, status, measured))
        value = float(at15["paper_depth_chain_tau"].iloc[0])
        status = "met" if abs(value / PAPER_CHAIN - 1.0) <= 0.03 else "not met"
        out.append((chain, source, status, f"{value:.2f} ({value / PAPER_CHAIN - 1.0:+.1%})"))
    sim = rows[rows["simulated_tau_se"].notna() & (rows["simulated_tau_se"] > 0)]
    if sim.empty:
        out.append((simulated, source, "no data", "no simulated rounds"))
    else:
        z = (sim["simulated_tau_mean"] - 1.0 - sim["expected_accept_mean"]) / sim["simulated_tau_se"]
        status = "met" if z.abs().max() <= 2.0 else "not met"
        out.append(
            (simulated, source, status, f"largest |sim - exp| = {z.abs().max():.1f} s.e. ({len(sim)} rows)")
        )
    return out


__all__ = [
    "FIGURES",
    "INTRO",
    "figure_histogram",
    "figure_tau",
    "gpu_agreement_line",
    "survival",
    "tau_table",
]
