"""The report as one object: load -> compose -> render. ``compose_report`` takes the loaded machines and the
options, computes everything the report says (the answer, the tables, the figures' files) once, and returns
a ``ReportPage``: a title, an optional banner, a lead and sections of blocks (``document``). The Markdown and
the HTML writer (``render``) are two views of that one object."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.config import schema_default
from ddtree_bench.report import acceptance as acceptance_report
from ddtree_bench.report import answer as answer_module
from ddtree_bench.report import stacks as stacks_report
from ddtree_bench.report import stage_rows
from ddtree_bench.report import step as step_report
from ddtree_bench.report import throughput as throughput_report
from ddtree_bench.report.document import Bullets, Figure, Section, Table, Text
from ddtree_bench.report.figures import theme
from ddtree_bench.report.fmt import fmt_x
from ddtree_bench.report.goals import (
    REF_VS_SGLANG_NOTE,
    REF_VS_SGLANG_TITLE,
    TargetResult,
    evaluate_targets,
    target_frame,
)
from ddtree_bench.report.load import Machine, baseline_of, selection_heading, timings
from ddtree_bench.report.names import BASELINE_NAMES, IN_SITU_TIMINGS
from ddtree_bench.report.tables import (
    IN_SITU_INTRO,
    compact_table,
    correctness_table,
    cpu_builders_table,
    environment_table,
    in_situ_tables,
    medians_table,
    reference_vs_sglang_table,
    sglang_source_table,
    unavailable_table,
)

TITLE = "ddtree-bench report"
LEAD = (
    "What SGLang's DDTree round gains from our three GPU kernels (tree build, verify attention, accept), "
    "in tokens per second of a Kimi K2.6 round, and what building DDTree draft trees costs a "
    "speculative-decoding round, per tree builder and budget, on the same inputs; every builder's trees "
    "equal the reference's. The answers first, then the figures, the detail tables (collapsed), the "
    "environment and the project's goals."
)
DETAIL_INTRO = (
    "Time to build DDTree draft trees (best-first, SGLang's `build_ddtree_tree_from_topk` contract) "
    "from the same top-K traces with every builder: median of every timed call (warm-up excluded), "
    "p10-p90 band. Every builder's trees were checked equal to `reference`'s on the whole trace before "
    "its timings count. `reference` is our own Python implementation of SGLang's algorithm, not SGLang. "
    "Each table names its depth regime: the drafter's block fixes L here, while SGLang's worker builds "
    "with L = N (its block is N + 1 tokens, batch 1)."
)
DETAIL_NOTE = (
    "Every table below is collapsed; click a summary line to open it. Times: median per call (warm-up "
    "excluded) with p10-p90 where shown; one unit per column."
)
GOALS_NOTE = (
    "The project's goals, each named by what it measures and evaluated on each machine's measured medians; "
    'a goal not met says by how much. "from" names what the goal is about.'
)


@dataclass
class ReportOptions:
    """What a report shows (``render_report``'s keywords besides the files)."""

    depth: int | None = 16
    distribution: str | None = "peaked"
    step_layers: int = 61
    step_depth: int | None = None
    step_distribution: str | None = None
    step_enabled: bool = True
    throughput_options: dict | None = None
    distributions: list[str] | None = None
    profiles: list[str] | None = None  # the acceptance profiles (None: each machine's recorded ones)
    #: the published machine whose answer is shown where this run has none (config ``published_answer``)
    published_answer: str = field(default_factory=lambda: schema_default("published_answer"))

    @classmethod
    def from_settings(cls, settings) -> ReportOptions:
        """What a run's configuration (``settings.Settings``) shows: its first depth and distribution, the
        step's layers, depth, distribution and switch, the throughput model's settings, its distributions,
        acceptance profiles and published answer."""
        step = settings.step_options()
        return cls(
            depth=settings.depths[0],
            distribution=settings.distributions[0],
            step_layers=step["layers"],
            step_depth=step["depth"],
            step_distribution=step["distribution"],
            step_enabled=step["enabled"],
            throughput_options=settings.throughput_options(),
            distributions=list(settings.distributions),
            profiles=list(settings.acceptance_profiles),
            published_answer=settings.published_answer,
        )


@dataclass
class FigureInputs:
    """What the figure functions draw from (each takes what it needs)."""

    machines: list[Machine]
    data: pd.DataFrame  # load.timings of every machine
    depth: int | None
    distribution: str | None
    breakdowns: dict
    budget_sections: list
    throughput_options: dict | None
    published_answer: str | None = None


@dataclass
class ReportPage:
    title: str
    lead: str
    banner: str | None  # the first line, where the answer is another machine's than this run's
    answer: answer_module.Answer
    sections: list[Section] = field(default_factory=list)

    def figures(self) -> list[Figure]:
        return [b for s in self.sections for b in s.walk() if isinstance(b, Figure)]


def step_settings(machine: Machine, layers: int) -> dict:
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


def _has_gpu_rows(machine: Machine) -> bool:
    summary, step = machine.summary, machine.step
    built = (
        not summary.empty and ((summary["builder"] == catalog.SUBJECT) & (summary["status"] == "ok")).any()
    )
    stepped = not step.empty and "status" in step and (step["status"] == "ok").any()
    return bool(built or stepped)


def banner(machines: list[Machine], answer) -> str | None:
    """One line where the answer is not this run's machine's: whose it is, why, and where this machine's
    own rows are."""
    if not machines or answer.machine is None or answer.machine == machines[0].label:
        return None
    here = machines[0]
    source = next((m.source for m in machines if m.label == answer.machine), "published")
    answered = next((m for m in machines if m.label == answer.machine), None)
    gpu = (answered.environment or {}).get("gpu_name") if answered is not None else None
    why = (
        "no GPU rows (it timed no GPU kernel and ran no step of the round)"
        if not _has_gpu_rows(here)
        else "no GPU tree-build rows with a whole round or a step breakdown"
    )
    folder = answer.machine.removesuffix(" (published)")
    whose = (
        f"the published {answer.machine}'s: measured on {gpu or 'that machine'} and published with the "
        f"project (results/published/{folder}/)"
        if source == "published"
        else f"{answer.machine}'s ({source} results)"
    )
    stacked = stacks_report.machine_with_stacks(machines)
    if stacked is not None and stacked is not here and stacked.label != answer.machine:
        stack_gpu = (stacked.environment or {}).get("gpu_name") or "that machine"
        whose += (
            f"; the first section's whole rounds (what the three kernels are worth, tree or chain) are the "
            f"{stacked.source} {stacked.label}'s, measured on {stack_gpu}"
        )
    return (
        f"This machine ({here.label}) has {why}, so the answers below are {whose}. What {here.label} "
        f'measured itself is in "{ADDS_TITLE}", the figures and the detail tables.'
    )


def compose_report(
    machines: list[Machine], options: ReportOptions, figure_paths: dict[str, Path]
) -> ReportPage:
    """Everything the report says, from machines loaded once; draws each figure of ``figure_paths`` (figure
    name -> PNG path)."""
    settings = {
        machine.label: step_settings(machine, options.step_layers)
        if machine is not machines[0]
        else {
            "layers": options.step_layers,
            "depth": options.step_depth,
            "distribution": options.step_distribution,
        }
        for machine in machines
    }
    breakdowns = {m.label: step_report.breakdown_for(m, **settings[m.label]) for m in machines}
    budget_sections = throughput_report.sections(
        machines,
        settings,
        options.throughput_options,
        distributions=options.distributions,
        depth=options.depth,
        profiles=options.profiles,
    )
    data = timings(machines)
    inputs = FigureInputs(
        machines,
        data,
        options.depth,
        options.distribution,
        breakdowns,
        budget_sections,
        options.throughput_options,
        options.published_answer,
    )
    specs = [s for s in catalog.FIGURES.values() if s.name in figure_paths]
    figures = {s.name: _draw(s, inputs, figure_paths[s.name]) for s in specs}
    answer = answer_module.answer(machines, breakdowns, settings, budget_sections, options.published_answer)
    page = ReportPage(TITLE, LEAD, banner(machines, answer), answer)
    stacks = [f for f in figures.values() if _place(f) == "stacks"]
    page.sections = [
        stacks_report.report_section(machines, stacks, options.published_answer),
        _answer_section(answer, [f for f in figures.values() if _place(f) == "answer"]),
        _adds_section(machines, data, answer, options),
        Section("Figures").add(*(f for f in figures.values() if _place(f) not in ("answer", "stacks"))),
        _detail_section(machines, data, options, breakdowns, settings, budget_sections),
        _environment_section(machines),
        _goals_section(machines, budget_sections),
    ]
    page.sections = [s for s in page.sections if s is not None]
    return page


def _draw(spec, inputs: FigureInputs, path: Path) -> Figure:
    module, function = spec.draw.split(":")
    maker = getattr(importlib.import_module(module), function)
    with theme():
        detail = maker(inputs, path)
    caption = " ".join(part for part in (spec.caption, detail) if part)
    return Figure(spec.name, spec.title, caption, Path(path), collapsed=spec.place == "collapsed")


def _place(figure: Figure) -> str:
    return catalog.FIGURES[figure.name].place


def _answer_section(answer, figures: list[Figure]) -> Section:
    section = Section("Answer: what the tree build costs the decode round")
    if answer.machine is None:
        section.add(Text(f"No answer: {answer.missing}.", "em"))
    else:
        section.add(Text(f"**Verdict** ({answer.machine}):"))
        if not answer.verdict_table.empty:
            section.add(Table(answer.verdict_table))
        section.add(Bullets(list(answer.verdict)), Text(answer.intro(), "note"))
        for batch, table in answer.tables.items():
            section.add(Section(answer.heading(batch)).add(Table(table)))
    return section.add(*figures)


ADDS_TITLE = "What this machine adds"


def _adds_section(machines, data, answer, options) -> Section | None:
    """Where the answers above are another machine's: this run's CPU builders against SGLang's function (or
    our ``reference``, named as ours, where SGLang's did not run), in-situ where it has in-situ rows, else per
    call. None where this run's machine gives the answers itself."""
    here = machines[0] if machines else None
    if here is None or answer.machine == here.label:
        return None
    table, found = cpu_builders_table(data, here.label, options.depth, options.distribution)
    base = found.get("baseline")
    section = Section(
        f"{ADDS_TITLE}: {here.label}'s CPU builders against "
        + ("SGLang's function" if base in (None, catalog.SGLANG) else "our reference (SGLang's did not run)")
    )
    if table.empty:
        return section.add(Text(f"No CPU builder rows on {here.label} to compare.", "em"))
    if base == catalog.SGLANG:
        against = "SGLang's own `build_ddtree_tree_from_topk`"
    else:
        why = _not_run_reason(here, catalog.SGLANG)
        against = f"our Python `reference` (ours, not SGLang: SGLang's function did not run here{why})"
    if found["mode"] == catalog.IN_SITU:
        timing = (
            "in-situ (what the decode round pays: from the drafter's top-K on the GPU to the tree on the GPU)"
        )
    else:
        why = _not_run_reason(here, catalog.NATIVE, catalog.IN_SITU)
        timing = f"median per call, wall clock (no in-situ rows{why})"
    sentence = (
        f"**{here.label}** ({here.source}), on this machine's CPU: each CPU builder's tree build against "
        f"{against}, {timing}, at L = {found['depth']} on the {found['distribution']} trees; in brackets its "
        "speedup over that baseline."
    )
    if "low" in found:
        sentence += (
            f" The faster C++ builder is {fmt_x(found['low'])}-{fmt_x(found['high'])} the baseline's speed "
            "across these configurations."
        )
    return section.add(Text(sentence), Table(table))


def _not_run_reason(machine, builder: str, timing: str | None = None) -> str:
    """ ": <reason>" from ``machine``'s rows of ``builder`` (of ``timing``) that did not run, or ""."""
    df = machine.summary
    if df.empty:
        return ""
    bad = df[(df["builder"] == builder) & (df["status"] != "ok")]
    if timing is not None:
        bad = bad[bad["timing"] == timing]
    reasons = bad["status_reason"].dropna() if "status_reason" in bad else pd.Series(dtype=str)
    return f": {reasons.iloc[0]}" if len(reasons) else ""


def _detail_section(machines, data, options, breakdowns, settings, budget_sections) -> Section:
    depth, distribution = options.depth, options.distribution
    section = Section("Detail tables").add(Text(DETAIL_INTRO), Text(DETAIL_NOTE, "note"))
    section.add(Text("**Machines:** " + ", ".join(f"{m.label} ({m.source})" for m in machines) + "."))
    from ddtree_bench import consistency  # noqa: PLC0415

    identity = consistency.trace_identity(machines)  # machines side by side: the same inputs or not
    if identity:
        section.add(Text("**Inputs:** " + " ".join(identity)))
    baselines = []
    for machine in machines:
        base = baseline_of(data[data["machine"] == machine.label]) if not data.empty else None
        baselines.append(f"{machine.label}: speedups over {BASELINE_NAMES.get(base, 'none measured')}")
    section.add(Text("**Baselines of the speedups:** " + "; ".join(baselines) + "."))

    in_situ = Section("What the decode round pays (in-situ)").add(Text(IN_SITU_INTRO))
    section.add(in_situ)
    for label, table in in_situ_tables(data, machines, depth, distribution).items():
        if isinstance(table, pd.DataFrame):
            rows = data[(data["machine"] == label) & data["timing"].isin(IN_SITU_TIMINGS)]
            heading = selection_heading(rows, label, depth, distribution)
            in_situ.add(Section(heading).add(Table(table, collapsed=True)))
        else:
            in_situ.add(Section(label).add(Text(table, "em")))
    for machine in machines:
        rows = data[data["machine"] == machine.label] if not data.empty else data
        if rows.empty:
            continue
        heading = f"Medians on {selection_heading(rows, machine.label, depth, distribution)}"
        table = compact_table(data, machine.label, depth, distribution)
        section.add(Section(heading).add(Table(table, collapsed=True)))
    ref_vs_sglang = reference_vs_sglang_table(machines)
    if not ref_vs_sglang.empty:
        section.add(
            Section(REF_VS_SGLANG_TITLE).add(
                Text(REF_VS_SGLANG_NOTE, "note"), Table(ref_vs_sglang, collapsed=True)
            )
        )
    tau = acceptance_report.tau_table(machines)
    agreement = acceptance_report.gpu_agreement_line(machines)
    section.add(
        Section("Acceptance per budget").add(
            Text(acceptance_report.INTRO, "note"),
            Text(agreement) if agreement else None,
            Table(tau, collapsed=True) if not tau.empty else Text("No tree shapes with acceptance."),
        )
    )
    section.add(*step_report.report_sections(machines, breakdowns, settings))
    section.add(stage_rows.section(machines))
    section.add(throughput_report.report_section(budget_sections, machines, options.throughput_options))
    section.add(
        Section("Builders and timings that could not run").add(
            Table(unavailable_table(machines), collapsed=True)
        ),
        Section("Correctness").add(Table(correctness_table(machines), collapsed=True)),
        Section("All configurations").add(
            Table(medians_table(data), collapsed=True, summary="median, p10, p90 per call, per tree, speedup")
        ),
    )
    return section


def _environment_section(machines) -> Section:
    section = Section("Environment").add(Table(environment_table(machines)))
    sources = sglang_source_table(machines)
    if not sources.empty:
        section.add(Section("SGLang's function: where it came from").add(Table(sources)))
    return section


def _goals_section(machines, budget_sections) -> Section:
    results = evaluate_targets(machines)
    results += [TargetResult(*found) for found in throughput_report.budget_targets(budget_sections, machines)]
    order = {m.label: i for i, m in enumerate(machines)}
    results.sort(key=lambda r: order.get(r.machine, len(order)))
    return Section("Appendix: goals").add(
        Text(GOALS_NOTE, "note"), Table(target_frame(results), status_column="status")
    )
