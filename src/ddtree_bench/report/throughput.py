"""The report's "Which budget?" section: the throughput model (``throughput``) on each machine's measured
tree builds, verify attention, accept and tree shapes; a figure of modelled tokens/s vs budget (a line per
builder, a panel per batch size), the best budget per builder, the GPU builder's gain over SGLang's builder
(or over ``reference``, labelled as our stand-in) at each one's own best budget, and the model's assumptions.

The section is shown on the configured first distribution and on ``recorded`` where configured. A machine
without one of them says so and shows its own first distribution instead, named in the heading. A machine
without measured step stages (no verify attention or forward: a CPU-only run) has no section and no
modelled tokens/s anywhere: one note (``no_model_note``) says why, and the sections are the other machines'
own, each modelled on its own measured rows only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.report.document import Bullets, Section, Table, Text
from ddtree_bench.report.figures import (
    budget_axis,
    builder_facets,
    builder_series,
    colour,
    empty_figure,
    facet_panels,
    finish,
    panels,
)
from ddtree_bench.report.fmt import fmt_us
from ddtree_bench.report.names import BUILDER_LABELS, BUILDER_STYLES
from ddtree_bench.throughput import (
    ASSUMPTIONS,
    BUILDERS,
    CPU_BUILDERS,
    MEASURED,
    SUM_OF_PARTS,
    TERM_LABELS,
    RoundAssumptions,
    Throughput,
    best_budgets,
    gpu_gains,
    term_sources,
    throughput,
)

TITLE = "Which budget?"
TARGET = "the report names the best budget per builder"
TARGET_SOURCE = "throughput"
FIGURE = "which_budget"
INTRO = (
    "What a budget buys against what it costs, per tree builder: the modelled tokens per second of a batch, "
    "B x tau(N) / round, where the round is the drafter's forward, the builder's measured tree build, the "
    "target's forward over the B x (N + 1) tree tokens (our verify attention, the INT4 MoE, the dense BF16 "
    "parts, the LM head), the tensor-parallel communication and the measured tree accept. Each term is "
    "measured where the step stages measured it, else estimated (or entered) and labelled so; a (B, N) with "
    "a missing term is named, not modelled. The best budget is each builder's own; the term that sets it is "
    "the one that grows the most from the best budget to the next; the gain is the GPU builder's tokens/s "
    "at its best budget over the baseline's at the baseline's best."
)


@dataclass
class BudgetSection:
    """One (machine, distribution) of the section: the model's result, or why there is none."""

    machine: str
    distribution: str
    depth: int | None
    result: Throughput | None
    note: str = ""  # e.g. that the configured distribution is absent and this one is shown instead
    best: pd.DataFrame = field(default_factory=pd.DataFrame)
    gains: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: whose acceptance tau is (``catalog.ACCEPTANCE_PROFILES``)
    profile: str = catalog.PAPER_PROFILE

    @property
    def missing(self) -> str | None:
        if self.result is None:
            return self.note or "no data"
        return self.result.missing

    def heading(self) -> str:
        parts = [f"L = {self.depth}"] if self.depth else []
        result = self.result
        if result is not None and not result.missing:
            verify = result.verify
            parts.append(f"verify attention at S = {verify.prefix}, {verify.heads} heads")
            if verify.distribution != self.distribution:
                parts.append(
                    f"verify attention and accept measured on the {verify.distribution} trees (the step "
                    f"stages' trees; the {self.distribution} trees' own were not measured)"
                )
        label = catalog.ACCEPTANCE_PROFILES[self.profile].label
        return f"{self.machine}: {self.distribution} trees, tau: {label} ({'; '.join(parts)})"


# ----------------------------------------------------------------------------------------------- sections


def _distributions_of(machine) -> list[str]:
    df = machine.summary
    if df is None or df.empty or "distribution" not in df:
        return []
    ok = df[df["status"] == "ok"] if "status" in df else df
    return list(dict.fromkeys(str(d) for d in ok["distribution"].dropna()))


def _configured(machine, fallback: list[str] | None) -> tuple[list[str], int | None]:
    """A machine's configured distributions and first depth (its environment.json), or ``fallback``."""
    config = machine.environment.get("config") or {}
    distributions = list(config.get("distributions") or fallback or _distributions_of(machine))
    depths = config.get("depths") or []
    return distributions, (int(depths[0]) if depths else None)


def sections(
    machines,
    settings: dict,
    options: dict | None,
    *,
    distributions: list[str] | None = None,
    depth: int | None = None,
    profiles: list[str] | None = None,
) -> list[BudgetSection]:
    """The model per machine on the configured first distribution and on ``recorded`` where configured
    (``distributions``: this run's configuration; default: the first machine's own), each machine's
    substitute named where it lacks one. ``settings``: per machine label, its step ``layers`` (and ``depth``);
    ``options``: ``settings.Settings.throughput_options()`` (None: the defaults). Each machine is modelled on
    its own step rows only: a machine without measured step stages (``has_step_stages``) has no section
    (``no_model_note`` says why)."""
    options = options or {}
    if not machines:
        return []
    first_distributions, first_depth = _configured(machines[0], None)
    if distributions:  # this run's configuration, over what its environment.json recorded
        first_distributions = list(distributions)
    wanted = list(
        dict.fromkeys(first_distributions[:1] + [d for d in first_distributions if d == "recorded"])
    )
    out = []
    prefix = options.get("prefix_length")
    for index, machine in enumerate(machines):
        if not has_step_stages(machine):
            continue
        own_depth = _configured(machine, None)[1]
        layers = int(settings.get(machine.label, {}).get("layers") or 61)
        assumptions = RoundAssumptions.from_options(options, layers)
        machine_depth = (depth if index == 0 else None) or own_depth or first_depth or _first_depth(machine)
        for distribution, shown, note in _shown_distributions(machine, wanted):
            if shown is None:
                out.append(BudgetSection(machine.label, distribution, machine_depth, None, note))
                continue
            for profile in _profiles(machine, profiles, index):
                acceptance = catalog.ACCEPTANCE_PROFILES[profile]
                result = throughput(
                    machine.summary,
                    machine.step,
                    machine.shapes,
                    assumptions,
                    distribution=shown,
                    depth=machine_depth,
                    prefix=prefix,
                    tau_from=acceptance.distribution if acceptance.params is not None else None,
                )
                best = best_budgets(result.table)
                out.append(
                    BudgetSection(
                        machine.label,
                        shown,
                        machine_depth,
                        result,
                        note,
                        best=best,
                        gains=gpu_gains(best),
                        profile=profile,
                    )
                )
    return out


def _shown_distributions(machine, wanted: list[str]) -> list[tuple[str, str | None, str]]:
    """Per wanted distribution, once each: ``(wanted, the distribution shown or None, note)``: the wanted
    trees where the machine has them, else a substitute of its own (named in the note), else None (the note
    says why); a distribution already shown is not shown again."""
    own = _configured(machine, None)[0]
    present = _distributions_of(machine)
    out, shown = [], set()
    for distribution in wanted:
        note = ""
        chosen = distribution
        if chosen not in present:
            substitute = next((d for d in own + present if d in present and d not in shown), None)
            if substitute is None:
                out.append(
                    (distribution, None, f"no tree-build rows of the {distribution} trees on this machine")
                )
                continue
            note = (
                f"The configured {distribution} trees are absent on {machine.label}; shown instead: its "
                f"{substitute} trees."
            )
            chosen = substitute
        if chosen in shown:
            continue
        shown.add(chosen)
        out.append((distribution, chosen, note))
    return out


def no_step_reason(machine) -> str:
    """Why a machine has no measured step stages, as its rows or files say (never a guess)."""
    step = machine.step
    if step is None or step.empty:
        return machine.step_missing
    if "status" in step:
        bad = step[step["status"] != "ok"]
        if "status_reason" in bad and bad["status_reason"].notna().any():
            return f"its step stages did not run: {bad['status_reason'].dropna().iloc[0]}"
    return "no measured verify attention or forward in its step rows"


def _profiles(machine, profiles, index: int) -> list[str]:
    """The acceptance profiles a machine's sections are modelled under: this run's configured ones for the
    first machine, a published machine's recorded ones (its environment.json), else the paper's only."""
    if index == 0 and profiles:
        return list(profiles)
    config = machine.environment.get("config") or {}
    recorded = [p for p in config.get("acceptance_profiles") or () if p in catalog.ACCEPTANCE_PROFILES]
    return recorded or [catalog.PAPER_PROFILE]


def has_step_stages(machine) -> bool:
    """Whether a machine measured the step stages its round is modelled on: verify attention or the forward
    (rows saying why they did not run: no). Without them it has no modelled tokens/s."""
    step = machine.step
    if step is None or step.empty or not {"stage", "status"} <= set(step.columns):
        return False
    return bool((step["stage"].isin(["verify-attention", "forward"]) & (step["status"] == "ok")).any())


def no_model_note(machines, found: list[BudgetSection]) -> str:
    """One note on the machines without measured step stages (``has_step_stages``): each has no modelled
    tokens/s of its own, and why; the sections of ``found`` are the other machines' own. "" where every
    machine measured them."""
    by_reason: dict[str, list[str]] = {}
    for machine in machines:
        if not has_step_stages(machine):
            by_reason.setdefault(no_step_reason(machine), []).append(f"{machine.label} ({machine.source})")
    if not by_reason:
        return ""
    lines = []
    for reason, names in by_reason.items():
        if len(names) == 1:
            subject, has, its = names[0], "has", "it has"
        else:
            subject, has, its = f"{', '.join(names[:-1])} and {names[-1]}", "have", "they have"
        own = "its own" if len(names) == 1 else "their own"
        lines.append(
            f"{subject} {has} no GPU step stages ({reason}), so {its} no modelled K2.6 tokens/s of {own}."
        )
    shown = list(dict.fromkeys(s.machine for s in found))
    names = [f"{m.label} ({m.source})" for m in machines if m.label in shown]
    if names:
        lines.append(
            "The sections below model only the machines that measured them, each on its own rows: "
            f"{', '.join(names)}."
        )
    else:
        lines.append("No machine here measured them: the step stages run on a CUDA GPU (step.enabled: true).")
    return " ".join(lines)


def _first_depth(machine) -> int | None:
    df = machine.summary
    if df is None or df.empty or "depth" not in df or not df["depth"].notna().any():
        return None
    return int(df["depth"].dropna().iloc[0])


# ----------------------------------------------------------------------------------------------- tables


def _tps(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _set_by(row) -> str:
    """The term that sets a best budget, in words: the term, its growth to the next budget, its source."""
    if row.get("set_by") is None or (isinstance(row.get("set_by"), float) and math.isnan(row["set_by"])):
        return "- (the largest budget compared)"
    source = row["set_by_source"]
    where = "" if source in (MEASURED, SUM_OF_PARTS) else f", {source}"
    growth = fmt_us(row["set_by_growth_s"])
    return (
        f"{TERM_LABELS[row['set_by']]} (+{growth} to N = {int(row['next_budget'])}{where}; "
        f"round x{row['round_growth']:.2f} vs tau x{row['tau_gain']:.2f})"
    )


def best_table(section: BudgetSection) -> pd.DataFrame:
    """The best budget of every builder, per batch size, and the term that sets it."""
    best = section.best
    if best.empty:
        return pd.DataFrame()
    return pd.DataFrame(
        {
            "B": best["batch"],
            "builder": best["label"],
            "build cost from": best["build_from"],
            "best N": best["best_budget"],
            "grid edge": ["yes" if _edge(row) else "no" for row in best.to_dict("records")],
            "tokens/s": best["tokens_per_s"].map(_tps),
            f"tau ({section.profile})": best["tau"].map(lambda v: f"{v:.2f}"),
            "round": best["round_s"].map(fmt_us),
            "set by": [_set_by(row) for row in best.to_dict("records")],
            "budgets compared": best["budgets"].map(lambda b: ", ".join(str(x) for x in b)),
        }
    )


def sources_table(section: BudgetSection) -> pd.DataFrame:
    """Which source each term of the modelled rounds has (measured, sum of parts, estimated, entered)."""
    table = section.result.table if section.result is not None else pd.DataFrame()
    return term_sources(table)


def run_round_lines(section: BudgetSection) -> list[str]:
    """Which rounds are run rather than summed, and per batch and CPU builder with run rounds beside the GPU
    builder's: how much of the GPU builder's shorter round its build explains and how much the round's shape
    (one graph against the split around a host build), medians over the budgets both ran."""
    table = section.result.table if section.result is not None else pd.DataFrame()
    if table.empty or "round_from" not in table:
        return []
    run = table[table["run_round_s"].notna()]
    if run.empty:
        return []
    spread = pd.to_numeric(run["run_spread"], errors="coerce").median() if len(run) else math.nan
    noise = (
        ""
        if pd.isna(spread)
        else (
            f" A run round's p10-p90 spread is {100 * spread:.1f}% of its median (median over them), so a "
            "difference below that says nothing."
        )
    )
    lines = [
        f"Rounds run on the GPU (the round stage: the whole round host-inclusive, plus the communication "
        f"term): {len(run)} of {len(table)} modelled (B, N, builder); the others are the sum of the terms."
        + noise
    ]
    for batch, rows in run.groupby("batch"):
        gpu = rows[rows["builder"] == catalog.SUBJECT].set_index("budget")
        for builder in CPU_BUILDERS:
            other = rows[rows["builder"] == builder].set_index("budget")
            common = gpu.index.intersection(other.index)
            if gpu.empty or common.empty:
                continue
            total = (other.loc[common, "run_round_s"] - gpu.loc[common, "run_round_s"]).median()
            build = (other.loc[common, "build_s"] - gpu.loc[common, "build_s"]).median()
            budgets = ", ".join(str(n) for n in common)
            lines.append(
                f"B = {batch}, gpu against {builder} (N = {budgets}): the run round "
                f"is {fmt_us(total)} shorter (median; negative: longer); the builds differ by "
                f"{fmt_us(build)}, the rest, {fmt_us(total - build)}, is the round's shape (one graph "
                "against the split) or drift "
                "between the two builders' blocks of rounds (timed one after the other)."
            )
    return lines


def unmodelled_lines(section: BudgetSection) -> list[str]:
    """The (B, N) left out because a term is missing, with the term named (one line per B, N)."""
    result = section.result
    if result is None or result.unmodelled.empty:
        return []
    rows = result.unmodelled.drop_duplicates(["batch", "budget", "missing"])
    return [f"B = {r.batch}, N = {r.budget}: {r.missing}" for r in rows.itertuples(index=False)]


def gains_table(section: BudgetSection) -> pd.DataFrame:
    """Per batch size, the GPU builder's gain over the baseline, each at its own best budget."""
    gains = section.gains
    if gains.empty:
        return pd.DataFrame()
    return pd.DataFrame(
        {
            "B": gains["batch"],
            "gpu: best N": gains["gpu_budget"],
            "gpu: tokens/s": gains["gpu_tokens_per_s"].map(_tps),
            "baseline": gains["baseline_label"],
            "baseline: best N": gains["baseline_budget"],
            "baseline: tokens/s": gains["baseline_tokens_per_s"].map(_tps),
            "gain": gains["gain"].map(lambda v: f"{v:.2f}x"),
        }
    )


def _term_cell(seconds, source) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    return fmt_us(seconds) if source in (MEASURED, SUM_OF_PARTS) else f"{fmt_us(seconds)} ({source})"


def detail_table(section: BudgetSection) -> pd.DataFrame:
    """Every modelled (B, N): tau, the round's terms (each marked with its source where not measured), and
    each builder's build and tokens/s."""
    table = section.result.table if section.result is not None else pd.DataFrame()
    if table.empty:
        return pd.DataFrame()
    keys = ["batch", "budget"]
    first = table.drop_duplicates(keys).set_index(keys)
    out = pd.DataFrame(
        {
            "B": first.index.get_level_values("batch"),
            "N": first.index.get_level_values("budget"),
            "tau": first["tau"].map(lambda v: f"{v:.2f}").to_numpy(),
        }
    )
    for term in ("draft", "forward", "attention", "moe", "dense", "lm_head", "allreduce", "accept"):
        name = TERM_LABELS[term] + (" x layers" if term == "attention" else "")
        out[name] = [
            _term_cell(v, src) for v, src in zip(first[f"{term}_s"], first[f"{term}_source"], strict=True)
        ]
    for builder, *_ in BUILDERS:
        sel = table[table["builder"] == builder].set_index(keys).reindex(first.index)
        if sel["label"].notna().any():
            out[f"{builder}: build / tokens/s"] = [
                "-" if pd.isna(b) else f"{fmt_us(b)} / {_tps(t)}"
                for b, t in zip(sel["build_s"], sel["tokens_per_s"], strict=True)
            ]
    return out


def model_line(options: dict | None) -> str:
    options = options or {}
    assumptions = RoundAssumptions.from_options(options, 61)
    prefix = options.get("prefix_length")
    return (
        f"Model: {assumptions.describe()}; E(T) = 384 (1 - (1 - 8/384)^T); verify attention at "
        f"{'S = ' + str(prefix) if prefix else 'the largest measured S'} (throughput section of the "
        "configuration; docs/throughput.md)."
    )


# ----------------------------------------------------------------------------------------------- targets


def budget_targets(found: list[BudgetSection], machines) -> list[tuple[str, str, str, str, str]]:
    """The goal "the report names the best budget per builder", per machine: ``(machine, target, source,
    status, measured)``."""
    results = []
    for machine in machines:
        label = machine.label
        mine = [s for s in found if s.machine == label]
        named = [s for s in mine if not s.best.empty]
        if not has_step_stages(machine):
            why = f"no modelled tokens/s: no GPU step stages ({no_step_reason(machine)})"
            results.append((label, TARGET, TARGET_SOURCE, "no data", why))
            continue
        if not named:
            why = "; ".join(f"{s.distribution}: {s.missing}" for s in mine if s.missing) or "no data"
            results.append((label, TARGET, TARGET_SOURCE, "no data", why))
            continue
        parts = []
        for section in named:
            for batch, group in section.best.groupby("batch", sort=True):
                each = ", ".join(
                    f"{b} {n}" for b, n in zip(group["builder"], group["best_budget"], strict=True)
                )
                parts.append(f"{section.distribution}, B={int(batch)}: {each}")
        results.append((label, TARGET, TARGET_SOURCE, "met", "best N: " + "; ".join(parts)))
    return results


# ----------------------------------------------------------------------------------------------- figure


def _row_title(section: BudgetSection) -> str:
    return f"{section.machine}, {section.distribution} trees, tau {section.profile}"


def figure(found: list[BudgetSection], path, options: dict | None = None) -> str:
    """Modelled tokens/s vs budget: a row of facets per (machine, distribution, acceptance profile) with
    data, a facet per batch size, a line per builder with a star at its best budget (stars sharing a budget
    nested, the first builder's largest); x ticks at the modelled budgets; legend below. Returns the
    caption's sources sentence."""
    from matplotlib.lines import Line2D  # noqa: PLC0415

    rows = [s for s in found if s.result is not None and not s.result.table.empty]
    if not rows:
        empty_figure(path, "Which budget?: no data (needs the step stages' verify attention and accept)")
        return "No data: the model needs the step stages' measured verify attention and accept."
    data = pd.concat([s.result.table.assign(section=_row_title(s)) for s in rows], ignore_index=True)
    data = data[data["builder"].isin(list(BUILDER_STYLES))]
    sections = list(dict.fromkeys(data["section"]))
    g = builder_facets(data, row="section", col="batch", row_order=sections, height=3.2)
    g.map_dataframe(builder_series, x="budget", y="tokens_per_s")
    for ax, panel in facet_panels(g, data, "section", "batch"):
        best = panel.loc[panel.groupby("builder")["tokens_per_s"].idxmax()].set_index("builder")
        for builder in (b for b in BUILDER_STYLES if b in best.index):
            budget, tokens = best.loc[builder, ["budget", "tokens_per_s"]]
            k = [b for b in BUILDER_STYLES if b in best.index[best["budget"] == budget]].index(builder)
            ax.plot(
                [budget],
                [tokens],
                marker="*",
                markersize=max(16 - 4 * k, 6),
                color=colour(BUILDER_STYLES[builder][0]),
                markeredgecolor="black",
                markeredgewidth=0.6,
                linestyle="none",
                zorder=3 + k,
            )
        budget_axis(ax, sorted(int(b) for b in panel["budget"].unique()))
        ax.set_ylim(bottom=0)
        ax.set_title(f"{panel['section'].iloc[0]}: B = {panel['batch'].iloc[0]}")
    star = Line2D([], [], marker="*", markersize=13, color="0.6", markeredgecolor="black", linestyle="none")
    finish(
        g.figure,
        g.axes,
        path,
        ncol=3,
        extra=[(star, "best budget (each builder's)")],
        xlabel="budget N (nodes per tree)",
        ylabel="tokens/s (model) = B x tau / round\n(draft + build + forward + comm. + accept)",
    )
    sources = "; ".join(
        f"{row.term}: {', '.join(part.split(' (')[0] for part in row.sources.split('), '))}"
        for row in term_sources(rows[0].result.table).itertuples(index=False)
        if row.term in ("draft", "target forward", "communication")
    )
    return f"Terms: {sources}; build and accept measured."


def figure_for_report(inputs, path) -> str:
    return figure(inputs.budget_sections, path, inputs.throughput_options)


ROUND_FIGURE = "round_parts"
#: The round's parts in the stacked bars, bottom first, and their colours (of the report's palette).
_PART_COLOURS = {
    "draft": "C7",
    "build": "C1",
    "attention": "C0",
    "moe": "C2",
    "dense": "C8",
    "lm_head": "C6",
    "forward": "C9",
    "allreduce": "C4",
    "accept": "C5",
}
_HATCHES = {"estimated": "//", "entered": ".."}


def _bar_rows(table: pd.DataFrame, batch: int) -> dict[int, list[tuple[str, pd.Series]]]:
    """Per budget: the rows of the gpu builder, of the fastest other CPU builder and of sglang (where each
    has one), with the short name shown on its bar."""
    out = {}
    sel = table[table["batch"] == batch]
    for budget, group in sel.groupby("budget", sort=True):
        bars = []
        gpu = group[group["builder"] == catalog.SUBJECT]
        if len(gpu):
            bars.append((catalog.SUBJECT, gpu.iloc[0]))
        cpu = group[group["builder"].isin([b for b in CPU_BUILDERS if b != catalog.BASELINE])]
        if len(cpu):
            best = cpu.loc[cpu["build_s"].idxmin()]
            bars.append((str(best["builder"]), best))
        sglang = group[group["builder"] == catalog.BASELINE]
        if len(sglang):
            bars.append((catalog.BASELINE, sglang.iloc[0]))
        out[int(budget)] = bars
    return out


def figure_round_parts(found: list[BudgetSection], path) -> str:
    """The round's parts per budget at batch 1 and 64 (else the smallest and largest modelled), stacked:
    a bar each for the gpu builder, the fastest other CPU builder and sglang, each topped by its builder's
    marker; parts not measured are hatched (a legend entry says what each hatch is)."""
    rows = [s for s in found if s.result is not None and not s.result.table.empty]
    if not rows:
        empty_figure(path, "The round's parts: no data (needs the step stages)")
        return "No data: the model needs the step stages."
    modelled = sorted({int(b) for s in rows for b in s.result.table["batch"]})
    batches = [b for b in (1, 64) if b in modelled] or sorted({modelled[0], modelled[-1]})
    fig, axes = panels(len(rows), len(batches), height=3.4)
    drawn = {"parts": set(), "sources": set(), "builders": set()}  # what the legends name
    for i, section in enumerate(rows):
        for j, batch in enumerate(batches):
            bars = _bar_rows(section.result.table, batch)
            if bars:
                _round_parts_panel(fig, axes[i][j], bars, drawn)
                axes[i][j].set_title(f"{_row_title(section)}: B = {batch}")
    finish(
        fig,
        axes,
        path,
        ncol=6,
        xlabel="budget N (bars: gpu | fastest other CPU builder | sglang)",
        ylabel="round (ms)",
        legends=_round_parts_legends(drawn),
    )
    return ""


_BAR_WIDTH = 0.27


def _round_parts_panel(fig, ax, bars: dict, drawn: dict) -> None:
    """One facet: per budget (``_bar_rows``), a stacked bar per builder, topped by its builder's marker;
    ``drawn`` collects the parts, hatched sources and builders shown."""
    from matplotlib.transforms import offset_copy  # noqa: PLC0415

    above = offset_copy(ax.transData, fig=fig, y=5, units="points")
    budgets = sorted(bars)
    for x, budget in enumerate(budgets):
        for k, (name, row) in enumerate(bars[budget]):
            left = x + (k - (len(bars[budget]) - 1) / 2) * _BAR_WIDTH
            top = _stacked_bar(ax, left, row, drawn)
            color, marker, _ = BUILDER_STYLES[name]
            ax.plot(left, top, marker=marker, color=colour(color), ms=5, ls="none", transform=above)
            drawn["builders"].add(name)
    ax.set_xticks(range(len(budgets)), [str(b) for b in budgets])
    ax.set_ylim(top=ax.get_ylim()[1] * 1.08)
    ax.grid(False, axis="x")


def _stacked_bar(ax, left: float, row: pd.Series, drawn: dict) -> float:
    """A row's round as a bar at ``left``, its parts (``row["parts"]``) stacked bottom first, those not
    measured hatched; returns the bar's top (ms)."""
    bottom = 0.0
    for part in row["parts"]:
        seconds = float(row[f"{part}_s"]) * 1e3
        hatch = _HATCHES.get(row[f"{part}_source"])
        ax.bar(
            left,
            seconds,
            _BAR_WIDTH * 0.92,
            bottom=bottom,
            color=colour(_PART_COLOURS[part]),
            hatch=hatch,
            edgecolor="white" if hatch else None,
            linewidth=0,
        )
        if seconds <= 0:
            continue
        drawn["parts"].add(part)
        if hatch:
            drawn["sources"].add(row[f"{part}_source"])
        bottom += seconds
    return bottom


def _round_parts_legends(drawn: dict) -> list:
    """The legends of the parts drawn and of the bars (each builder's marker, each hatch's source)."""
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    part_legend = [
        (Patch(facecolor=colour(_PART_COLOURS[p])), TERM_LABELS[p])
        for p in _PART_COLOURS
        if p in drawn["parts"]
    ]
    bar_legend = [
        (
            Line2D([], [], marker=BUILDER_STYLES[b][1], color=colour(BUILDER_STYLES[b][0]), ls="none"),
            BUILDER_LABELS[b],
        )
        for b in BUILDER_STYLES
        if b in drawn["builders"]
    ]
    bar_legend += [
        (Patch(facecolor="0.6", hatch=_HATCHES[s], edgecolor="white"), f"{s}, not measured")
        for s in _HATCHES
        if s in drawn["sources"]
    ]
    return [part_legend, bar_legend]


def figure_round_parts_for_report(inputs, path) -> str:
    return figure_round_parts(inputs.budget_sections, path)


# ----------------------------------------------------------------------------------------------- the section


def report_section(found: list[BudgetSection], machines, options) -> Section:
    """The section: the model, its assumptions, the note on the machines without step stages
    (``no_model_note``), and per (machine, distribution) where each term comes from, the best budget per
    builder, the GPU builder's gain and every modelled budget."""
    note = no_model_note(machines, found)
    out = Section(TITLE).add(
        Text(INTRO),
        Text(model_line(options)),
        Text("**The model's assumptions:**"),
        Bullets(list(ASSUMPTIONS), ordered=True),
        Text(note, "em") if note else None,
    )
    by_label = {m.label: m for m in machines or ()}
    for section in found:
        part = Section(section.heading())
        out.add(part)
        if section.note and section.result is not None:
            part.add(Text(section.note, "em"))
        forward = forward_line(by_label.get(section.machine))
        if forward and section.result is not None:
            part.add(Text(forward, "em"))
        if section.missing:
            part.add(Text(f"no data: {section.missing}", "em"))
            continue
        part.add(
            Text(f"Where each term comes from (what-if bandwidth {section.result.bandwidth}):"),
            Table(sources_table(section), collapsed=True),
        )
        part.add(*(Text(line) for line in run_round_lines(section)))
        lines = unmodelled_lines(section)
        if lines:
            part.add(Text("Not modelled (a term missing):"), Bullets(lines))
        gains = gains_table(section)
        part.add(
            Text("Best budget per builder:"),
            Table(best_table(section), collapsed=True),
            Text("GPU builder's gain at each one's own best budget:"),
            Table(gains, collapsed=True) if len(gains) else Text("no GPU builder or baseline rows", "em"),
            Text("Every modelled budget:"),
            Table(detail_table(section), collapsed=True),
        )
    return out


def forward_line(machine) -> str | None:
    """Which MoE kernel the machine's measured target forward ran, where it is not the stack rounds' (SGLang's
    Marlin W4A16): the two sections' absolute tokens/s then differ by the forward (None where they agree or
    no forward was measured)."""
    step = None if machine is None else machine.step
    if step is None or step.empty or not {"stage", "status", "impl"} <= set(step.columns):
        return None
    impls = sorted(set(step.loc[(step["stage"] == "forward") & (step["status"] == "ok"), "impl"].dropna()))
    stacks_forward = catalog.SGLANG_MOE
    if not impls or impls == [stacks_forward]:
        return None
    return (
        f"The target's forward in these rounds is {machine.label}'s measured forward with the "
        f"{', '.join(impls)} MoE kernel; the stack rounds of the first section run SGLang's {stacks_forward} "
        "(what SGLang runs on Hopper), so their absolute tokens/s differ from these by the forward. The "
        "budgets each section picks are its own."
    )


# ----------------------------------------------------------------------------------------------- profiles


def _edge(row) -> str:
    budgets = row["budgets"]
    return " (the grid's edge)" if budgets and int(row["best_budget"]) in (min(budgets), max(budgets)) else ""


def _answers(section: BudgetSection) -> dict:
    """Per batch: (the gpu builder's best budget, the baseline's, the gpu builder's gain over it)."""
    out = {}
    for batch, part in section.best.groupby("batch"):
        gpu = part[part["builder"] == catalog.GPU_BUILDER]
        gains = section.gains[section.gains["batch"] == batch] if not section.gains.empty else section.gains
        if gpu.empty or gains.empty:
            continue
        g = gains.iloc[0]
        out[int(batch)] = (int(gpu["best_budget"].iloc[0]), int(g["baseline_budget"]), float(g["gain"]))
    return out


def profile_verdict(found: list[BudgetSection], first: BudgetSection) -> list[str]:
    """The verdict's lines on the other acceptance profiles of ``first``'s (machine, distribution): each
    builder's best budget under each (and whether it sits on the grid's edge), the GPU builder's gain, and
    whether the verdict (pays? moves the best budget?) is the same as under ``first``'s profile."""
    others = [
        s
        for s in found
        if s.machine == first.machine
        and s.distribution == first.distribution
        and s.profile != first.profile
        and not s.missing
        and not s.best.empty
    ]
    if not others:
        return []
    mine = _answers(first)
    lines = []
    for other in others:
        theirs = _answers(other)
        label = catalog.ACCEPTANCE_PROFILES[other.profile].label
        parts, same = [], True
        for batch, best in other.best.groupby("batch", sort=True):
            edges = "; ".join(
                f"{row['builder']} N = {int(row['best_budget'])}{_edge(row)}" for _, row in best.iterrows()
            )
            if int(batch) not in theirs:
                parts.append(f"B = {int(batch)}: best budget {edges}")
                continue
            gpu, base, gain = theirs[int(batch)]
            parts.append(f"B = {int(batch)}: best budget {edges}; the GPU builder's tokens/s {gain:.3f}x")
            if int(batch) in mine:
                g0, b0, gain0 = mine[int(batch)]
                same &= ((gain > 1.02) == (gain0 > 1.02)) and ((gpu != base) == (g0 != b0))
        compared = bool(set(theirs) & set(mine))
        verdict = (
            ("the same verdict" if same else "a different verdict")
            if compared
            else "no verdict to compare (no GPU builder rows)"
        )
        lines.append(
            f"**Under {label}'s tau:** ({other.distribution} trees' builds, {other.profile} acceptance) "
            + "; ".join(parts)
            + f". Against tau {catalog.ACCEPTANCE_PROFILES[first.profile].label}: {verdict} "
            "(does the GPU build pay, beyond 2%? does it move the best budget?)."
        )
    return lines
