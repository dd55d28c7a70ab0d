"""What the three kernels are worth: whole K2.6 rounds per stack (``catalog.STACKS``, the ``stack`` rows of
the round stage), as tokens per second.

- ``stack_table``: per (batch, prefix, depth, budget, stack) the whole round's median (p10-p90), its parts,
  tau(N) and tokens/s = batch x tau / round; the rows that could not run, with why.
- ``best_budgets``: each stack's best budget per (batch, prefix), and whether it sits on the grid's edge.
- ``waterfall``: from an SGLang stack to ours at one budget (both run in the same job): each kernel's own
  difference (its parts of the two rounds) and the rest (the whole rounds' difference less those); the
  one-kernel swap stacks' whole rounds beside it as a cross-check.
- ``run_to_run``: how far a repeated job moved the rounds' parts (``repeat:`` rows of one configuration run
  again in a later job): the host part (SGLang's build, its mask loop) and the GPU part (the forward) each
  as the largest relative change seen. A difference is shown only where it exceeds the two rounds' band:
  their p10-p90 spreads plus those relative changes of their host and GPU parts; else no win shown.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.report.document import Bullets, Section, Table, Text
from ddtree_bench.report.fmt import fmt_us
from ddtree_bench.report.load import named_machine
from ddtree_bench.throughput import tau_per_budget

TITLE = "What the three kernels are worth"
#: tau's trees: depth 16, each acceptance profile's own drafter distribution (``catalog.ACCEPTANCE_PROFILES``)
TAU_DEPTH = 16
BASES = tuple(s.name for s in catalog.STACKS.values() if s.base is None and s.name != catalog.OURS)
INTRO = (
    "Whole decode rounds on one GPU's share of Kimi K2.6 (rank 0 of tensor parallel 8, random weights, "
    "SGLang's Marlin W4A16 MoE, the DFlash drafter), one per stack, in the same job on the same weights, "
    "drafter output and trees. A stack is a tree build, a verify attention with its mask, and an accept: "
    "`sglang-fa3` is SGLang's DDTree round as the H200 runs it (its function per request with its copies, "
    "its per-request bool mask, FA3 two-pass tree verify, its Triton accept), `sglang-triton` the same with "
    "its Triton tree attention (what sm_120 runs), `ours` our GPU build, attention and accept as one CUDA "
    "graph, and `<stack>+<kernel>` SGLang's stack with that one kernel swapped for ours. The forward runs as "
    "a CUDA graph in every stack, so the stacks differ only in those kernels and the mask (SGLang's DDTree "
    "worker runs without CUDA graphs; its launches are not charged here). Tensor-parallel communication is "
    "not in a one-GPU round."
)


def _ok(step: pd.DataFrame, timing: str) -> pd.DataFrame:
    if step is None or step.empty or "stage" not in step:
        return pd.DataFrame()
    rows = step[(step["stage"] == "stack") & (step["status"] == "ok") & (step["timing"] == timing)]
    return rows.copy()


def stack_table(
    step: pd.DataFrame, shapes: pd.DataFrame | None, profile: str = catalog.PAPER_PROFILE
) -> pd.DataFrame:
    """One row per (batch, prefix, depth, budget, stack) that ran: ``round_s`` (median whole round),
    ``p10_s``, ``p90_s``, each part's median (``build_s``, ``mask_s``, ``forward_s``, ``accept_s``,
    ``draft_s``), ``tau``, ``tokens_per_s`` and ``correct``."""
    whole = _ok(step, "wall")
    if whole.empty:
        return pd.DataFrame()
    keys = ["batch", "prefix", "depth", "budget", "impl"]
    out = whole[[*keys, "median_s", "p10_s", "p90_s", "n", "correct", "note"]].rename(
        columns={"median_s": "round_s"}
    )
    for part in ("draft", "build", "mask", "forward", "accept"):
        rows = _ok(step, f"part-{part}")[[*keys, "median_s"]].rename(columns={"median_s": f"{part}_s"})
        out = out.merge(rows, on=keys, how="left")
    out = out.rename(columns={"impl": "stack"})
    tau = tau_per_budget(shapes, catalog.ACCEPTANCE_PROFILES[profile].distribution, TAU_DEPTH)
    out["tau"] = out["budget"].map(tau).astype("float64")
    out["tokens_per_s"] = out["batch"] * out["tau"] / out["round_s"]
    order = {name: i for i, name in enumerate(catalog.STACKS)}
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


def best_budgets(table: pd.DataFrame, grid: list[int] | None = None) -> pd.DataFrame:
    """Each stack's best budget (most tokens/s) per (batch, prefix): ``budget``, ``tokens_per_s``,
    ``round_s``, and ``edge`` (the best budget is the smallest or largest that stack ran there)."""
    if table.empty:
        return pd.DataFrame()
    rows = []
    for (batch, prefix, stack), part in table.dropna(subset=["tokens_per_s"]).groupby(
        ["batch", "prefix", "stack"], sort=False
    ):
        best = part.loc[part["tokens_per_s"].idxmax()]
        budgets = sorted(part["budget"])
        rows.append(
            {
                "batch": int(batch),
                "prefix": int(prefix),
                "stack": stack,
                "budget": int(best["budget"]),
                "tokens_per_s": float(best["tokens_per_s"]),
                "round_s": float(best["round_s"]),
                "edge": int(best["budget"]) in (budgets[0], budgets[-1]),
                "budgets_run": f"{budgets[0]}-{budgets[-1]}",
            }
        )
    return pd.DataFrame(rows)


def _at(table: pd.DataFrame, batch: int, prefix: int, budget: int, stack: str):
    rows = table[
        (table["batch"] == batch)
        & (table["prefix"] == prefix)
        & (table["budget"] == budget)
        & (table["stack"] == stack)
    ]
    return None if rows.empty else rows.iloc[0]


#: where no repeat was run: nothing known of the run-to-run spread beyond the within-job one
NO_REPEAT = {"host": 0.0, "gpu": 0.0, "where": None}


def run_to_run(step: pd.DataFrame) -> dict:
    """``{"host": r, "gpu": r, "where": text}``: the largest relative change between a job and its repeat
    (``repeat:`` timings) of a host build part (stacks with SGLang's build) and of a forward part."""
    if step is None or step.empty or "stage" not in step:
        return dict(NO_REPEAT)
    rows = step[(step["stage"] == "stack") & (step["status"] == "ok")]
    repeat = rows[rows["timing"].astype(str).str.startswith("repeat:")]
    if repeat.empty:
        return dict(NO_REPEAT)
    keys = ["batch", "prefix", "budget", "impl"]
    out = {"where": None}
    for name, part, builds in (("host", "part-build", True), ("gpu", "part-forward", False)):
        first = rows[rows["timing"] == part].set_index(keys)["median_s"]
        again = repeat[repeat["timing"] == f"repeat:{part}"].set_index(keys)["median_s"]
        both = pd.concat([first.rename("a"), again.rename("b")], axis=1, join="inner")
        if builds:
            both = both[[catalog.STACKS[k[-1]].build == catalog.SGLANG for k in both.index]]
        change = ((both["a"] - both["b"]).abs() / both[["a", "b"]].min(axis=1)).dropna()
        out[name] = float(change.max()) if not change.empty else 0.0
        if not both.empty:
            b, s, n, _ = both.index[0]
            out["where"] = f"B = {b}, S = {s}, N = {n}"
    return out


def _host_s(row) -> float:
    if catalog.STACKS[row["stack"]].build != catalog.SGLANG:
        return float(row.get("mask_s") or 0.0) if catalog.STACKS[row["stack"]].sglang_mask else 0.0
    return float(row["build_s"]) + (float(row["mask_s"]) if pd.notna(row.get("mask_s")) else 0.0)


def band(a, b, spread: dict) -> float:
    """The difference between rounds ``a`` and ``b`` that their noise allows (module docstring)."""
    within = float((a["p90_s"] - a["p10_s"]) + (b["p90_s"] - b["p10_s"]))
    host = _host_s(a) + _host_s(b)
    gpu = float(a["forward_s"]) + float(b["forward_s"])
    return within + spread.get("host", 0.0) * host + spread.get("gpu", 0.0) * gpu


#: each kernel's own part(s) of a round, and whether the part runs on the host (SGLang's build does)
OWN_PARTS = {"build": ("build_s",), "attention": ("mask_s", "forward_s"), "accept": ("accept_s",)}


def _parts(row, names) -> float:
    return float(sum(float(row[n]) for n in names if pd.notna(row.get(n))))


def _part_band(a, b, kernel: str, spread: dict) -> float:
    """What run-to-run noise allows for the difference of one kernel's own parts of rounds ``a`` and ``b``."""
    total = 0.0
    for row in (a, b):
        value = _parts(row, OWN_PARTS[kernel])
        on_host = kernel == "build" and catalog.STACKS[row["stack"]].build == catalog.SGLANG
        total += value * spread.get("host" if on_host else "gpu", 0.0)
    return total


def waterfall(
    table: pd.DataFrame, base: str, batch: int, prefix: int, budget: int, spread: dict | None = None
) -> pd.DataFrame:
    """From ``base`` (an SGLang stack) to ``ours`` at one (batch, prefix, budget), both run in the same job: a
    row per step with ``saved_s`` (what it takes off the round; negative: adds), ``round_s`` after it,
    ``tokens_per_s`` after it and ``shown`` (beyond what run-to-run noise allows). The kernels' own
    differences come from the rounds' parts (build; mask + forward; accept); the rest is the whole rounds'
    difference less those (the drafter, the shape of the round); ``swap_s`` is what the kernel's one-kernel
    swap stack took off ``base``'s whole round (a cross-check). Empty where a stack did not run there."""
    spread = spread or NO_REPEAT
    start = _at(table, batch, prefix, budget, base)
    ours = _at(table, batch, prefix, budget, catalog.OURS)
    if start is None or ours is None:
        return pd.DataFrame()
    tau = start["tau"]
    rows = [
        {"step": f"{base} (SGLang as it runs)", "saved_s": 0.0, "round_s": start["round_s"], "shown": True}
    ]
    current = float(start["round_s"])
    for kernel, names in OWN_PARTS.items():
        saved = _parts(start, names) - _parts(ours, names)
        current -= saved
        swap = _at(table, batch, prefix, budget, f"{base}+{kernel}")
        rows.append(
            {
                "step": f"our {kernel}",
                "saved_s": saved,
                "round_s": current,
                "shown": abs(saved) > _part_band(start, ours, kernel, spread),
                "swap_s": None if swap is None else float(start["round_s"] - swap["round_s"]),
            }
        )
    rest = current - float(ours["round_s"])
    rows.append(
        {
            "step": "the rest of the round",
            "saved_s": rest,
            "round_s": float(ours["round_s"]),
            "shown": abs(rest) > band(start, ours, spread),
        }
    )
    out = pd.DataFrame(rows)
    out["tokens_per_s"] = batch * tau / out["round_s"]
    return out


def carrying_kernel(steps: pd.DataFrame) -> str | None:
    """The kernel whose swap takes the most off the round (None where no swap's gain is shown)."""
    kernels = steps[steps["step"].str.startswith("our ") & steps["shown"] & (steps["saved_s"] > 0)]
    if kernels.empty:
        return None
    return str(kernels.loc[kernels["saved_s"].idxmax(), "step"]).removeprefix("our ")


# ----------------------------------------------------------------------------------------------- text


def _ms(seconds: float) -> str:
    return fmt_us(seconds)


def _best_pairs(best: pd.DataFrame, base: str):
    """``(batch, prefix, base's best row, ours' best row)`` where both stacks have a best budget."""
    for (batch, prefix), part in best.groupby(["batch", "prefix"], sort=True):
        mine = part[part["stack"] == base]
        ours = part[part["stack"] == catalog.OURS]
        if not mine.empty and not ours.empty:
            yield int(batch), int(prefix), mine.iloc[0], ours.iloc[0]


def verdict_lines(
    table: pd.DataFrame, best: pd.DataFrame, base: str, spread: dict | None = None
) -> list[str]:
    """Per (batch, prefix): SGLang's stack ``base`` at its best budget against ours at ours, and what each
    kernel's swap takes off ``base``'s round at ``base``'s best budget."""
    lines = []
    for batch, prefix, b, o in _best_pairs(best, base):
        steps = waterfall(table, base, int(batch), int(prefix), int(b["budget"]), spread)
        whole = _at(table, int(batch), int(prefix), int(b["budget"]), base)
        ours_there = _at(table, int(batch), int(prefix), int(b["budget"]), catalog.OURS)
        total_shown = abs(whole["round_s"] - ours_there["round_s"]) > band(whole, ours_there, spread or {})
        gains, rest = [], None
        for _, step in steps.iterrows():
            share = step["saved_s"] / b["round_s"] * 100
            text = f"{_ms(step['saved_s'])} ({share:.0f}%)" + ("" if step["shown"] else ", no win shown")
            if step["step"].startswith("our "):
                gains.append(f"{step['step']} {text}")
            elif step["step"].startswith("the rest"):
                rest = text
        carrier = carrying_kernel(steps) if not steps.empty else None
        lines.append(
            f"**B = {int(batch)}, S = {int(prefix)}.** {base}: best N = {int(b['budget'])}"
            f"{' (grid edge)' if b['edge'] else ''}, {b['tokens_per_s']:.0f} tokens/s; ours: best N = "
            f"{int(o['budget'])}{' (grid edge)' if o['edge'] else ''}, {o['tokens_per_s']:.0f} tokens/s "
            f"({o['tokens_per_s'] / b['tokens_per_s']:.2f}x). Of {base}'s {_ms(b['round_s'])} round at "
            f"N = {int(b['budget'])}: "
            + "; ".join(gains)
            + f"; the rest of the round {rest}"
            + (f". The {carrier} carries the gain." if carrier else ". No kernel's gain is shown.")
            + ("" if total_shown else " Ours against it at that budget: no win shown.")
        )
    return lines


def verdict_table(
    table: pd.DataFrame, best: pd.DataFrame, base: str, spread: dict | None = None
) -> pd.DataFrame:
    """The verdict at a glance: a row per question (do our three kernels pay off, at which budget, which
    kernel carries the gain), a column per (batch, prefix), each cell yes or no and the one number it rests
    on; ``verdict_lines`` gives the numbers behind each cell."""
    pays = f"Do our three kernels pay off? (ours' tokens/s over {base}'s, each at its best N)"
    budget = f"At which budget? (best N: {base}, ours)"
    carries = f"Which kernel carries the gain? (what it takes off {base}'s round at its best N)"
    columns = {"question (the number it rests on)": [pays, budget, carries]}
    for batch, prefix, b, o in _best_pairs(best, base):
        n = int(b["budget"])
        steps = waterfall(table, base, int(batch), int(prefix), n, spread)
        whole = _at(table, int(batch), int(prefix), n, base)
        ours_there = _at(table, int(batch), int(prefix), n, catalog.OURS)
        gain = o["tokens_per_s"] / b["tokens_per_s"]
        shown = abs(whole["round_s"] - ours_there["round_s"]) > band(whole, ours_there, spread or {})
        call = (
            f"yes: {gain:.2f}x"
            if gain > 1 and shown
            else f"no, slower: {gain:.2f}x"
            if gain < 1 and shown
            else f"no win shown: {gain:.2f}x"
        )
        carrier = carrying_kernel(steps) if not steps.empty else None
        if carrier:
            row = steps[steps["step"] == f"our {carrier}"].iloc[0]
            carried = f"{carrier}: {_ms(row['saved_s'])} ({row['saved_s'] / b['round_s'] * 100:.0f}%)"
        else:
            carried = "none shown"
        edge = lambda r: " (grid edge)" if r["edge"] else ""  # noqa: E731
        columns[f"B = {int(batch)}, S = {int(prefix)}"] = [
            call,
            f"N = {n}{edge(b)}, N = {int(o['budget'])}{edge(o)}",
            carried,
        ]
    return pd.DataFrame(columns) if len(columns) > 1 else pd.DataFrame()


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    if table.empty:
        return table
    return pd.DataFrame(
        {
            "B": table["batch"],
            "S": table["prefix"],
            "L": table["depth"],
            "N": table["budget"],
            "stack": table["stack"],
            "round (p10-p90)": [
                f"{_ms(r)} ({_ms(a)}-{_ms(b)})"
                for r, a, b in zip(table["round_s"], table["p10_s"], table["p90_s"], strict=True)
            ],
            "build": table["build_s"].map(_ms),
            "mask": table["mask_s"].map(lambda v: "-" if pd.isna(v) else _ms(v)),
            "forward": table["forward_s"].map(_ms),
            "accept": table["accept_s"].map(_ms),
            "tau": table["tau"].map(lambda v: f"{v:.2f}"),
            "tokens/s": table["tokens_per_s"].map(lambda v: "-" if pd.isna(v) else f"{v:.0f}"),
            "correct": table["correct"],
        }
    )


def tokens_pivot(table: pd.DataFrame, batch: int, prefix: int) -> pd.DataFrame:
    """tokens/s, a row per budget and a column per stack, at one (batch, prefix)."""
    part = table[(table["batch"] == batch) & (table["prefix"] == prefix)]
    pivot = part.pivot_table(index="budget", columns="stack", values="tokens_per_s", sort=False)
    pivot = pivot[[s for s in catalog.STACKS if s in pivot.columns]]
    return (
        pivot.map(lambda v: "-" if pd.isna(v) else f"{v:.0f}").reset_index().rename(columns={"budget": "N"})
    )


# ----------------------------------------------------------------------------------------------- figures


#: A one-kernel swap's line: (line style, marker) per kernel swapped; whole stacks are solid with dots.
SWAP_STYLES = {"build": ("--", "s"), "attention": (":", "^"), "accept": ("-.", "D")}
#: The waterfall's steps, top to bottom.
WATERFALL_STEPS = ("SGLang", "build", "attention", "accept", "rest", catalog.OURS)


def figure(table: pd.DataFrame, best: pd.DataFrame, path: Path, spread: dict | None = None) -> str:
    """Tokens/s per budget, a panel per (batch, prefix), a line per stack (a colour per SGLang stack and
    ours; a swap in its SGLang stack's colour, a line style per kernel swapped); and a horizontal waterfall
    panel per (batch, prefix) from sglang-fa3 to ours at sglang-fa3's best budget."""
    from matplotlib.lines import Line2D  # noqa: PLC0415

    from ddtree_bench.report.figures import budget_axis, colour, finish, panels  # noqa: PLC0415

    shown = sorted({(int(b), int(p)) for b, p in zip(table["batch"], table["prefix"], strict=True)})
    fig, axes = panels(2, len(shown), height=3.0)
    for col, (batch, prefix) in enumerate(shown):
        ax = axes[0][col]
        part = table[(table["batch"] == batch) & (table["prefix"] == prefix)]
        for name, stack in catalog.STACKS.items():
            line = part[part["stack"] == name].sort_values("budget")
            if line.empty:
                continue
            style, marker = SWAP_STYLES.get(stack.swap, ("-", "o"))
            ax.plot(
                line["budget"],
                line["tokens_per_s"],
                marker=marker,
                ms=3.5 if stack.base else 4,
                color=colour(stack.color),
                ls=style,
                lw=1.1 if stack.base else 2.0,
                alpha=0.8 if stack.base else 1.0,
                label=f"_{name}",  # the legend names colours and line styles, not each line
            )
            top = best[(best["batch"] == batch) & (best["prefix"] == prefix) & (best["stack"] == name)]
            if not top.empty and stack.base is None:
                ax.plot(
                    top["budget"],
                    top["tokens_per_s"],
                    marker="*",
                    ms=14,
                    color=colour(stack.color),
                    markeredgecolor="black",
                    markeredgewidth=0.6,
                    ls="",
                    zorder=3,
                )
        ticks = sorted(int(n) for n in part["budget"].unique())
        budget_axis(ax, ticks, every=-(-len(ticks) // 5))
        depth = int(part["depth"].iloc[0]) if batch != 1 else "N"
        ax.set_title(f"B = {batch}, S = {prefix}, L = {depth}")
        ax.set_xlabel("budget N")
        ax.set_ylabel("tokens/s (B x tau / round)" if col == 0 else "")
        _waterfall_panel(axes[1][col], table, best, batch, prefix, spread, first=col == 0)
    whole = [s for s in catalog.STACKS.values() if s.base is None and (table["stack"] == s.name).any()]
    legend = [(Line2D([], [], color=colour(s.color), lw=2.0, marker="o", ms=4), s.name) for s in whole]
    swaps = {s.swap for s in catalog.STACKS.values() if s.base and (table["stack"] == s.name).any()}
    legend += [
        (
            Line2D([], [], color="0.35", lw=1.1, ls=SWAP_STYLES[k][0], marker=SWAP_STYLES[k][1], ms=3.5),
            f"+ our {k}",
        )
        for k in SWAP_STYLES
        if k in swaps
    ]
    star = Line2D([], [], marker="*", ms=13, color="0.6", markeredgecolor="black", ls="none")
    finish(fig, axes, path, ncol=4, extra=(), legends=[legend + [(star, "best budget")]])
    return (
        "Top: tokens/s per budget (tau from the paper-fitted drafter trees of depth 16), whole stacks thick "
        "(a colour each), one-kernel swaps thin in their SGLang stack's colour (a line style per kernel "
        "swapped), stars at each whole stack's best budget. Bottom: SGLang as the H200 runs it (sglang-fa3) "
        "to ours at its best budget: each kernel's own difference (its parts of the two rounds; green takes "
        "off, red adds) and the rest of the round; hatched: within the run-to-run spread (no win shown)."
    )


def _waterfall_panel(wax, table, best, batch, prefix, spread, *, first: bool) -> None:
    """From sglang-fa3's round to ours at its best budget, one horizontal bar per step (top to bottom)."""
    from ddtree_bench.report.figures import colour  # noqa: PLC0415

    base = BASES[0]
    top = best[(best["batch"] == batch) & (best["prefix"] == prefix) & (best["stack"] == base)]
    steps = (
        pd.DataFrame()
        if top.empty
        else waterfall(table, base, batch, prefix, int(top["budget"].iloc[0]), spread)
    )
    if steps.empty:
        return  # no data: the panel is removed
    ms = steps["round_s"].to_numpy() * 1e3
    saved = steps["saved_s"].to_numpy() * 1e3
    wax.barh(0, ms[0], color=colour(catalog.STACKS[base].color))
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
    wax.set_yticks(
        range(len(WATERFALL_STEPS)), list(WATERFALL_STEPS) if first else [""] * len(WATERFALL_STEPS)
    )
    wax.invert_yaxis()
    wax.grid(False, axis="y")
    wax.set_title(f"{base} -> ours\nat N = {int(top['budget'].iloc[0])}")
    wax.set_xlabel("round (ms)")


# ----------------------------------------------------------------------------------------------- the section


def machine_with_stacks(machines, published_answer: str | None = None):
    """This run's machine (the first) where its step rows hold stack rounds, else the published machine
    ``published_answer`` names where its do (chosen by that name, never by the folders' order), else None."""
    for machine in (machines[:1] + [named_machine(machines, published_answer)]) if machines else ():
        if machine is not None and not stack_table(machine.step, machine.shapes).empty:
            return machine
    return None


def figure_for_report(inputs, path) -> str:
    machine = machine_with_stacks(inputs.machines, inputs.published_answer)
    if machine is None:
        from ddtree_bench.report.figures import empty_figure  # noqa: PLC0415

        empty_figure(path, "no stack rounds here (they need a GPU)")
        return "No machine here has stack rounds."
    table = stack_table(machine.step, machine.shapes)
    return f"{machine.label}. " + figure(table, best_budgets(table), path, run_to_run(machine.step))


def correct_line(table: pd.DataFrame) -> str:
    wrong = table[table["correct"] != True]  # noqa: E712 (nullable booleans)
    if wrong.empty:
        return f"In all {len(table)} stack configurations the rounds' accepted paths equal the CPU walk."
    names = ", ".join(sorted(set(wrong["stack"])))
    return (
        f"In {len(wrong)} of {len(table)} stack configurations the accepted paths differ from the CPU walk "
        f"({names})."
    )


def spread_line(spread: dict) -> str:
    if spread.get("where") is None:
        return (
            "Run-to-run spread: no configuration was run twice, so only each job's own p10-p90 decides "
            "whether a difference is shown."
        )
    return (
        f"Run-to-run spread: one configuration ({spread['where']}) was run again in a later job; between the "
        f"two, SGLang's host build part moved by up to {spread['host'] * 100:.0f}% and the forward by "
        f"{spread['gpu'] * 100:.1f}%. A difference is shown only where it exceeds those shares of the parts "
        "it compares (plus the rounds' p10-p90); else it says no win shown."
    )


def report_section(machines, figures, published_answer: str | None = None) -> Section:
    """The section, on this run's machine where it has stack rounds, else on ``published_answer``'s: the
    verdict per SGLang stack, the best budgets, tokens/s per budget, the waterfalls, every round and the
    rounds that could not run."""
    section = Section(TITLE)
    machine = machine_with_stacks(machines, published_answer)
    if machine is None:
        return section.add(
            Text(INTRO),
            Text(
                "Neither this machine nor the published answer's has stack rounds: they need a GPU, "
                "SGLang's DDTree files and its MoE kernels (docs/round_stages.md). The published H200's are "
                "in results/published/h200/.",
                "em",
            ),
            *figures,
        )
    table = stack_table(machine.step, machine.shapes)
    spread = run_to_run(machine.step)
    profiles = profiles_with_tau(machine) or [catalog.PAPER_PROFILE]
    # the verdicts first (a table each, its numbers in notes under it), then how they were measured
    _add_verdicts(section, machine, profiles, spread)
    section.add(*_method(machine, profiles, table, spread))
    section.add(*figures)
    section.add(
        _best_budgets_section(machine, profiles),
        _per_budget_section(table),
        _waterfalls_section(table, best_budgets(table), spread),
        Section("Every stack round").add(
            Table(display_table(table), collapsed=True, summary="median round and parts per configuration")
        ),
        Section("Stack rounds that could not run").add(Table(unavailable(machine.step), collapsed=True)),
    )
    return section


def _add_verdicts(section: Section, machine, profiles: list[str], spread) -> None:
    """Per SGLang stack (every stack under the first profile, the first stack under the others) and
    acceptance profile: what it gains from our kernels, a table and its notes; then whether the answer is
    the same under every profile."""
    section.add(
        Text(
            f"**{machine.label}** ({machine.source}): does SGLang's DDTree round gain from our three "
            "kernels, each stack at its own best budget? A table per SGLang stack and acceptance profile; "
            "how the rounds were run follows the tables."
        )
    )
    for profile in profiles:
        label = catalog.ACCEPTANCE_PROFILES[profile].label
        t = stack_table(machine.step, machine.shapes, profile)
        b = best_budgets(t)
        for base in BASES if profile == profiles[0] else BASES[:1]:
            lines = verdict_lines(t, b, base, spread)
            if lines:
                section.add(
                    Text(f"**What {catalog.STACKS[base].label} gains from our kernels, tau: {label}**"),
                    Table(verdict_table(t, b, base, spread)),
                    Bullets(lines),
                )
    same = sameness_line(machine)
    if same:
        section.add(Text(f"**Is the answer the same under every acceptance profile?** {same}"))


def _method(machine, profiles: list[str], table: pd.DataFrame, spread) -> list:
    """How the rounds were run: the stacks, tau per acceptance profile, the run-to-run spread and the
    correctness check."""
    return [
        Text(INTRO),
        Text(
            f"**{machine.label}** ({machine.source}). tau(N) = 1 + the expected accepted tokens of the "
            f"trees of depth {TAU_DEPTH} of each acceptance profile's drafter, the same for every stack: it "
            "scales tokens/s, never the order of the stacks at a budget. Profiles here: "
            + "; ".join(
                f"{catalog.ACCEPTANCE_PROFILES[p].label}: fitted to {catalog.ACCEPTANCE_PROFILES[p].source}"
                for p in profiles
            )
            + ". Batch 1 runs SGLang's regime (L = N: its block is N + 1 tokens); batch 8 and 64 run the "
            "drafter's block of 16 (L = 15)."
        ),
        Text(spread_line(spread), "note"),
        Text(correct_line(table)),
    ]


def _best_budgets_section(machine, profiles: list[str]) -> Section:
    """Each stack's best budget under every acceptance profile (one collapsed table)."""
    every = []
    for profile in profiles:
        b = best_budgets(stack_table(machine.step, machine.shapes, profile))
        every.append(
            b.assign(
                tau=profile,
                edge=b["edge"].map({True: "yes", False: "no"}),
                tokens_per_s=b["tokens_per_s"].map(lambda v: f"{v:.0f}"),
                round_s=b["round_s"].map(_ms),
            )
        )
    shown = pd.concat(every, ignore_index=True).rename(
        columns={"tokens_per_s": "tokens/s", "round_s": "round", "budget": "best N", "edge": "grid edge"}
    )
    return Section("Each stack's best budget").add(Table(shown, collapsed=True))


def _per_budget_section(table: pd.DataFrame) -> Section:
    """Tokens/s per stack and budget, a collapsed table per (batch, prefix)."""
    per_budget = Section("Tokens/s per stack and budget")
    for batch, prefix in sorted(
        {(int(b), int(p)) for b, p in zip(table["batch"], table["prefix"], strict=True)}
    ):
        per_budget.add(
            Text(f"B = {batch}, S = {prefix}"), Table(tokens_pivot(table, batch, prefix), collapsed=True)
        )
    return per_budget


def _waterfalls_section(table: pd.DataFrame, best: pd.DataFrame, spread) -> Section:
    """The waterfall at each SGLang stack's best budget (``best``), a collapsed table each."""
    falls = Section("Waterfalls at each SGLang stack's best budget")
    for _, row in best[best["stack"].isin(BASES)].iterrows():
        steps = waterfall(
            table, row["stack"], int(row["batch"]), int(row["prefix"]), int(row["budget"]), spread
        )
        if steps.empty:
            continue
        shown_steps = pd.DataFrame(
            {
                "step": steps["step"],
                "takes off": steps["saved_s"].map(_ms),
                "round after": steps["round_s"].map(_ms),
                "tokens/s after": steps["tokens_per_s"].map(lambda v: f"{v:.0f}"),
                "shown": steps["shown"].map({True: "yes", False: "no win shown"}),
                "its swap stack took off": steps.get("swap_s", pd.Series(dtype=float)).map(
                    lambda v: "-" if pd.isna(v) else _ms(v)
                ),
            }
        )
        falls.add(
            Text(
                f"B = {int(row['batch'])}, S = {int(row['prefix'])}, N = {int(row['budget'])}: {row['stack']}"
            ),
            Table(shown_steps, collapsed=True),
        )
    return falls


def profiles_with_tau(machine) -> list[str]:
    """The acceptance profiles whose tau this machine's tree shapes hold (the paper's first)."""
    return [
        name
        for name, profile in catalog.ACCEPTANCE_PROFILES.items()
        if not tau_per_budget(machine.shapes, profile.distribution, TAU_DEPTH).empty
    ]


def _range(per: dict) -> str:
    values = [v[2] for v in per.values()]
    return f"{min(values):.2f}-{max(values):.2f}x"


def sameness_line(machine) -> str | None:
    """Whether the answer is the same under every profile: ours against SGLang's FA3 stack at each one's best
    budget, and whether the best budgets move."""
    names = profiles_with_tau(machine)
    if len(names) < 2:
        return None
    verdicts = {}
    for name in names:
        table = stack_table(machine.step, machine.shapes, name)
        best = best_budgets(table)
        per = {}
        for (batch, prefix), part in best.groupby(["batch", "prefix"], sort=True):
            mine = part[part["stack"] == BASES[0]]
            ours = part[part["stack"] == catalog.OURS]
            if mine.empty or ours.empty:
                continue
            per[(int(batch), int(prefix))] = (
                int(mine["budget"].iloc[0]),
                int(ours["budget"].iloc[0]),
                float(ours["tokens_per_s"].iloc[0] / mine["tokens_per_s"].iloc[0]),
            )
        verdicts[name] = per
    first, *others = names
    parts = []
    for other in others:
        moved = [
            f"B = {b}, S = {s}: N = {verdicts[first][(b, s)][0]} -> {verdicts[other][(b, s)][0]}"
            for (b, s) in verdicts[first]
            if (b, s) in verdicts[other] and verdicts[first][(b, s)][0] != verdicts[other][(b, s)][0]
        ]
        faster = all(v[2] > 1 for v in verdicts[other].values()) and all(
            v[2] > 1 for v in verdicts[first].values()
        )
        ratios = [v[2] for v in verdicts[other].values()]
        parts.append(
            f"Under {other}: ours {'still beats' if faster else 'does not always beat'} SGLang's FA3 stack "
            f"({min(ratios):.2f}-{max(ratios):.2f}x at each one's best budget, against "
            f"{_range(verdicts[first])} under {first}); "
            + (
                "SGLang's best budget moves (" + "; ".join(moved) + ")."
                if moved
                else "SGLang's best budgets are the same."
            )
        )
    return " ".join(parts)
