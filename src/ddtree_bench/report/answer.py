"""The report's first screen: the answer. What each tree builder costs the decode round (its in-situ median:
from the drafter's top-K on the GPU to the padded tree on the GPU), its share of the round's measured part
(build + verify attention x layers + accept), a verdict computed from those rows and from the "Which budget?"
model, on the first machine with in-situ data, at its largest measured prefix length."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ddtree_bench.report.step import fmt_us
from ddtree_bench.throughput import tau_per_budget

#: The in-situ build labels of the step breakdown (``step.BUILD_LABELS``), in column order, with the
#: builder each one is and the column name of the answer's tables.
IN_SITU_COLUMNS = (
    ("sglang in-situ", "sglang", "SGLang's function"),
    ("reference in-situ", "reference", "reference (ours, Python)"),
    ("native in-situ", "native", "native (C++, 1 thread)"),
    ("native-mt in-situ", "native-mt", "native-mt (C++, all cores)"),
    ("gpu in-situ (graph replay)", "gpu", "gpu (our CUDA kernel)"),
)
#: The verdict's threshold: a build whose share of the round stays below this is "negligible".
SHARE_LIMIT = 0.01

ROUND = "build + verify attention x {layers} layers + accept"


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
    verdict: list[str] = field(default_factory=list)
    missing: str = ""

    @property
    def round_text(self) -> str:
        return ROUND.format(layers=self.layers)

    def heading(self, batch: int) -> str:
        return (
            f"Batch {batch}: {self.machine}, S = {self.prefix} prefix tokens, {self.heads} heads, "
            f"L = {self.depth}, {self.distribution} trees"
        )

    def intro(self) -> str:
        other = ", ".join(str(p) for p in self.other_prefixes)
        where = f" S = {other} is in the step-time breakdown below." if other else ""
        return (
            "Each cell: the tree build as the decode round pays it (in-situ median per call, "
            f"{self.machine}) and, in brackets, its share of the round's measured part ({self.round_text}) "
            f"at the largest measured prefix length, S = {self.prefix}.{where} Left out of the round: the "
            "drafter's forward pass, the MoE/MLP and the rest of the target's layers besides the attention "
            "core, the LM head and sampling, so the real share is smaller. tau: the expected tokens per "
            "round (bonus included) of the budget's trees over the whole trace."
        )


def _tau(value) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.2f}"


def _cell(build_s: float, share: float) -> str:
    return (
        f"{fmt_us(build_s)} ({100 * share:.2g}%)"
        if share < 0.1
        else f"{fmt_us(build_s)} ({100 * share:.0f}%)"
    )


def answer(machines, breakdowns: dict, settings: dict, budget_sections=()) -> Answer:
    """The answer from the first machine whose step breakdown holds in-situ builds (``breakdowns``: machine
    label -> ``step.step_breakdown``; ``settings``: label -> layers/depth/distribution; ``budget_sections``:
    the "Which budget?" sections, for the best budget per builder)."""
    labels = [label for label, *_ in IN_SITU_COLUMNS]
    for machine in machines:
        df = breakdowns.get(machine.label, pd.DataFrame())
        if df.empty:
            continue
        df = df[df["builder"].isin(labels) & df["build_s"].notna() & df["share"].notna()]
        if df.empty:
            continue
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
    return Answer(None, missing="no machine has in-situ tree builds with a step breakdown (verify attention)")


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
