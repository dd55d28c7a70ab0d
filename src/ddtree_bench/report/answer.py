"""The report's first screen: the answer. What each tree builder costs the decode round (its in-situ median:
from the drafter's top-K on the GPU to the padded tree on the GPU) and its share of the whole round, with a
verdict computed from those rows and the "Which budget?" model, on the first machine with in-situ data.

Where the "Which budget?" model has the machine's rounds (``throughput``: the round run on the GPU where the
round stage ran it, else the sum of its terms, each measured or labelled), the share is of that builder's own
whole round at the model's prefix length (``answer_from_round``). Elsewhere it is the share of the round's
measured part (build + verify attention x layers + accept) at the largest measured prefix length."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.report.fmt import fmt_us, regime
from ddtree_bench.report.load import named_machine
from ddtree_bench.report.names import CPU_BUILDERS, IN_SITU_COLUMNS
from ddtree_bench.report.throughput import profile_verdict
from ddtree_bench.summary.spread import RatioRange, job_range, ratio_range
from ddtree_bench.throughput import IN_SITU_NAME, RUN_ROUND, tau_per_budget

#: The verdict's threshold: a build whose share of the round stays below this is "negligible".
SHARE_LIMIT = 0.01
#: A tokens/s ratio within this of 1 is no answer either way: the builders' whole rounds are timed one block
#: after another (not interleaved), and on the H200 rounds whose builds differ by microseconds differed by
#: up to 1.4% between blocks (round stage, batch 1), more than the spread within a block.
SAME = 0.02

ROUND = "build + verify attention x {layers} layers + accept"
#: tau, as every section of the report takes it (docs/drafter.md): the tokens a round commits, the bonus
#: included, over the whole trace (every request a round), not over one batch's requests.
TAU_TEXT = (
    "tau: the tokens a round commits, the target's bonus token included: 1 + the expected accepted draft "
    'tokens of the budget\'s trees, averaged over every request of the trace (the "Acceptance per budget" '
    "table's tau expected); the same tau at every batch size."
)


@dataclass
class Answer:
    machine: str | None
    prefix: int | None = None
    other_prefixes: list[int] = field(default_factory=list)
    heads: int | None = None
    layers: int | None = None
    depth: int | None = None
    distribution: str | None = None
    tables: dict[int, pd.DataFrame] = field(default_factory=dict)  # batch -> table
    #: the verdict at a glance: a row per question, a column per batch ("yes: 1.11x"); empty where the
    #: answer is the shares of the round's measured part (no modelled rounds)
    verdict_table: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: under the table: per batch the numbers, spreads and caveats behind each cell, and the other
    #: acceptance profiles' verdicts
    verdict: list[str] = field(default_factory=list)
    missing: str = ""

    @property
    def round_text(self) -> str:
        return ROUND.format(layers=self.layers)

    def heading(self, batch: int) -> str:
        return (
            f"Batch {batch}: {self.machine}, S = {self.prefix} prefix tokens, {self.heads} heads, "
            f"{self.distribution} trees ({regime(self.depth, self._budgets(batch))})"
        )

    def _budgets(self, batch: int) -> list[int]:
        table = self.tables.get(batch)
        return [] if table is None or "N" not in table else [int(n) for n in table["N"]]

    def intro(self) -> str:
        other = ", ".join(str(p) for p in self.other_prefixes)
        where = f" S = {other} is in the step-time breakdown below." if other else ""
        return (
            "Each cell: the tree build as the decode round pays it (in-situ median per call, "
            f"{self.machine}) and, in brackets, its share of the round's measured part ({self.round_text}) "
            f"at the largest measured prefix length, S = {self.prefix}.{where} Left out of the round: the "
            "drafter's forward pass, the MoE/MLP and the rest of the target's layers besides the attention "
            f"core, the LM head and sampling, so the real share is smaller. {TAU_TEXT}"
        )


def _tau(value) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.2f}"


def _cell(build_s: float, share: float) -> str:
    return (
        f"{fmt_us(build_s)} ({100 * share:.2g}%)"
        if share < 0.1
        else f"{fmt_us(build_s)} ({100 * share:.0f}%)"
    )


def answer(
    machines, breakdowns: dict, settings: dict, budget_sections=(), published_answer: str | None = None
) -> Answer:
    """The answer of this run's machine (the first) where it has one of its own: gpu builder rows in its
    modelled rounds (``budget_sections``, the "Which budget?" sections) or in-situ builds in its step
    breakdown (``breakdowns``: machine label -> ``step.step_breakdown``). Else the answer of the published
    machine ``published_answer`` names, chosen by that name only (never another published machine by the
    folders' order). ``settings``: label -> layers/depth/distribution."""
    if not machines:
        return Answer(None, missing="no machine")
    here = machines[0]
    own = _answer_of(here, breakdowns, settings, budget_sections)
    if own is not None:
        return own
    chosen = named_machine(machines, published_answer)
    if chosen is None or chosen is here:
        where = (
            f"the published answer's machine ({published_answer}, config published_answer) is not among "
            "the published folders here"
            if chosen is None
            else "no other machine answers for it"
        )
        return Answer(None, missing=f"{here.label} has no GPU builder rows to answer from, and {where}")
    found = _answer_of(chosen, breakdowns, settings, budget_sections)
    if found is None:
        return Answer(
            None,
            missing=f"neither {here.label} nor the published answer's machine ({chosen.label}) has GPU "
            "builder rows with a modelled round or a step breakdown",
        )
    return found


def _answer_of(machine, breakdowns: dict, settings: dict, budget_sections) -> Answer | None:
    """One machine's answer, or None where it has no GPU builder rows to answer the questions from."""
    labels = [label for label, *_ in IN_SITU_COLUMNS]
    section = _modelled_section(budget_sections, machine.label)
    if section is not None and (section.best["builder"] == catalog.SUBJECT).any():
        out = answer_from_round(section, settings.get(machine.label, {}), machine.summary)
        out.verdict += profile_verdict(list(budget_sections), section)
        return out
    df = breakdowns.get(machine.label, pd.DataFrame())
    if df.empty:
        return None
    df = df[df["builder"].isin(labels) & df["build_s"].notna() & df["share"].notna()]
    gpu = {label for label, builder, _ in IN_SITU_COLUMNS if builder == catalog.SUBJECT}
    if df.empty or not df["builder"].isin(gpu).any():
        return None
    heads = 8 if (df["heads"] == 8).any() else int(df["heads"].iloc[0])
    df = df[df["heads"] == heads]
    prefixes = sorted(int(p) for p in df["prefix"].unique())
    prefix = prefixes[-1]
    df = df[df["prefix"] == prefix]
    setting = settings.get(machine.label, {})
    out = Answer(
        machine.label,
        prefix,
        prefixes[:-1],
        heads,
        int(setting.get("layers") or 61),
        setting.get("depth"),
        setting.get("distribution"),
    )
    # tau(N) of the whole trace (every request a round), as the "Which budget?" model takes it; a
    # batch's own trees (the step rows) would give one request's tau at batch 1
    distribution = out.distribution or (df["distribution"].iloc[0] if "distribution" in df else None)
    depth = out.depth or (int(df["depth"].iloc[0]) if "depth" in df else None)
    tau = (
        tau_per_budget(machine.shapes, distribution, depth)
        if distribution is not None and depth is not None
        else pd.Series(dtype="float64")
    )
    for batch, rows in df.groupby("batch", sort=True):
        first = rows.drop_duplicates("budget").set_index("budget").sort_index()
        table = pd.DataFrame(
            {
                "N": first.index.astype(int),
                "tau": [_tau(tau.get(n)) for n in first.index],
                f"verify attention x {out.layers}": first["attention_s"].map(fmt_us).to_numpy(),
                "accept": first["accept_s"].map(fmt_us).to_numpy(),
            }
        )
        for label, _, column in IN_SITU_COLUMNS:
            sel = rows[rows["builder"] == label].set_index("budget").reindex(first.index)
            if sel["build_s"].notna().any():
                table[column] = [
                    "-" if pd.isna(b) else _cell(b, s)
                    for b, s in zip(sel["build_s"], sel["share"], strict=True)
                ]
        out.tables[int(batch)] = table.reset_index(drop=True)
        out.verdict.append(_verdict(int(batch), rows, budget_sections, machine.label))
    return out


def _modelled_section(budget_sections, label: str):
    return next(
        (
            s
            for s in budget_sections
            if s.machine == label and s.result is not None and not s.result.missing and not s.best.empty
        ),
        None,
    )


class RoundAnswer(Answer):
    """The answer on the whole round (``answer_from_round``)."""

    sources: str = ""
    moe: str = ""  # the MoE kernel the measured forward ran
    builds: str = "in-situ median per call"  # what each build cell is (``build_from`` of the rows)

    @property
    def round_text(self) -> str:
        return "the whole round"

    @property
    def build_text(self) -> str:
        if self.builds == "in-situ median per call":
            return f"the tree build as the decode round pays it ({self.builds}, {self.machine})"
        return (
            f"the tree build ({self.builds}, {self.machine}; no in-situ rows, so without the copies a "
            "decode round pays)"
        )

    def intro(self) -> str:
        return (
            "The verdict's cells: yes or no and the one number it rests on; a tokens/s ratio within "
            f"{100 * SAME:.0f}% of 1 is not called, nor one whose spread across timing jobs includes 1.0x. "
            "The notes under it give the tokens/s, the spreads and the caveats. Each table cell: "
            f"{self.build_text} and, in brackets, its share of that builder's whole round: drafter, top-K, "
            "build, the 61-layer verify forward of one GPU's "
            f"share of Kimi K2.6 (random weights, INT4 routed experts{self.moe}), tensor-parallel "
            f"communication and accept, at S = {self.prefix}. {self.sources} {TAU_TEXT} tokens/s = B x tau "
            "/ round. A ratio's range: from the builds' independent timing jobs (the smallest and largest "
            "job median), in a round that is the sum of its terms; a round run on the GPU is one run, with "
            "no spread across jobs."
        )


def answer_from_round(section, setting: dict, summary: pd.DataFrame | None = None) -> Answer:
    """The answer from a "Which budget?" section's modelled rounds: per batch, tau, the GPU builder's round,
    and every builder's in-situ build with its share of its own round; the verdict from the same rows.
    ``summary``: the machine's build summary, for each build's spread across its timing jobs (without it,
    or without spread columns, every build is one job)."""
    result = section.result
    table = with_spread(result.table, summary, section.distribution, section.depth)
    out = RoundAnswer(
        section.machine,
        result.verify.prefix,
        [],
        result.verify.heads,
        int(setting.get("layers") or 61),
        section.depth,
        section.distribution,
    )
    impls = sorted(set(result.verify.costs["forward_impl"].dropna()))
    out.moe = f" through {', '.join(impls)}" if impls else ""
    run = table["run_round_s"].notna() if "run_round_s" in table else pd.Series(False, index=table.index)
    comm = sorted(set(table["allreduce_source"].dropna()))
    profile = catalog.ACCEPTANCE_PROFILES[section.profile].label
    rounds = (
        f"Rounds: {int(run.sum())} of {len(table)} run on the GPU (the round stage) plus the communication "
        "term, the others the sum of their terms"
        if run.any()
        else f"Rounds: all {len(table)} the sum of their terms (none run whole on a GPU)"
    )
    out.sources = f"{rounds}; communication {', '.join(comm)}. tau: {profile}."
    kinds = sorted(set(table["build_from"].dropna()))
    if kinds and kinds != [IN_SITU_NAME]:
        out.builds = "median per call: " + ", ".join(
            f"{k} for {', '.join(sorted(set(table.loc[table['build_from'] == k, 'builder'])))}" for k in kinds
        )
    columns = {"question (the number it rests on)": [f"{q} ({n})" for q, n in QUESTIONS.items()]}
    for batch, rows in table.groupby("batch", sort=True):
        budgets = sorted(int(n) for n in rows["budget"].unique())
        by = rows.set_index(["builder", "budget"])
        gpu_round = [
            fmt_us(by.loc[(catalog.SUBJECT, n), "round_s"]) if (catalog.SUBJECT, n) in by.index else "-"
            for n in budgets
        ]
        frame = pd.DataFrame(
            {
                "N": budgets,
                "tau": [_tau(rows[rows["budget"] == n]["tau"].iloc[0]) for n in budgets],
                "round (gpu)": gpu_round,
            }
        )
        for _, builder, column in IN_SITU_COLUMNS:
            if builder not in set(rows["builder"]):
                continue
            frame[column] = [
                _cell(
                    by.loc[(builder, n), "build_s"],
                    by.loc[(builder, n), "build_s"] / by.loc[(builder, n), "round_s"],
                )
                if (builder, n) in by.index
                else "-"
                for n in budgets
            ]
        out.tables[int(batch)] = frame
        cells, note = _round_verdict(int(batch), rows, section)
        columns[f"B = {int(batch)}"] = [cells.get(q, "-") for q in QUESTIONS]
        out.verdict.append(note)
    out.verdict_table = pd.DataFrame(columns)
    return out


# ------------------------------------------------------------------------------ the spread across jobs


def _build_row(summary, builder: str, batch: int, budget: int, distribution, depth, build_s: float):
    """The summary row the model's build term was taken from (``throughput.build_costs``: its median)."""
    if summary is None or summary.empty or not np.isfinite(build_s):
        return None
    sel = summary[
        (summary["builder"] == builder)
        & (summary["batch"] == batch)
        & (summary["budget"] == budget)
        & (summary["status"] == "ok")
    ]
    if distribution is not None and "distribution" in sel:
        sel = sel[sel["distribution"] == distribution]
    if depth is not None and "depth" in sel:
        sel = sel[sel["depth"] == depth]
    sel = sel[np.isclose(pd.to_numeric(sel["median_s"], errors="coerce"), build_s, rtol=1e-12, atol=0)]
    return sel.iloc[0] if len(sel) else None


def with_spread(table: pd.DataFrame, summary, distribution, depth) -> pd.DataFrame:
    """The model's rows with each build's range across its timing jobs (``build_low``, ``build_high``,
    ``build_jobs``: one job where the summary has no spread columns) and the round's range it gives
    (``round_low``, ``round_high``): a round that is the sum of its terms moves with its build term; a round
    run on the GPU (``RUN_ROUND``) is one run and does not."""
    out = table.copy()
    low, high, jobs = [], [], []
    for builder, batch, budget, build_s in zip(
        out["builder"], out["batch"], out["budget"], out["build_s"], strict=True
    ):
        row = _build_row(summary, builder, int(batch), int(budget), distribution, depth, float(build_s))
        if row is None:
            low.append(float(build_s)), high.append(float(build_s)), jobs.append(1)
            continue
        spread = job_range(row.to_frame().T).iloc[0]
        low.append(float(spread["low"])), high.append(float(spread["high"])), jobs.append(int(spread["jobs"]))
    out["build_low"], out["build_high"], out["build_jobs"] = low, high, jobs
    fixed = out["round_from"] == RUN_ROUND if "round_from" in out else pd.Series(False, index=out.index)
    rest = out["round_s"] - out["build_s"]
    out["round_low"] = out["round_s"].where(fixed, rest + out["build_low"])
    out["round_high"] = out["round_s"].where(fixed, rest + out["build_high"])
    return out


def build_ratio(rows: pd.DataFrame, numerator: str, denominator: str, budget: int) -> RatioRange | None:
    """``numerator``'s build over ``denominator``'s at ``budget`` (rows of ``with_spread``) with its range
    across jobs; None where either was not modelled there."""
    by = rows.set_index(["builder", "budget"])
    if (numerator, budget) not in by.index or (denominator, budget) not in by.index:
        return None

    def side(builder: str) -> dict:
        row = by.loc[(builder, budget)]
        return {
            "median_s": row["build_s"],
            "job_median_min_s": row["build_low"],
            "job_median_max_s": row["build_high"],
            "jobs": row["build_jobs"],
        }

    return ratio_range(side(numerator), side(denominator))


def gain_range(rows: pd.DataFrame, gpu: pd.Series, other: pd.Series) -> tuple[float, float, bool]:
    """The GPU builder's tokens/s over ``other``'s, each at its own best budget (rows of ``best_budgets``),
    lowest and highest across the builds' jobs (rows of ``with_spread``), and whether any side moves at all
    (False: every round one run or every build one job)."""
    by = rows.set_index(["builder", "budget"])
    g = by.loc[(catalog.SUBJECT, int(gpu["best_budget"]))]
    o = by.loc[(other.name, int(other["best_budget"]))]
    low = (g["tau"] / g["round_high"]) / (o["tau"] / o["round_low"])
    high = (g["tau"] / g["round_low"]) / (o["tau"] / o["round_high"])
    moves = bool(g["round_low"] < g["round_high"] or o["round_low"] < o["round_high"])
    return float(low), float(high), moves


def _x(value: float) -> str:
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x" if value < 100 else f"{value:,.0f}x"


def ratio_text(ratio: RatioRange) -> str:
    """``RatioRange.text`` with each factor to its own precision (0.80x beside 220x)."""
    if not np.isfinite(ratio.ratio):
        return "n/a"
    if ratio.single_job:
        return f"{_x(ratio.ratio)} (one job each: no spread measured)"
    span = (
        f"{_x(ratio.low)} to {_x(ratio.high)} across {ratio.numerator_jobs} and {ratio.denominator_jobs} jobs"
    )
    return f"{_x(ratio.ratio)} ({span}{'; the spread includes 1.0x' if ratio.includes_one else ''})"


def _rounds_note(rows: pd.DataFrame, gpu: pd.Series, other: pd.Series) -> str:
    by = rows.set_index(["builder", "budget"])
    run = [
        b
        for b, n in ((catalog.SUBJECT, gpu["best_budget"]), (other.name, other["best_budget"]))
        if by.loc[(b, int(n)), "round_from"] == RUN_ROUND
    ]
    if len(run) == 2:
        return "both rounds run on the GPU, one run each: no spread across jobs"
    if run:
        return f"{run[0]}'s round run on the GPU, one run"
    return ""


#: The verdict's questions, each with the number its cell gives (the rows of ``Answer.verdict_table``).
PAY = "Does moving the build from SGLang's function to the GPU pay?"
BEATS_CPU = "Is the GPU kernel better than the best CPU builder?"
MOVES = "Does the best budget move?"
QUESTIONS = {
    PAY: "the GPU builder's tokens/s over SGLang's function's, each at its best N",
    BEATS_CPU: "the GPU builder's tokens/s over the fastest CPU builder's, each at its best N",
    MOVES: "each builder's best N",
}
#: A verdict cell where a batch has no gpu builder rows.
NO_GPU_ROWS = "- (no GPU builder rows at this batch: the gpu builder needs a CUDA GPU)"


def _call(gain: float, spans_one: bool) -> str:
    """A gain's yes or no: beyond ``SAME`` and outside the spread across timing jobs, or why not."""
    if gain > 1 + SAME:
        return f"no win shown: {gain:.3f}x (its spread includes 1.0x)" if spans_one else f"yes: {gain:.3f}x"
    if gain < 1 - SAME:
        return f"no, slower: {gain:.3f}x"
    return f"no: {gain:.3f}x, within {100 * SAME:.0f}%"


def _round_verdict(batch: int, rows: pd.DataFrame, section) -> tuple[dict[str, str], str]:
    """Three questions for a batch size: does the GPU builder beat SGLang's function, does it beat the best
    CPU builder (both in tokens/s, each at its own best budget), and does the best budget move between
    builders. Returns the verdict's cells (question -> "yes: 1.11x", ...) and the note behind them: the
    tokens/s, each gain's range across the builds' timing jobs, the builds' own ratio at the GPU builder's
    best budget with its range (a range that includes 1.0x is said so and is no win), and the best budgets."""
    best = section.best[section.best["batch"] == batch].set_index("builder")
    if catalog.SUBJECT not in best.index:
        return {q: NO_GPU_ROWS for q in QUESTIONS}, f"**B = {batch}:** no GPU builder rows at this batch."
    cells, notes = {}, []
    if catalog.BASELINE in best.index:
        cells[PAY], note = _versus(best, rows, catalog.BASELINE)
        notes.append(note)
    else:
        cells[PAY] = "- (SGLang's function not measured here)"
    cpu = [b for b in best.index if b in CPU_BUILDERS]
    if cpu:
        top = max(cpu, key=lambda b: best.loc[b, "tokens_per_s"])
        call, note = _versus(best, rows, top)
        cells[BEATS_CPU] = call.replace(":", f" (over {top}):", 1)
        if top != catalog.BASELINE or catalog.BASELINE not in best.index:
            notes.append(note)
    else:
        cells[BEATS_CPU] = "- (no CPU builder measured here)"
    cells[MOVES], note = _budget_moves(best, rows)
    notes.append(note)
    return cells, f"**B = {batch}:** " + ". ".join(notes) + "."


def _versus(best: pd.DataFrame, rows: pd.DataFrame, builder: str) -> tuple[str, str]:
    """The GPU builder against ``builder``, each at its best budget (``best``: by builder): the verdict's
    cell and its note (tokens/s, the gain's spread across timing jobs, the run rounds, the build alone)."""
    gpu, other = best.loc[catalog.SUBJECT], best.loc[builder]
    gain = gpu["tokens_per_s"] / other["tokens_per_s"]
    low, high, moves = gain_range(rows, gpu, other)
    build = build_ratio(rows, builder, catalog.SUBJECT, int(gpu["best_budget"]))
    spans_one = (moves and low <= 1.0 <= high) or (build is not None and build.includes_one)
    parts = [
        f"gpu against {builder}: {gpu['tokens_per_s']:,.0f} tokens/s at N = "
        f"{int(gpu['best_budget'])} against {other['tokens_per_s']:,.0f} at N = "
        f"{int(other['best_budget'])} ({gain:.3f}x)"
    ]
    if moves:
        span = f"{low:.3f}x to {high:.3f}x across the builds' timing jobs"
        parts.append(span + ("; the spread includes 1.0x" if low <= 1.0 <= high else ""))
    rounds = _rounds_note(rows, gpu, other)
    if rounds:
        parts.append(rounds)
    if not moves and not rounds.startswith("both"):
        parts.append("one timing job per build: no spread measured")
    if build is not None:
        parts.append(
            f"the build alone at N = {int(gpu['best_budget'])}: {builder}'s over the gpu builder's "
            f"{ratio_text(build)}"
        )
    return _call(gain, spans_one), "; ".join(parts)


def _budget_moves(best: pd.DataFrame, rows: pd.DataFrame) -> tuple[str, str]:
    """Whether the best budget moves between the builders (``best``: by builder): the verdict's cell and the
    note naming each builder's best budget (a builder modelled over fewer budgets than the GPU builder has
    no comparable best budget: named, not compared)."""
    gpu = best.loc[catalog.SUBJECT]
    gpu_budgets = set(gpu["budgets"]) if "budgets" in best.columns else set()
    partial = [b for b in best.index if gpu_budgets and not gpu_budgets <= set(best.loc[b, "budgets"])]
    budgets = {b: int(best.loc[b, "best_budget"]) for b in best.index if b not in partial}
    moved = len(set(budgets.values())) > 1
    set_by = gpu.get("set_by") if "set_by" in best.columns else None
    edge = {b for b in budgets if budgets[b] in (min(best.loc[b, "budgets"]), max(best.loc[b, "budgets"]))}
    each = ", ".join(f"{b} N = {n}" + (" (the grid's edge)" if b in edge else "") for b, n in budgets.items())
    cell = (
        f"yes: {', '.join(f'{b} N = {n}' for b, n in budgets.items())}"
        if moved
        else f"no: N = {next(iter(budgets.values()))} for {', '.join(budgets)}"
        if budgets
        else "-"
    )
    note = (
        "Best budgets: "
        + each
        + (f" (the GPU builder's is set by its {set_by})" if isinstance(set_by, str) and set_by else "")
        + _budget_spread(rows, budgets)
        + (
            f"; not compared: {', '.join(partial)} (modelled at "
            + "; ".join(f"{b} N = {', '.join(str(n) for n in best.loc[b, 'budgets'])}" for b in partial)
            + " only)"
            if partial
            else ""
        )
    )
    return cell, note


def _budget_spread(rows: pd.DataFrame, budgets: dict[str, int]) -> str:
    """Whether each builder's best budget holds with every build at its fastest and at its slowest job's
    median (the rounds that are the sum of their terms move; a run round does not); "" without a spread."""
    if not (rows["round_low"] < rows["round_high"]).any():
        return ""
    moved = []
    for builder, group in rows.groupby("builder", sort=False):
        if builder not in budgets:
            continue
        found = {
            int(group.loc[(group["tau"] / group[column]).idxmax(), "budget"])
            for column in ("round_low", "round_high")
        } | {budgets[builder]}
        if len(found) > 1:
            moved.append(f"{builder} N = {' or '.join(str(n) for n in sorted(found))}")
    if moved:
        return "; across the builds' timing jobs the best budget is not settled: " + ", ".join(moved)
    return "; the same with every build at its fastest or its slowest timing job"


def _verdict(batch: int, rows: pd.DataFrame, budget_sections, label: str) -> str:
    """One or two sentences for a batch size: which builders stay below ``SHARE_LIMIT`` of the round at every
    budget, the largest share of the others, and the model's best budget and the GPU builder's gain there."""
    below, above = [], []
    for build_label, builder, _ in IN_SITU_COLUMNS:
        sel = rows[rows["builder"] == build_label]
        if sel.empty:
            continue
        worst = sel.loc[sel["share"].idxmax()]
        text = f"{builder} up to {100 * worst['share']:.2g}% (N = {int(worst['budget'])})"
        (below if worst["share"] < SHARE_LIMIT else above).append(text)
    parts = [f"**B = {batch}:**"]
    if below:
        parts.append(f"below {100 * SHARE_LIMIT:.0f}% of the round at every budget: {', '.join(below)}.")
    if above:
        parts.append(f"Above {100 * SHARE_LIMIT:.0f}%: {', '.join(above)}.")
    section = next(
        (s for s in budget_sections if s.machine == label and not s.best.empty and not s.missing), None
    )
    if section is not None:
        best = section.best[section.best["batch"] == batch]
        gains = section.gains[section.gains["batch"] == batch] if not section.gains.empty else section.gains
        if len(best):
            budgets = sorted({int(n) for n in best["best_budget"]})
            if len(budgets) == 1:
                which = f"best budget N = {budgets[0]} for every builder"
            else:
                which = "best budget " + ", ".join(
                    f"{b} N = {int(n)}" for b, n in zip(best["builder"], best["best_budget"], strict=True)
                )
            text = f"Which budget? (model, {section.distribution} trees): {which}"
            if len(gains):
                g = gains.iloc[0]
                text += (
                    f"; there the GPU builder's modelled tokens/s is {g['gain']:.2f}x {g['baseline_label']}'s"
                )
            parts.append(text + ".")
    return " ".join(parts)
