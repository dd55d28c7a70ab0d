"""What the three kernels are worth, and tree or chain: whole K2.6 rounds per stack (``catalog.STACKS``) and
the linear DFlash chain (``catalog.CHAIN``), the ``stack`` rows of the round stage, as tokens per second.

- ``stack_table``: per (batch, prefix, depth, budget, stack) the whole round's median (p10-p90) as measured
  (``wall_s``), its parts, the estimated tensor-parallel terms (``estimate_s``), the round they make
  (``round_s`` = measured + estimated), the medians of the repeated runs and their spread, tau (the
  acceptance profile's drafter at the rows' own depth L: ``calibrate.round_tau``) and tokens/s = B x tau /
  round. A chain's row is at budget block - 1; ``overlap_s`` is its round replayed as one graph (the overlap
  model) plus the estimates.
- ``best_budgets``: each stack's best budget (a chain's best block) per (batch, prefix), whether it sits on
  the grid's edge, and whether the runner-up is within the noise (a near tie).
- A kernel's worth has one definition: what its one-kernel swap takes off SGLang's round
  (``kernel_worth``), in the same job, at SGLang's best budget. ``waterfall`` goes from SGLang's round to
  ours by the three swaps, then the rest (what the three together do beyond their swaps one at a time).
- The noise: a difference counts only beyond ``band``: the two rounds' p10-p90 widths plus the largest
  run-to-run spread seen (``run_spread``: the medians of a configuration's repeated runs, ``run<k>:`` rows)
  times the larger round; else it says "no win shown".
- ``tree_or_chain``: per (batch, prefix) the best tree stack at its best budget, SGLang's tree stack at its
  best budget and the chain at its best block, without overlap and (modelled) with its host work hidden.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.report.document import Bullets, Section, Table, Text
from ddtree_bench.report.fmt import fmt_us

TITLE = "What the three kernels are worth, and tree or chain"
#: SGLang's round as Hopper runs it: the base of the swaps and of every verdict
BASE = catalog.SGLANG_ROUND
BASES = tuple(s.name for s in catalog.STACKS.values() if s.base is None and s.name != catalog.OURS)
PARTS = ("draft", "build", "mask", "metadata", "forward", "accept", "commit")
ESTIMATES = ("estimate-allreduce", "estimate-gather")
#: each kernel's own parts of a round (the cross-check beside its swap)
OWN_PARTS = {
    "build": ("build_s",),
    "attention": ("mask_s", "metadata_s", "forward_s"),
    "accept": ("accept_s",),
}
RUN = re.compile(r"^run(\d+):(.*)$")
INTRO = (
    "Whole decode rounds on one GPU's share of Kimi K2.6 (rank 0 of tensor parallel 8, random weights, "
    "SGLang's Marlin W4A16 MoE, the DFlash drafter), every stack in the same job on the same weights, "
    "drafter output and trees, the stacks taking turns round by round. `sglang-fa3` is SGLang's DDTree round "
    "as its fork's worker runs it on Hopper (docs/round_stages.md): its drafter graph and eager top-K, its "
    "function per request with two blocking copies and five pageable copies back, its per-request bool "
    "mask, the FA3 backend's metadata eagerly, the verify forward as a CUDA graph with FA3's two passes and "
    "SGLang's merge (5 launches a layer, and one gather where fa3-fwd has no paged KV), its Triton accept "
    "and its commit eagerly. `ours` is our build, attention and accept, and the same commit, as one CUDA "
    "graph. `sglang-fa3+<kernel>` is SGLang's round with that one kernel ours. `chain` is upstream "
    "SGLang's linear DFlash (no tree): the drafter's top-1 block, a causal verify (FlashMLA), its Triton "
    "accept. Every round adds the tensor-parallel all-reduces and the drafter's all-gathers, which one GPU "
    "cannot run: "
    "estimated, the same for every stack of a budget."
)


# ----------------------------------------------------------------------------------------------- rows


def _ok(step: pd.DataFrame) -> pd.DataFrame:
    if step is None or step.empty or "stage" not in step:
        return pd.DataFrame()
    return step[(step["stage"] == "stack") & (step["status"] == "ok")].copy()


KEYS = ["batch", "prefix", "depth", "budget", "impl"]


def _runs(rows: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: the whole round's median of each run (run 1: ``wall``; ``run<k>:wall``)."""
    out = []
    for timing, part in rows.groupby("timing"):
        match = RUN.match(str(timing))
        run, name = (int(match.group(1)), match.group(2)) if match else (1, str(timing))
        if name == "wall":
            out.append(part[KEYS + ["median_s"]].assign(run=run))
    if not out:
        return pd.DataFrame(columns=[*KEYS, "runs", "run_spread"])
    runs = pd.concat(out)
    grouped = runs.groupby(KEYS)["median_s"]
    spread = grouped.agg(lambda v: (v.max() - v.min()) / v.min() if len(v) > 1 else np.nan)
    return pd.DataFrame({"runs": grouped.size(), "run_spread": spread}).reset_index()


def tau_depth(depth: int) -> int:
    """The depth tau is taken at for rounds of ``depth`` drafted positions: at most the drafters' trained
    block (16: 15 drafted positions, ``calibrate.PAPER_DEPTH``); positions past it are taken to add nothing
    (a drafter trained at block 16 has no trained prediction there; SGLang's regime drafts N + 1 tokens)."""
    from ddtree_bench.calibrate import PAPER_DEPTH  # noqa: PLC0415

    return min(int(depth), PAPER_DEPTH)


def _taus(table: pd.DataFrame, profile: str) -> pd.Series:
    """tau of each row under ``profile`` at its own depth (``tau_depth``): the trees' at its budget, the
    chain's at L."""
    from ddtree_bench.calibrate import round_tau  # noqa: PLC0415

    tau = pd.Series(np.nan, index=table.index, dtype="float64")
    for depth, part in table.groupby("depth"):
        trees = part[part["stack"] != catalog.CHAIN]
        budgets = sorted({int(b) for b in trees["budget"]})
        per_budget, chain = round_tau(profile, tau_depth(int(depth)), budgets or [1])
        tau[trees.index] = trees["budget"].map(per_budget).astype("float64")
        chains = part.index[part["stack"] == catalog.CHAIN]
        tau[chains] = chain
    return tau


def stack_table(step: pd.DataFrame, profile: str = catalog.PAPER_PROFILE) -> pd.DataFrame:
    """One row per (batch, prefix, depth, budget, stack) that ran (module docstring)."""
    rows = _ok(step)
    whole = rows[rows["timing"] == "wall"] if not rows.empty else rows
    if whole.empty:
        return pd.DataFrame()
    columns = [*KEYS, "median_s", "p10_s", "p90_s", "n", "correct", "note"]
    columns += [c for c in ("launches",) if c in whole]
    out = whole[columns].rename(columns={"median_s": "wall_s"})
    for part in PARTS:
        found = rows[rows["timing"] == f"part-{part}"][[*KEYS, "median_s"]]
        out = out.merge(found.rename(columns={"median_s": f"{part}_s"}), on=KEYS, how="left")
    estimates = rows[rows["timing"].isin(ESTIMATES)].groupby(KEYS)["median_s"].sum().rename("estimate_s")
    out = out.merge(estimates.reset_index(), on=KEYS, how="left")
    overlap = rows[rows["timing"] == "model-one-graph"][[*KEYS, "median_s"]]
    out = out.merge(overlap.rename(columns={"median_s": "one_graph_s"}), on=KEYS, how="left")
    out = out.merge(_runs(rows), on=KEYS, how="left")
    out = out.rename(columns={"impl": "stack"})
    out["round_s"] = out["wall_s"] + out["estimate_s"].fillna(0.0)
    out["overlap_s"] = out["one_graph_s"] + out["estimate_s"].fillna(0.0)
    out["tau"] = _taus(out, profile)
    out["tokens_per_s"] = out["batch"] * out["tau"] / out["round_s"]
    out["overlap_tokens_per_s"] = out["batch"] * out["tau"] / out["overlap_s"]
    order = {name: i for i, name in enumerate([*catalog.STACKS, catalog.CHAIN])}
    out["order"] = out["stack"].map(order)
    return (
        out.sort_values(["batch", "prefix", "order", "budget"]).drop(columns="order").reset_index(drop=True)
    )


def unavailable(step: pd.DataFrame) -> pd.DataFrame:
    """The stack configurations that have no timings, with why (one row per reason and stack)."""
    if step is None or step.empty or "stage" not in step:
        return pd.DataFrame()
    rows = step[(step["stage"] == "stack") & (step["status"] != "ok")]
    if rows.empty:
        return pd.DataFrame()
    grouped = rows.groupby(["batch", "prefix", "impl", "status_reason"], dropna=False)["budget"]
    out = grouped.apply(lambda b: ", ".join(str(int(x)) for x in sorted(set(b)))).reset_index()
    return out.rename(columns={"impl": "stack", "budget": "budgets", "status_reason": "why"})


def run_spread(table: pd.DataFrame) -> float:
    """The largest relative spread of a repeated configuration's run medians (0 where none was repeated)."""
    if table.empty or "run_spread" not in table:
        return 0.0
    spread = table["run_spread"].dropna()
    return float(spread.max()) if len(spread) else 0.0


def repeated(table: pd.DataFrame) -> pd.DataFrame:
    """The repeated configurations: their runs and spread."""
    if table.empty or "runs" not in table:
        return pd.DataFrame()
    return table[table["runs"].fillna(1) > 1]


def band(a, b, rel: float) -> float:
    """The difference between rounds ``a`` and ``b`` their noise allows (module docstring)."""
    within = float((a["p90_s"] - a["p10_s"]) + (b["p90_s"] - b["p10_s"]))
    return within + rel * max(float(a["round_s"]), float(b["round_s"]))


def _at(table: pd.DataFrame, batch: int, prefix: int, budget: int, stack: str):
    rows = table[
        (table["batch"] == batch)
        & (table["prefix"] == prefix)
        & (table["budget"] == budget)
        & (table["stack"] == stack)
    ]
    return None if rows.empty else rows.iloc[0]


def best_budgets(table: pd.DataFrame, rel: float = 0.0) -> pd.DataFrame:
    """Each stack's best budget (most tokens/s) per (batch, prefix): ``budget``, ``tokens_per_s``,
    ``round_s``, ``edge`` (the smallest or largest that stack ran there) and ``tie`` (the runner-up's
    budget where the two are within ``band``, else None)."""
    if table.empty:
        return pd.DataFrame()
    rows = []
    for (batch, prefix, stack), part in table.dropna(subset=["tokens_per_s"]).groupby(
        ["batch", "prefix", "stack"], sort=False
    ):
        ordered = part.sort_values("tokens_per_s", ascending=False)
        best = ordered.iloc[0]
        budgets = sorted(part["budget"])
        tie = None
        if len(ordered) > 1 and not apart(best, ordered.iloc[1], rel):
            tie = int(ordered.iloc[1]["budget"])
        rows.append(
            {
                "batch": int(batch),
                "prefix": int(prefix),
                "stack": stack,
                "budget": int(best["budget"]),
                "depth": int(best["depth"]),
                "tokens_per_s": float(best["tokens_per_s"]),
                "round_s": float(best["round_s"]),
                "edge": int(best["budget"]) in (budgets[0], budgets[-1]) and len(budgets) > 1,
                "tie": tie,
                "budgets_run": f"{budgets[0]}-{budgets[-1]}",
            }
        )
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------- worth


def _parts(row, names) -> float:
    return float(sum(float(row[n]) for n in names if n in row and pd.notna(row[n])))


def kernel_worth(table: pd.DataFrame, batch: int, prefix: int, budget: int, rel: float) -> pd.DataFrame:
    """Per kernel: what its swap takes off ``BASE``'s round at one (batch, prefix, budget), both in the
    same job (``worth_s``; negative: it adds), whether that is beyond the noise (``shown``), and the
    difference of its own parts of ``BASE``'s round and ours (``parts_s``, a cross-check). Empty where a
    swap did not run."""
    base = _at(table, batch, prefix, budget, BASE)
    ours = _at(table, batch, prefix, budget, catalog.OURS)
    if base is None:
        return pd.DataFrame()
    rows = []
    for kernel, names in OWN_PARTS.items():
        swap = _at(table, batch, prefix, budget, f"{BASE}+{kernel}")
        if swap is None:
            continue
        worth = float(base["round_s"] - swap["round_s"])
        rows.append(
            {
                "kernel": kernel,
                "worth_s": worth,
                "share": worth / float(base["round_s"]),
                "shown": abs(worth) > band(base, swap, rel),
                "parts_s": None if ours is None else _parts(base, names) - _parts(ours, names),
            }
        )
    return pd.DataFrame(rows)


def waterfall(table: pd.DataFrame, batch: int, prefix: int, budget: int, rel: float) -> pd.DataFrame:
    """From ``BASE``'s round to ours at one (batch, prefix, budget): a row per step with ``saved_s`` (what it
    takes off; negative: adds), ``round_s`` after it, ``tokens_per_s`` after it and ``shown``. The kernels'
    steps are their swaps' worth (``kernel_worth``); the rest is the whole rounds' difference less those."""
    base = _at(table, batch, prefix, budget, BASE)
    ours = _at(table, batch, prefix, budget, catalog.OURS)
    worth = kernel_worth(table, batch, prefix, budget, rel)
    if base is None or ours is None or len(worth) < len(OWN_PARTS):
        return pd.DataFrame()
    current = float(base["round_s"])
    rows = [{"step": f"{BASE} (SGLang as it runs)", "saved_s": 0.0, "round_s": current, "shown": True}]
    for _, kernel in worth.iterrows():
        current -= kernel["worth_s"]
        rows.append(
            {
                "step": f"our {kernel['kernel']}",
                "saved_s": kernel["worth_s"],
                "round_s": current,
                "shown": bool(kernel["shown"]),
                "parts_s": kernel["parts_s"],
            }
        )
    rest = current - float(ours["round_s"])
    rows.append(
        {
            "step": "the rest (the three together, beyond their swaps)",
            "saved_s": rest,
            "round_s": float(ours["round_s"]),
            "shown": abs(rest) > band(base, ours, rel),
        }
    )
    out = pd.DataFrame(rows)
    out["tokens_per_s"] = batch * float(base["tau"]) / out["round_s"]
    return out


def carrying_kernel(worth: pd.DataFrame) -> str | None:
    """The kernel whose swap takes the most off SGLang's round, where that is beyond the noise."""
    if worth.empty:
        return None
    gains = worth[worth["shown"] & (worth["worth_s"] > 0)]
    return None if gains.empty else str(gains.loc[gains["worth_s"].idxmax(), "kernel"])


# ----------------------------------------------------------------------------------------------- verdicts


def _pairs(best: pd.DataFrame, stack: str):
    """``(batch, prefix, BASE's best row, stack's best row)`` where both have a best budget."""
    for (batch, prefix), part in best.groupby(["batch", "prefix"], sort=True):
        mine = part[part["stack"] == BASE]
        other = part[part["stack"] == stack]
        if not mine.empty and not other.empty:
            yield int(batch), int(prefix), mine.iloc[0], other.iloc[0]


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _edge(row) -> str:
    return " (grid edge)" if row["edge"] else ""


def _tie(row) -> str:
    tie = row.get("tie")
    return f" (near tie with N = {int(tie)})" if tie is not None and pd.notna(tie) else ""


def verdict_table(table: pd.DataFrame, best: pd.DataFrame, rel: float) -> pd.DataFrame:
    """A row per question, a column per (batch, prefix): do our three kernels pay off (ours against
    ``BASE``, each at its best budget), at which budget, which kernel's swap carries the gain."""
    pays = f"Do our three kernels pay off? (ours' tokens/s over {BASE}'s, each at its best N)"
    budget = f"At which budget? (best N: {BASE}, ours)"
    carries = f"Which kernel carries the gain? (its swap into {BASE}'s round at {BASE}'s best N)"
    columns = {"question (the number it rests on)": [pays, budget, carries]}
    for batch, prefix, b, o in _pairs(best, catalog.OURS):
        n = int(b["budget"])
        whole = _at(table, batch, prefix, n, BASE)
        ours = _at(table, batch, prefix, n, catalog.OURS)
        gain = o["tokens_per_s"] / b["tokens_per_s"]
        shown = ours is not None and abs(whole["round_s"] - ours["round_s"]) > band(whole, ours, rel)
        call = (
            f"yes: {_x(gain)}"
            if gain > 1 and shown
            else f"no, slower: {_x(gain)}"
            if shown
            else f"no win shown: {_x(gain)}"
        )
        worth = kernel_worth(table, batch, prefix, n, rel)
        carrier = carrying_kernel(worth)
        if carrier:
            row = worth[worth["kernel"] == carrier].iloc[0]
            carried = f"{carrier}: {fmt_us(row['worth_s'])} ({row['share'] * 100:.0f}%)"
        else:
            carried = "none shown"
        columns[f"B = {batch}, S = {prefix}"] = [
            call,
            f"N = {n}{_edge(b)}{_tie(b)}, N = {int(o['budget'])}{_edge(o)}{_tie(o)}",
            carried,
        ]
    return pd.DataFrame(columns) if len(columns) > 1 else pd.DataFrame()


def verdict_lines(table: pd.DataFrame, best: pd.DataFrame, rel: float) -> list[str]:
    """The numbers behind each column of ``verdict_table``: each kernel's swap worth at ``BASE``'s best
    budget (or "no win shown"), the rest, and ours at its own best budget."""
    lines = []
    for batch, prefix, b, o in _pairs(best, catalog.OURS):
        n = int(b["budget"])
        worth = kernel_worth(table, batch, prefix, n, rel)
        steps = waterfall(table, batch, prefix, n, rel)
        gains = [
            f"our {r['kernel']} {fmt_us(r['worth_s'])} ({r['share'] * 100:.0f}%)"
            + ("" if r["shown"] else ", no win shown")
            for _, r in worth.iterrows()
        ]
        rest = steps[steps["step"].str.startswith("the rest")]
        rest_text = (
            ""
            if rest.empty
            else f"; the rest {fmt_us(rest['saved_s'].iloc[0])}"
            + ("" if rest["shown"].iloc[0] else ", no win shown")
        )
        lines.append(
            f"**B = {batch}, S = {prefix}, L = {int(b['depth'])}.** {BASE}: best N = {n}{_edge(b)}, "
            f"{b['tokens_per_s']:,.0f} tokens/s; ours: best N = {int(o['budget'])}{_edge(o)}, "
            f"{o['tokens_per_s']:,.0f} tokens/s ({_x(o['tokens_per_s'] / b['tokens_per_s'])}). Of {BASE}'s "
            f"{fmt_us(b['round_s'])} round at N = {n}, each swap takes: " + "; ".join(gains) + rest_text + "."
        )
    return lines


def width(row) -> float:
    """A round's p10-p90 width over its median."""
    return float(row["p90_s"] - row["p10_s"]) / float(row["round_s"])


def apart(a, b, rel: float) -> bool:
    """Whether the tokens/s of rounds ``a`` and ``b`` (any budgets, any taus) differ beyond their noise: both
    rounds' p10-p90 plus the run-to-run spread ``rel``, once (as ``band`` for two rounds' times)."""
    high, low = sorted((float(a["tokens_per_s"]), float(b["tokens_per_s"])), reverse=True)
    return high / low - 1.0 > width(a) + width(b) + rel


CHOICES = (catalog.OURS, BASE, catalog.CHAIN)


def tree_or_chain(table: pd.DataFrame, rel: float) -> pd.DataFrame:
    """Per (batch, prefix): ours (the best tree stack here), SGLang's tree stack and the chain, each at its
    best budget (the chain's: its best block), tokens/s; the chain's with its host work hidden (modelled);
    the winner among the three as measured, its margin over the runner-up, and whether that margin is
    beyond the noise (``shown``)."""
    best = best_budgets(table, rel)
    if best.empty:
        return pd.DataFrame()
    out = []
    for (batch, prefix), part in best.groupby(["batch", "prefix"], sort=True):
        picked = {}
        for stack in CHOICES:
            found = part[part["stack"] == stack]
            if not found.empty:
                picked[stack] = _at(table, int(batch), int(prefix), int(found["budget"].iloc[0]), stack)
        if len(picked) < len(CHOICES):
            continue
        row = {"batch": int(batch), "prefix": int(prefix)}
        for label, found in picked.items():
            row[f"{label}_tokens_per_s"] = float(found["tokens_per_s"])
            row[f"{label}_budget"] = int(found["budget"])
        chains = table[
            (table["batch"] == batch) & (table["prefix"] == prefix) & (table["stack"] == catalog.CHAIN)
        ]
        modelled = chains["overlap_tokens_per_s"].dropna()
        row["overlap_tokens_per_s"] = float(modelled.max()) if len(modelled) else np.nan
        ranked = sorted(picked, key=lambda k: float(picked[k]["tokens_per_s"]), reverse=True)
        first, second = ranked[0], ranked[1]
        row["winner"] = first
        row["runner_up"] = second
        row["margin"] = float(picked[first]["tokens_per_s"]) / float(picked[second]["tokens_per_s"])
        row["shown"] = apart(picked[first], picked[second], rel)
        out.append(row)
    return pd.DataFrame(out)


# ----------------------------------------------------------------------------------------------- figures


#: A one-kernel swap's line: (line style, marker) per kernel swapped; whole stacks are solid with dots.
SWAP_STYLES = {"build": ("--", "s"), "attention": (":", "^"), "accept": ("-.", "D")}
WATERFALL_STEPS = ("SGLang", "build", "attention", "accept", "rest", catalog.OURS)


def _style(name: str):
    """(colour, line style, marker, line width) of a stack's (or the chain's) line."""
    from ddtree_bench.report.figures import colour  # noqa: PLC0415

    if name == catalog.CHAIN:
        return colour(catalog.CHAIN_COLOR), "-", "P", 2.0
    stack = catalog.STACKS[name]
    line, marker = SWAP_STYLES.get(stack.swap, ("-", "o"))
    return colour(stack.color), line, marker, 1.1 if stack.base else 2.0


def figure(table: pd.DataFrame, best: pd.DataFrame, path: Path, rel: float, label: str) -> str:
    """Tokens/s per budget, a panel per (batch, prefix), a line per stack and the chain (at budget block -
    1); and a waterfall panel per (batch, prefix) from SGLang's round to ours at SGLang's best budget."""
    from matplotlib.lines import Line2D  # noqa: PLC0415

    from ddtree_bench.report.figures import budget_axis, finish, panels  # noqa: PLC0415

    shown = sorted({(int(b), int(p)) for b, p in zip(table["batch"], table["prefix"], strict=True)})
    fig, axes = panels(2, len(shown), height=3.0)
    for col, (batch, prefix) in enumerate(shown):
        ax = axes[0][col]
        part = table[(table["batch"] == batch) & (table["prefix"] == prefix)]
        for name in [*catalog.STACKS, catalog.CHAIN]:
            line = part[part["stack"] == name].sort_values("budget")
            if line.empty:
                continue
            tint, style, marker, width = _style(name)
            ax.plot(line["budget"], line["tokens_per_s"], marker=marker, ms=4, color=tint, ls=style, lw=width)
            top = best[(best["batch"] == batch) & (best["prefix"] == prefix) & (best["stack"] == name)]
            if not top.empty and (name == catalog.CHAIN or catalog.STACKS[name].base is None):
                ax.plot(
                    top["budget"],
                    top["tokens_per_s"],
                    marker="*",
                    ms=14,
                    color=tint,
                    ls="",
                    markeredgecolor="black",
                    markeredgewidth=0.6,
                    zorder=3,
                )
        ticks = sorted(int(n) for n in part["budget"].unique())
        budget_axis(ax, ticks, every=-(-len(ticks) // 5))
        depths = sorted({int(d) for d in part.loc[part["stack"] != catalog.CHAIN, "depth"]})
        ax.set_title(f"B = {batch}, S = {prefix}, L = {depths[0] if len(depths) == 1 else 'N'}")
        ax.set_xlabel("budget N (chain: block - 1)")
        ax.set_ylabel("tokens/s (B x tau / round)" if col == 0 else "")
        _waterfall_panel(axes[1][col], table, best, batch, prefix, rel, first=col == 0)
    # the legend names each whole stack's colour and each swap's line style, not every line (at most 8)
    names = [n for n in [*catalog.STACKS, catalog.CHAIN] if (table["stack"] == n).any()]
    legend = []
    for name in [n for n in names if n == catalog.CHAIN or catalog.STACKS[n].base is None]:
        tint, style, marker, width = _style(name)
        legend.append((Line2D([], [], color=tint, lw=width, ls=style, marker=marker, ms=4), name))
    swaps = {catalog.STACKS[n].swap for n in names if n != catalog.CHAIN and catalog.STACKS[n].base}
    legend += [
        (
            Line2D([], [], color="0.35", lw=1.1, ls=SWAP_STYLES[k][0], marker=SWAP_STYLES[k][1], ms=3.5),
            f"+ our {k}",
        )
        for k in SWAP_STYLES
        if k in swaps
    ]
    star = Line2D([], [], marker="*", ms=13, color="0.6", markeredgecolor="black", ls="none")
    finish(fig, axes, path, ncol=4, legends=[legend + [(star, "best budget")]])
    return (
        f"{label}. Top: tokens/s per budget (tau of each acceptance profile's drafter at the rounds' own L; "
        "here the first profile), whole stacks thick, one-kernel swaps thin, the chain at budget block - 1, "
        "stars at each whole stack's and the chain's best. Bottom: SGLang's round to ours at SGLang's best "
        "budget, by each kernel's swap (green takes off, red adds) and the rest; hatched: within the noise "
        "(no win shown)."
    )


def _waterfall_panel(wax, table, best, batch, prefix, rel, *, first: bool) -> None:
    from ddtree_bench.report.figures import colour  # noqa: PLC0415

    top = best[(best["batch"] == batch) & (best["prefix"] == prefix) & (best["stack"] == BASE)]
    steps = pd.DataFrame() if top.empty else waterfall(table, batch, prefix, int(top["budget"].iloc[0]), rel)
    if steps.empty:
        return
    ms = steps["round_s"].to_numpy() * 1e3
    saved = steps["saved_s"].to_numpy() * 1e3
    wax.barh(0, ms[0], color=colour(catalog.STACKS[BASE].color))
    for i in range(1, len(steps)):
        low, high = sorted((ms[i], ms[i] + saved[i]))
        wax.barh(
            i,
            high - low,
            left=low,
            color=colour("C2" if saved[i] > 0 else "C3"),
            hatch="" if steps["shown"].iloc[i] else "//",
            edgecolor="white",
            linewidth=0,
        )
    wax.barh(len(steps), ms[-1], color=colour(catalog.STACKS[catalog.OURS].color))
    labels = list(WATERFALL_STEPS) if first else [""] * len(WATERFALL_STEPS)
    wax.set_yticks(range(len(WATERFALL_STEPS)), labels)
    wax.invert_yaxis()
    wax.grid(False, axis="y")
    wax.set_title(f"{BASE} -> ours at N = {int(top['budget'].iloc[0])}")
    wax.set_xlabel("round (ms)")


def chain_figure(machine, path: Path) -> str:
    """Tokens/s against batch, a line per choice (ours, SGLang's tree, the chain, the chain with its host
    work hidden: modelled, dashed), each at its best budget, a panel per (acceptance profile, prefix)."""
    from matplotlib.lines import Line2D  # noqa: PLC0415

    from ddtree_bench.report.figures import colour, finish, panels  # noqa: PLC0415

    tables = {p: stack_table(machine.step, p) for p in catalog.ACCEPTANCE_PROFILES}
    rel = run_spread(tables[catalog.PAPER_PROFILE])  # the runs' spread: the same under every profile's tau
    per_profile = {p: tree_or_chain(table, rel) for p, table in tables.items()}
    prefixes = sorted({int(p) for t in per_profile.values() if not t.empty for p in t["prefix"]})
    fig, axes = panels(len(per_profile), len(prefixes), height=2.8)
    lines = {
        f"{catalog.OURS}_tokens_per_s": (
            colour(catalog.STACKS[catalog.OURS].color),
            "-",
            "o",
            f"{catalog.OURS} (tree, best N)",
        ),
        f"{BASE}_tokens_per_s": (colour(catalog.STACKS[BASE].color), "-", "s", f"{BASE} (tree, best N)"),
        f"{catalog.CHAIN}_tokens_per_s": (
            colour(catalog.CHAIN_COLOR),
            "-",
            "P",
            f"{catalog.CHAIN} (best block)",
        ),
        "overlap_tokens_per_s": (
            colour(catalog.CHAIN_COLOR),
            "--",
            "P",
            f"{catalog.CHAIN}, host work hidden (modelled)",
        ),
    }
    for row, (profile, frame) in enumerate(per_profile.items()):
        for col, prefix in enumerate(prefixes):
            ax = axes[row][col]
            part = frame[frame["prefix"] == prefix].sort_values("batch") if not frame.empty else frame
            if part.empty:
                continue
            base = part[f"{BASE}_tokens_per_s"]
            for key, (tint, style, marker, _) in lines.items():
                ax.plot(part["batch"], part[key] / base, color=tint, ls=style, marker=marker, ms=5)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(part["batch"]), [str(b) for b in sorted(part["batch"])])
            ax.minorticks_off()
            ax.set_title(f"{catalog.ACCEPTANCE_PROFILES[profile].name}, S = {prefix}")
            ax.set_xlabel("batch B")
            ax.set_ylabel(f"tokens/s over {BASE}'s" if col == 0 else "")
    legend = [(Line2D([], [], color=t, ls=s, marker=m, ms=5), text) for t, s, m, text in lines.values()]
    finish(fig, axes, path, ncol=2, legends=[legend])
    return (
        f"{machine.label} ({machine.source}). Each choice's tokens/s over those of SGLang's tree round "
        f"({BASE}, at 1), each at its own best budget (the chain at its best block, 8 or 16); tau from each "
        "acceptance profile's drafter at the rounds' own depth; the tables above give the tokens/s."
    )


#: What an earlier publication's stack rows are (no commit part: run before the round was re-created as
#: SGLang's fork's worker runs it), said above them.
EARLIER_METHOD = (
    "These stack rows were measured by an earlier method: SGLang's round re-created with 16 launches a layer "
    "for its FA3 verify (the fork makes 5), the batch's tree copied in one go, its FA3 metadata inside the "
    "graph, and no commit or tensor-parallel terms in any round. They overstate what our kernels take off "
    "SGLang's round; the current method's rows are published in results/published/h100/."
)


def current_method(machine) -> bool:
    """Whether the machine's stack rows are the current method's (their rounds have the commit part)."""
    rows = _ok(machine.step)
    return not rows.empty and (rows["timing"] == "part-commit").any()


def machine_with_stacks(machines):
    """This run's machine where its step rows hold stack rounds; else the published machine whose stack rows
    are the current method's (they have the commit part and the chain), the newest first; else any published
    machine with stack rows; else None. Chosen by content, never by the folders' order."""
    with_rows = [m for m in machines if not _ok(m.step).empty] if machines else []
    if not with_rows:
        return None
    if with_rows[0] is machines[0] and machines[0].source == "this run":
        return machines[0]
    current = [m for m in with_rows if current_method(m)]
    pool = current or with_rows
    return max(pool, key=lambda m: str(m.step["timestamp"].dropna().max()) if "timestamp" in m.step else "")


def figure_for_report(inputs, path) -> str:
    machine = machine_with_stacks(inputs.machines)
    if machine is None:
        from ddtree_bench.report.figures import empty_figure  # noqa: PLC0415

        empty_figure(path, "no stack rounds here (they need a GPU)")
        return "No machine here has stack rounds."
    table = stack_table(machine.step, catalog.PAPER_PROFILE)
    rel = run_spread(table)
    return figure(table, best_budgets(table, rel), path, rel, f"{machine.label} ({machine.source})")


def chain_figure_for_report(inputs, path) -> str:
    machine = machine_with_stacks(inputs.machines)
    if machine is None or not (stack_table(machine.step)["stack"] == catalog.CHAIN).any():
        from ddtree_bench.report.figures import empty_figure  # noqa: PLC0415

        empty_figure(path, "no chain rounds here (they need a GPU)")
        return "No machine here has chain rounds."
    return chain_figure(machine, path)


# ----------------------------------------------------------------------------------------------- the section


def gpu_of(machine) -> str:
    """The GPU the machine's rows ran on (its environment's name), else its label."""
    return str((machine.environment or {}).get("gpu_name") or machine.label)


def chain_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``tree_or_chain``'s rows as shown."""
    if frame.empty:
        return frame

    def cell(row, stack):
        unit, budget = (
            ("block", row[f"{stack}_budget"] + 1) if stack == catalog.CHAIN else ("N", row[f"{stack}_budget"])
        )
        return f"{row[f'{stack}_tokens_per_s']:,.0f} ({unit} = {budget})"

    return pd.DataFrame(
        {
            "B": frame["batch"],
            "S": frame["prefix"],
            f"{catalog.OURS} (tree)": [cell(r, catalog.OURS) for _, r in frame.iterrows()],
            f"{BASE} (tree)": [cell(r, BASE) for _, r in frame.iterrows()],
            catalog.CHAIN: [cell(r, catalog.CHAIN) for _, r in frame.iterrows()],
            f"{catalog.CHAIN}, host work hidden (modelled)": frame["overlap_tokens_per_s"].map(
                lambda v: "-" if pd.isna(v) else f"{v:,.0f}"
            ),
            "winner": [
                f"{r['winner']}, {r['margin']:.2f}x {r['runner_up']}"
                + ("" if r["shown"] else " (within the noise: no win shown)")
                for _, r in frame.iterrows()
            ],
        }
    )


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """Every stack round: the whole round as measured (p10-p90), its parts, the estimated terms, tau,
    tokens/s, the runs' spread, launches a layer and correctness."""
    if table.empty:
        return table

    def us(v):
        return "-" if pd.isna(v) else fmt_us(v)

    out = {
        "B": table["batch"],
        "S": table["prefix"],
        "L": table["depth"],
        "N": table["budget"],
        "stack": table["stack"],
        "measured round (p10-p90)": [
            f"{us(r)} ({us(a)}-{us(b)})"
            for r, a, b in zip(table["wall_s"], table["p10_s"], table["p90_s"], strict=True)
        ],
    }
    for part in PARTS:
        out[part] = table[f"{part}_s"].map(us)
    out["TP terms (estimated)"] = table["estimate_s"].map(us)
    out["tau"] = table["tau"].map(lambda v: "-" if pd.isna(v) else f"{v:.2f}")
    out["tokens/s"] = table["tokens_per_s"].map(lambda v: "-" if pd.isna(v) else f"{v:,.0f}")
    out["runs (spread)"] = [
        "1" if pd.isna(n) or n <= 1 else f"{int(n)} ({sp * 100:.1f}%)"
        for n, sp in zip(table["runs"], table["run_spread"], strict=True)
    ]
    if "launches" in table:
        out["launches a layer"] = table["launches"].map(lambda v: "-" if pd.isna(v) else str(int(v)))
    out["correct"] = table["correct"]
    return pd.DataFrame(out)


def tokens_pivot(table: pd.DataFrame, batch: int, prefix: int) -> pd.DataFrame:
    """tokens/s, a row per budget and a column per stack (and the chain), at one (batch, prefix)."""
    part = table[(table["batch"] == batch) & (table["prefix"] == prefix)]
    pivot = part.pivot_table(index="budget", columns="stack", values="tokens_per_s", sort=False)
    pivot = pivot[[s for s in [*catalog.STACKS, catalog.CHAIN] if s in pivot.columns]]
    return (
        pivot.map(lambda v: "-" if pd.isna(v) else f"{v:,.0f}").reset_index().rename(columns={"budget": "N"})
    )


def correct_line(table: pd.DataFrame) -> str:
    wrong = table[table["correct"] != True]  # noqa: E712 (nullable booleans)
    if wrong.empty:
        return (
            f"In all {len(table)} configurations (stacks and chains) the rounds' accepted paths equal the "
            "CPU "
            "walk (SGLang's built trees equal ours)."
        )
    names = ", ".join(sorted(set(wrong["stack"])))
    return f"In {len(wrong)} of {len(table)} configurations the accepted paths differ from the CPU walk " + (
        f"({names})."
    )


def spread_line(table: pd.DataFrame, rel: float) -> str:
    again = repeated(table)
    if again.empty:
        return (
            "Run-to-run spread: no configuration was run more than once, so only each round's own p10-p90 "
            "decides whether a difference is shown."
        )
    where = sorted(
        {f"B = {int(b)}, S = {int(s)}" for b, s in zip(again["batch"], again["prefix"], strict=True)}
    )
    return (
        f"Run-to-run spread: {len(again)} configurations (the best budgets, N = "
        f"{', '.join(str(n) for n in sorted(set(again['budget'].astype(int))))}, at {'; '.join(where)}) were "
        f"run {int(again['runs'].max())} times, each run a fresh round (its buffers, graphs and captures "
        "made "
        f"anew on the same weights); their whole rounds' medians moved by up to {rel * 100:.1f}% "
        f"(median {again['run_spread'].median() * 100:.1f}%). A difference is shown only beyond both rounds' "
        "p10-p90 plus that share of the larger round; else it says no win shown."
    )


def launches_line(table: pd.DataFrame) -> str | None:
    if "launches" not in table or table["launches"].dropna().empty:
        return None
    per = table.dropna(subset=["launches"]).groupby("stack")["launches"].agg(["min", "max"])
    names = [n for n in (BASE, catalog.OURS, catalog.CHAIN) if n in per.index]
    text = "; ".join(
        f"{n}: {int(per.loc[n, 'min'])}"
        + (f"-{int(per.loc[n, 'max'])}" if per.loc[n, "max"] != per.loc[n, "min"] else "")
        for n in names
    )
    # rows of the earlier gather (three launches: the slots and the rows copied apart) make SGLang's layer 11
    older = BASE in per.index and per.loc[BASE, "max"] > per.loc[BASE, "min"]
    return (
        "Verify-attention launches a layer (kernels, copies and fills the profiler counts in one layer's "
        f"call): {text}. SGLang's fork makes 5 calls a layer (FA3's prefix pass, its tree pass, two LSE "
        "transposes, the merge), and FA3's two calls launch several kernels each (its scheduler, the "
        "attention, the combine of its splits); here the gather of each query's visible tree rows comes on "
        "top, where fa3-fwd has no paged KV (one launch"
        + (
            f"; three in rows of {int(per.loc[BASE, 'max'])} launches, which copied the slots and the rows "
            "apart)."
            if older
            else ")."
        )
    )


def terms_line(table: pd.DataFrame, best: pd.DataFrame) -> str | None:
    """How the terms both rounds pay (the commit, the estimated tensor-parallel terms) move ours / SGLang."""
    parts = []
    for batch, prefix, b, o in _pairs(best, catalog.OURS):
        base = _at(table, batch, prefix, int(b["budget"]), BASE)
        ours = _at(table, batch, prefix, int(o["budget"]), catalog.OURS)
        if base is None or ours is None or pd.isna(base.get("commit_s")) or pd.isna(base.get("estimate_s")):
            continue
        bare = lambda r: r["wall_s"] - r["commit_s"]  # noqa: E731
        without = (ours["tau"] / bare(ours)) / (base["tau"] / bare(base))
        parts.append(
            f"B = {batch}, S = {prefix}: {without:.2f}x to {o['tokens_per_s'] / b['tokens_per_s']:.2f}x"
        )
    if not parts:
        return None
    return (
        "The terms both rounds pay (the commit, measured; the tensor-parallel all-reduces and gathers, "
        "estimated) move ours / SGLang's tokens/s, each at its best budget, from (without them) to (with "
        "them): " + "; ".join(parts) + ". SGLang runs the commit eagerly (two launches a layer to move the "
        "accepted rows, then the draft KV), ours in its graph."
    )


#: SGLang's build part, and the same build timed two more ways in the same turns (``stages.stacks``).
BUILD_PROBES = {
    "part-build": "the round's build part",
    "build-gc-off": "the same, collector off",
    "build-in-situ": "the in-situ path, after the draft",
    "build-in-situ-back-to-back": "the in-situ path, back to back",
}


def build_probe_table(step: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, prefix, budget) of SGLang's own round: the build part and its probes (median, p10-p90)
    and what the part pays over the in-situ path; empty where no probe ran."""
    rows = _ok(step)
    if rows.empty:
        return pd.DataFrame()
    rows = rows[(rows["impl"] == BASE) & rows["timing"].isin(BUILD_PROBES)]
    if not (rows["timing"] == "build-in-situ").any():
        return pd.DataFrame()
    keys = ["batch", "prefix", "budget"]
    wide = {
        v: rows.pivot_table(index=keys, columns="timing", values=v) for v in ("median_s", "p10_s", "p90_s")
    }
    out = []
    for (batch, prefix, budget), medians in wide["median_s"].iterrows():
        if pd.isna(medians.get("build-in-situ")):
            continue  # a configuration the probes did not run at
        row = {"B": int(batch), "S": int(prefix), "N": int(budget)}
        for timing, label in BUILD_PROBES.items():
            if pd.isna(medians.get(timing)):
                row[label] = "-"
                continue
            p10, p90 = (wide[v].loc[(batch, prefix, budget), timing] for v in ("p10_s", "p90_s"))
            row[label] = f"{fmt_us(medians[timing])} ({fmt_us(p10)}-{fmt_us(p90)})"
        extra = medians.get("part-build", np.nan) - medians.get("build-in-situ", np.nan)
        wake = medians.get("build-in-situ", np.nan) - medians.get("build-in-situ-back-to-back", np.nan)
        row["per-request work (part - in-situ)"] = "-" if pd.isna(extra) else fmt_us(extra)
        row["wake-up (after the draft - back to back)"] = "-" if pd.isna(wake) else fmt_us(wake)
        out.append(row)
    return pd.DataFrame(out)


BUILD_PROBE_TEXT = (
    "SGLang's build part against the tree-build stage's in-situ timing of the same function, in the same "
    "turns as the round: the part again with Python's collector off; the in-situ path (the whole batch's "
    "top-K copied to pageable host memory at once, SGLang's function and pad per request, one copy to the "
    "device per field) on the round's own top-K, once after the draft part as the build part runs, once "
    "right after another call of it, as the tree-build stage times its calls. The part's excess over the "
    "in-situ path after the draft is what the fork's per-request work costs (per request two blocking "
    "copies inside the function, five copies from pageable memory and the small kernels around them); the "
    "in-situ path after the draft over back to back is the host's wake-up after waiting on the GPU, which "
    "a round pays and the tree-build stage's loop does not."
)


def report_section(machines, figures, published_answer: str | None = None) -> Section:
    """The section on the machine with the current stack rounds (``machine_with_stacks``): per acceptance
    profile, tree or chain and what SGLang's round gains from each kernel; how it was measured; the
    figures; every table collapsed."""
    del published_answer  # chosen by content (machine_with_stacks)
    section = Section(TITLE)
    machine = machine_with_stacks(machines)
    if machine is None:
        return section.add(
            Text(INTRO),
            Text(
                "No machine here has stack rounds: they need a GPU, SGLang's DDTree files and its MoE "
                "kernels "
                "(docs/round_stages.md).",
                "em",
            ),
            *figures,
        )
    gpu = gpu_of(machine)
    if not current_method(machine):
        section.add(Text(EARLIER_METHOD, "em"))
    section.add(
        Text(
            f"**{machine.label}** ({machine.source}, {gpu}): tree or chain, and what SGLang's DDTree round "
            "gains from each of our kernels, each choice at its own best budget; a table each per "
            "acceptance profile. How the rounds were run follows the tables."
        )
    )
    first = stack_table(machine.step, catalog.PAPER_PROFILE)
    rel = run_spread(first)
    depths = sorted({int(d) for d in first.loc[first["stack"] != catalog.CHAIN, "depth"]})
    # both profiles' tree-or-chain tables first (the first screen), then what each kernel is worth
    tables = {
        p: first if p == catalog.PAPER_PROFILE else stack_table(machine.step, p)
        for p in catalog.ACCEPTANCE_PROFILES
    }
    for profile, table in tables.items():
        chains = tree_or_chain(table, rel)
        if not chains.empty:
            label = catalog.ACCEPTANCE_PROFILES[profile].label
            section.add(
                Text(f"**Tree or chain? tau: {label}; {gpu} ({machine.label}, {machine.source})**"),
                Table(chain_table(chains)),
            )
    for profile, table in tables.items():
        best = best_budgets(table, rel)
        verdict = verdict_table(table, best, rel)
        if not verdict.empty:
            label = catalog.ACCEPTANCE_PROFILES[profile].label
            section.add(
                Text(f"**What {BASE} gains from our kernels, tau: {label}; {gpu}**"),
                Table(verdict),
                Bullets(verdict_lines(table, best, rel)),
            )
    section.add(
        Text(INTRO),
        Text(
            "tau(N) = 1 + the expected accepted tokens of each acceptance profile's drafter's trees at the "
            "rounds' own depth L, at most 15 (the drafters' trained block of 16: positions past it are "
            f"taken to add nothing); here L = {', '.join(map(str, depths))} for the trees, and a chain of "
            "block b has L = b - 1. The same for every stack of a budget (docs/drafter.md), it scales "
            "tokens/s, never the order of the stacks at a budget."
        ),
        Text(spread_line(first, rel), "note"),
        Text(correct_line(first)),
    )
    for line in (launches_line(first), terms_line(first, best_budgets(first, rel))):
        if line:
            section.add(Text(line))
    section.add(*figures)
    section.add(*_tables(machine, first, rel))
    return section


def _tables(machine, table: pd.DataFrame, rel: float) -> list:
    per_budget = Section("Tokens/s per stack and budget (tau: paper)")
    for batch, prefix in sorted(
        {(int(b), int(p)) for b, p in zip(table["batch"], table["prefix"], strict=True)}
    ):
        per_budget.add(
            Text(f"B = {batch}, S = {prefix}"), Table(tokens_pivot(table, batch, prefix), collapsed=True)
        )
    falls = Section(f"Waterfalls at {BASE}'s best budget (tau: paper)")
    best = best_budgets(table, rel)
    for _, row in best[best["stack"] == BASE].iterrows():
        steps = waterfall(table, int(row["batch"]), int(row["prefix"]), int(row["budget"]), rel)
        if steps.empty:
            continue
        shown = pd.DataFrame(
            {
                "step": steps["step"],
                "takes off": ["-", *steps["saved_s"].iloc[1:].map(fmt_us)],
                "round after": steps["round_s"].map(fmt_us),
                "tokens/s after": steps["tokens_per_s"].map(lambda v: f"{v:,.0f}"),
                "shown": steps["shown"].map({True: "yes", False: "no win shown"}),
                "its own parts' difference": steps.get("parts_s", pd.Series(dtype=float)).map(
                    lambda v: "-" if pd.isna(v) else fmt_us(v)
                ),
            }
        )
        falls.add(
            Text(f"B = {int(row['batch'])}, S = {int(row['prefix'])}, N = {int(row['budget'])}"),
            Table(shown, collapsed=True),
        )
    return [
        per_budget,
        falls,
        Section("Every stack round (tau: paper)").add(
            Table(display_table(table), collapsed=True, summary="each round, its parts and estimated terms")
        ),
        Section("Stack rounds that could not run").add(Table(unavailable(machine.step), collapsed=True)),
        *_build_probes(machine),
    ]


def _build_probes(machine) -> list:
    probes = build_probe_table(machine.step)
    if probes.empty:
        return []
    return [
        Section(f"{BASE}'s build part, three ways").add(
            Text(BUILD_PROBE_TEXT), Table(probes, collapsed=True, summary="the build part and its probes")
        )
    ]
