"""The report's pages: ``index.html`` (self-contained, figures embedded as base64 PNG) and ``summary.md``."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from html import escape
from pathlib import Path

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.report import acceptance as acceptance_report
from ddtree_bench.report import answer as answer_module
from ddtree_bench.report import step as step_report
from ddtree_bench.report import throughput as throughput_report
from ddtree_bench.report.figures import _empty_figure
from ddtree_bench.report.goals import (
    REF_VS_SGLANG_NOTE,
    REF_VS_SGLANG_TITLE,
    TargetResult,
    _target_frame,
    evaluate_targets,
)
from ddtree_bench.report.load import (
    BASELINE_NAMES,
    IN_SITU_TIMINGS,
    Machine,
    baseline_of,
    load_machine,
    load_machines,
    selection_heading,
    timings,
)
from ddtree_bench.report.tables import (
    IN_SITU_INTRO,
    compact_table,
    correctness_table,
    environment_table,
    html_table,
    in_situ_tables,
    markdown_table,
    medians_table,
    reference_vs_sglang_table,
    sglang_source_table,
    unavailable_table,
)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1250px;
color:#222;padding:0 1em;line-height:1.45}
h1{font-size:1.6em}h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;font-size:.82em;margin:.6em 0}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.met{background:#dff5df}td.not-met{background:#f9dcdc}td.no-data{color:#777}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}details{margin:.5em 0}.note{color:#555}
"""


def render_report(
    *,
    summary,
    shapes=None,
    environment=None,
    published=(),
    html: str | Path = "report/index.html",
    markdown: str | Path = "report/summary.md",
    figures=None,
    depth: int | None = 16,
    distribution: str | None = "peaked",
    step_summary=None,
    step_layers: int = 61,
    step_depth: int | None = None,
    step_distribution: str | None = None,
    step_enabled: bool = True,
    throughput_options: dict | None = None,
    distributions: list[str] | None = None,
    grid: dict | None = None,
) -> None:
    """Render the HTML page and the Markdown summary (and the figures as PNG files next to them).

    ``grid``: the configuration's grid lists (``consistency.configured_grid``); where given, a summary or
    tree-shape table that does not hold exactly that grid is refused (``ValueError``) before anything is
    written.

    ``step_summary``: this run's step summary (default: ``step_summary.parquet`` beside ``summary``);
    ``step_layers``, ``step_depth``, ``step_distribution``: the step section of this run's configuration
    (published machines use their own, from their environment.json); ``step_enabled`` False: this run left
    the step stages out (its step tables say so). ``throughput_options``: the "Which budget?" model's
    settings (``config.throughput_options``; None: the defaults); ``distributions``: this run's configured
    distributions (the section shows the first, and ``recorded`` where configured)."""
    import matplotlib  # noqa: PLC0415

    from ddtree_bench import consistency  # noqa: PLC0415

    if grid is not None:
        this = load_machine(summary, shapes, environment, step_summary)
        consistency.check_summary(this.summary, grid, where=f"summary {summary}")
        consistency.check_shapes(this.shapes, grid, where=f"tree shapes beside {summary}")
    matplotlib.use("Agg")
    html_path, md_path = Path(html), Path(markdown)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    if figures is None:
        figures = [html_path.parent / "figures" / f"{name}.png" for name in catalog.FIGURES]
    figure_paths = {Path(p).stem: Path(p) for p in figures}
    for path in figure_paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)

    machines = load_machines(summary, shapes, environment, published, step=step_summary)
    if not step_enabled:
        machines[0].step = pd.DataFrame()
        machines[0].step_missing = "step stages off (step.enabled: false in the configuration)"
    settings = {
        machine.label: _step_settings(machine, step_layers)
        if machine is not machines[0]
        else {"layers": step_layers, "depth": step_depth, "distribution": step_distribution}
        for machine in machines
    }
    breakdowns = {m.label: step_report.breakdown_for(m, **settings[m.label]) for m in machines}
    budget_sections = throughput_report.sections(
        machines, settings, throughput_options, distributions=distributions, depth=depth
    )
    data = timings(machines)
    titles = {}
    inputs = {
        "data": data,
        "machines": machines,
        "breakdowns": breakdowns,
        "found": budget_sections,
        "options": throughput_options,
        "depth": depth,
        "distribution": distribution,
    }
    for name, path in figure_paths.items():
        entry = catalog.FIGURES[name]
        if data.empty and entry.timings:
            _empty_figure(path, "no timings")
            titles[name] = "no timings"
        else:
            titles[name] = _drawer(entry)(path=path, **{key: inputs[key] for key in entry.inputs})

    target_results = evaluate_targets(machines)
    target_results += [
        TargetResult(*found) for found in throughput_report.budget_targets(budget_sections, machines)
    ]
    machine_order = {m.label: i for i, m in enumerate(machines)}
    target_results.sort(key=lambda r: machine_order.get(r.machine, len(machine_order)))
    targets = _target_frame(target_results)
    medians = medians_table(data)
    unavailable = unavailable_table(machines)
    correctness = correctness_table(machines)
    env_table = environment_table(machines)
    ref_vs_sglang = reference_vs_sglang_table(machines)
    sglang_sources = sglang_source_table(machines)
    compact, in_situ_headings = {}, {}
    for machine in machines:
        rows = data[data["machine"] == machine.label] if not data.empty else data
        if rows.empty:
            continue
        shown = selection_heading(rows, machine.label, depth, distribution)
        compact[machine.label] = (
            compact_table(data, machine.label, depth, distribution),
            f"Medians on {shown}",
        )
        in_situ_rows = rows[rows["timing"].isin(IN_SITU_TIMINGS)]
        if len(in_situ_rows):
            in_situ_headings[machine.label] = selection_heading(
                in_situ_rows, machine.label, depth, distribution
            )
    in_situ = in_situ_tables(data, machines, depth, distribution)
    baselines = {}
    for machine in machines:
        base = baseline_of(data[data["machine"] == machine.label]) if not data.empty else None
        baselines[machine.label] = BASELINE_NAMES.get(base, "none measured")

    intro = (
        "Time to build DDTree draft trees (best-first, SGLang's `build_ddtree_tree_from_topk` contract) "
        "from the same top-K traces with every builder: median of every timed call (warm-up excluded), "
        "p10-p90 band. Every builder's trees were checked equal to `reference`'s on the whole trace before "
        "its timings count. `reference` is our own Python implementation of SGLang's algorithm, not SGLang."
    )
    machines_line = ", ".join(f"{m.label} ({m.source})" for m in machines)
    baseline_line = "; ".join(f"{label}: speedups over {name}" for label, name in baselines.items())
    identity = consistency.trace_identity(machines)  # machines side by side: the same inputs or not
    step = _step_sections(machines, breakdowns, settings)
    tau_table = acceptance_report.tau_table(machines)
    gpu_agreement = acceptance_report.gpu_agreement_line(machines)

    from ddtree_bench.traces import atomic_output  # noqa: PLC0415

    answer = answer_module.answer(machines, breakdowns, settings, budget_sections)
    compact_headings = {label: heading for label, (_, heading) in compact.items()}
    compact = {label: table for label, (table, _) in compact.items()}
    figure_order = [n for n in catalog.FIGURES if n in figure_paths]
    key_figure = next((n for n in figure_order if catalog.FIGURES[n].key), None)
    other_figures = [n for n in figure_order if n != key_figure]

    # Markdown
    md = [f"# ddtree-bench report\n\n{LEAD}\n"]
    md += _answer_markdown(
        answer, figure_paths.get(key_figure) if key_figure else None, titles.get(key_figure)
    )
    md.append("## Figures\n")
    for name in other_figures:
        md.append(f"### {titles[name]}\n\n![{name}](figures/{figure_paths[name].name})\n")
    md.append(f"## Detail tables\n\n{intro}\n\n{DETAIL_NOTE}\n\nMachines: {machines_line}.\n")
    if identity:
        md.append("Inputs: " + " ".join(identity) + "\n")
    md.append(f"Baselines of the speedups: {baseline_line}.\n")
    md.append(f"### What the decode round pays (in-situ)\n\n{IN_SITU_INTRO}\n")
    for label, table in in_situ.items():
        if isinstance(table, pd.DataFrame):
            md.append(f"#### {in_situ_headings[label]}\n\n" + md_details(table))
        else:
            md.append(f"#### {label}\n\n{table}\n")
    for label, table in compact.items():
        md.append(f"### {compact_headings[label]}\n\n" + md_details(table))
    if not ref_vs_sglang.empty:
        md.append(f"### {REF_VS_SGLANG_TITLE}\n\n{REF_VS_SGLANG_NOTE}\n\n" + md_details(ref_vs_sglang))
    md.append(f"### Acceptance per budget\n\n{acceptance_report.INTRO}\n")
    if gpu_agreement:
        md.append(gpu_agreement + "\n")
    md.append(md_details(tau_table) if not tau_table.empty else "No tree shapes with acceptance.\n")
    md += _demote(_step_markdown(step, None, None, md_details))
    md += _demote(throughput_report.markdown(budget_sections, throughput_options, None, None, md_details))
    md.append("### Builders that could not run\n\n" + md_details(unavailable))
    md.append("### Correctness\n\n" + md_details(correctness))
    md.append("### All configurations\n\n" + md_details(medians))
    md.append("## Environment\n\n" + markdown_table(env_table))
    if not sglang_sources.empty:
        md.append("### SGLang's function: where it came from\n\n" + markdown_table(sglang_sources))
    md.append(f"## Appendix: goals\n\n{GOALS_NOTE}\n\n" + markdown_table(targets))

    with atomic_output(md_path) as tmp:
        Path(tmp).write_text("\n".join(md))

    # HTML (self-contained: figures as base64 PNG)
    def img(name: str) -> str:
        data64 = base64.b64encode(figure_paths[name].read_bytes()).decode("ascii")
        return f'<img alt="{name}" src="data:image/png;base64,{data64}">'

    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>ddtree-bench report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>ddtree-bench report</h1>",
        f"<p class='note'>{escape(LEAD)}</p>",
    ]
    parts += _answer_html(answer, img(key_figure) if key_figure else "", titles.get(key_figure))
    parts.append("<h2>Figures</h2>")
    for name in other_figures:
        parts += [f"<h3>{escape(titles[name])}</h3>", img(name)]
    parts += [
        "<h2>Detail tables</h2>",
        f"<p>{escape(intro)}</p>",
        f"<p class='note'>{escape(DETAIL_NOTE)}</p>",
        f"<p><b>Machines:</b> {escape(machines_line)}</p>",
        *([f"<p><b>Inputs:</b> {escape(' '.join(identity))}</p>"] if identity else []),
        f"<p><b>Baselines of the speedups:</b> {escape(baseline_line)}</p>",
        "<h3>What the decode round pays (in-situ)</h3>",
        f"<p>{escape(IN_SITU_INTRO)}</p>",
    ]
    for label, table in in_situ.items():
        if isinstance(table, pd.DataFrame):
            parts += [f"<h4>{escape(in_situ_headings[label])}</h4>", html_details(table)]
        else:
            parts += [f"<h4>{escape(label)}</h4>", f"<p><em>{escape(table)}</em></p>"]
    for label, table in compact.items():
        parts += [f"<h3>{escape(compact_headings[label])}</h3>", html_details(table)]
    if not ref_vs_sglang.empty:
        parts += [
            f"<h3>{escape(REF_VS_SGLANG_TITLE)}</h3>",
            f"<p class='note'>{escape(REF_VS_SGLANG_NOTE)}</p>",
            html_details(ref_vs_sglang),
        ]
    parts += ["<h3>Acceptance per budget</h3>", f"<p class='note'>{escape(acceptance_report.INTRO)}</p>"]
    if gpu_agreement:
        parts.append(f"<p>{escape(gpu_agreement)}</p>")
    parts.append(html_details(tau_table) if not tau_table.empty else "<p>No tree shapes with acceptance.</p>")
    parts += _demote(_step_html(step, "", None, html_details))
    parts += _demote(throughput_report.html(budget_sections, throughput_options, "", None, html_details))
    parts += [
        "<h3>Builders that could not run</h3>",
        html_details(unavailable),
        "<h3>Correctness</h3>",
        html_details(correctness),
        "<h3>All configurations</h3>",
        html_details(medians, "median, p10, p90 per call, per tree, speedup"),
        "<h2>Environment</h2>",
        html_table(env_table),
    ]
    if not sglang_sources.empty:
        parts += ["<h3>SGLang's function: where it came from</h3>", html_table(sglang_sources)]
    parts += [
        "<h2>Appendix: goals</h2>",
        f"<p class='note'>{escape(GOALS_NOTE)}</p>",
        html_table(targets, status_column="status"),
        "</body></html>",
    ]
    with atomic_output(html_path) as tmp:
        Path(tmp).write_text("\n".join(parts))


def _drawer(entry: catalog.Figure):
    """The function that draws a catalog figure (``entry.draw``: "module:function")."""
    import importlib  # noqa: PLC0415

    module, _, function = entry.draw.partition(":")
    return getattr(importlib.import_module(module), function)


LEAD = (
    "What building DDTree draft trees costs a speculative-decoding round, per tree builder and budget, on "
    "the same inputs; every builder's trees equal the reference's. The answer first, then the figures, the "
    "detail tables (collapsed), the environment and the project's goals."
)
DETAIL_NOTE = (
    "Every table below is collapsed; click a summary line to open it. Times: median per call (warm-up "
    "excluded) with p10-p90 where shown; one unit per column."
)
GOALS_NOTE = (
    "The project's goals, each named by what it measures and evaluated on each machine's measured medians; "
    'a goal not met says by how much. "from" names what the goal is about.'
)


def md_details(df: pd.DataFrame, summary: str | None = None) -> str:
    """A Markdown table collapsed in ``<details>`` (GitHub renders it), or the empty-table line."""
    if df.empty:
        return markdown_table(df)
    return f"<details><summary>{summary or f'{len(df)} rows'}</summary>\n\n{markdown_table(df)}\n</details>\n"


def html_details(df: pd.DataFrame, summary: str | None = None) -> str:
    """An HTML table collapsed in ``<details>``, or the empty-table line."""
    if df.empty:
        return html_table(df)
    text = f"{len(df)} rows" + (f": {summary}" if summary else "")
    return f"<details><summary>{escape(text)}</summary>{html_table(df)}</details>"


def _demote(lines: list[str]) -> list[str]:
    """A section's headings one level down (it sits under "Detail tables")."""
    out = []
    for line in lines:
        if line.startswith("#"):
            line = "#" + line
        for level in (3, 2):
            line = line.replace(f"<h{level}>", f"<h{level + 1}>").replace(f"</h{level}>", f"</h{level + 1}>")
        out.append(line)
    return out


def _answer_markdown(answer, figure_path, title) -> list[str]:
    md = ["## Answer: what the tree build costs the decode round\n"]
    if answer.machine is None:
        md.append(f"_No answer: {answer.missing}._\n")
    else:
        md.append("**Verdict:**\n\n" + "\n".join(f"- {line}" for line in answer.verdict) + "\n")
        md.append(answer.intro() + "\n")
        for batch, table in answer.tables.items():
            md.append(f"### {answer.heading(batch)}\n\n" + markdown_table(table))
    if figure_path is not None:
        md.append(f"### {title}\n\n![step_share](figures/{Path(figure_path).name})\n")
    return md


def _answer_html(answer, image: str, title) -> list[str]:
    parts = ["<h2>Answer: what the tree build costs the decode round</h2>"]
    if answer.machine is None:
        parts.append(f"<p><em>No answer: {escape(answer.missing)}.</em></p>")
    else:
        parts.append("<p><b>Verdict:</b></p><ul>")
        for line in answer.verdict:
            head, _, rest = line.partition(":** ")
            parts.append(f"<li><b>{escape(head.strip('*'))}:</b> {escape(rest)}</li>")
        parts.append(f"</ul><p class='note'>{escape(answer.intro())}</p>")
        for batch, table in answer.tables.items():
            parts += [f"<h3>{escape(answer.heading(batch))}</h3>", html_table(table)]
    if image:
        parts += [f"<h3>{escape(str(title))}</h3>", image]
    return parts


# ----------------------------------------------------------------------------------------------- step part


def _step_settings(machine: Machine, layers: int) -> dict:
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


@dataclass
class StepSections:
    attention: pd.DataFrame
    accept: pd.DataFrame
    peaks: list[tuple[str, str]]
    backends: list[tuple[str, str]]  # (machine, how each attention impl ran)
    breakdown: list[tuple[str, str, pd.DataFrame]]  # (machine, heading note, table)
    acceptance: pd.DataFrame
    missing: list[tuple[str, str]]  # (machine, why it has no step data)


def _step_sections(machines: list[Machine], breakdowns: dict, settings: dict) -> StepSections:
    attention, accept, acceptance, peaks, backends, breakdown, missing = [], [], [], [], [], [], []
    for machine in machines:
        label = machine.label
        layers, depth, distribution = (settings[label][k] for k in ("layers", "depth", "distribution"))
        if machine.step.empty:
            missing.append((label, machine.step_missing))
        else:
            attention.append(step_report.attention_table(machine.step, label))
            accept.append(step_report.accept_table(machine.step, label))
            peaks.append((label, step_report.peaks_line(machine.step)))
            line = step_report.backends_line(machine.step)
            if line:
                backends.append((label, line))
            table = step_report.breakdown_table(breakdowns[label], label, layers)
            where = ", ".join(x for x in (f"L = {depth}" if depth else "", str(distribution or "")) if x)
            note = f"{layers} layers; {where} trees" if where else f"{layers} layers"
            breakdown.append((label, note, table))
        table = step_report.acceptance_table(machine.shapes, label, depth, distribution)
        if table.empty and not machine.step.empty:  # shapes from before the expected acceptance was kept
            table = step_report.acceptance_from_accept(machine.step, label)
        acceptance.append(table)

    def concat(frames):
        frames = [f for f in frames if not f.empty]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    return StepSections(
        concat(attention), concat(accept), peaks, backends, breakdown, concat(acceptance), missing
    )


STEP_INTRO = (
    "The decode step around the tree build, measured on the same GPU in the same run: the tree-verify "
    "attention of one layer at Kimi K2.6's shapes (absorbed MLA: 576-wide latent keys, 512-wide values, one "
    "shared latent KV head; every request's N+1 tree queries see its S prefix keys and their tree "
    "ancestors), by our kernel and its peers (PyTorch's; FlashMLA, which has no tree mask and runs causal, "
    "as its rows' mask says; SGLang's Triton tree kernel), timed by CUDA events (warm L2; cold-L2 samples "
    "are "
    "in step_summary.parquet); the tree accept walk; and the GPU's peaks. TFLOP/s and TB/s are the work of "
    "one call (FLOPs of the visible keys; bytes moved at least once) over its time, median over the calls, "
    "and as % of the measured bf16 GEMM and device-copy peaks."
)
BREAKDOWN_INTRO = (
    "Per (S, batch B, budget N): each builder's tree build (median per call; in-situ where measured: what "
    "the decode round pays from the drafter's top-K on the GPU to the tree on the GPU; else CPU builders "
    "by wall clock and the GPU builder both kernel-only and host-inclusive), our verify attention for all "
    "layers (per-layer median x layers), and the accept (the GPU kernel); in brackets the build's share of "
    "build + attention + accept. E[accepted] is the expected number of accepted draft tokens of the "
    "budget's trees (the sum over nodes of the path probability under the drafter's distributions): what a "
    "larger budget buys, beside what it costs."
)


def _missing_lines(step: StepSections) -> list[str]:
    return [f"{label}: no data ({why})" for label, why in step.missing]


def _step_markdown(step: StepSections, figure_path, title, writer=None) -> list[str]:
    writer = writer or markdown_table
    md = [f"## Verify attention\n\n{STEP_INTRO}\n"]
    md += [f"- {line}" for line in _missing_lines(step)] + ([""] if step.missing else [])
    peaks = "; ".join(f"{label}: {line}" for label, line in step.peaks) or "no data"
    md.append(f"GPU peaks: {peaks}\n")
    md += [f"How each impl ran ({label}): {line}\n" for label, line in step.backends]
    md.append(writer(step.attention) if not step.attention.empty else "_no data_\n")
    md.append(
        "## Tree accept\n\nGPU kernel (CUDA events), host-inclusive (launch, copies out, sync), the "
        "CPU walk including the device-to-host copy of the target's tokens, and the empty-kernel floor "
        "of the same run.\n"
    )
    md.append(writer(step.accept) if not step.accept.empty else "_no data_\n")
    md.append(f"## Step-time breakdown\n\n{BREAKDOWN_INTRO}\n\n**Left out:** {step_report.LEFT_OUT}\n")
    md += [f"- {line}" for line in _missing_lines(step)] + ([""] if step.missing else [])
    for label, note, table in step.breakdown:
        md.append(f"### {label} ({note})\n\n" + (writer(table) if not table.empty else "_no data_\n"))
    if figure_path is not None:
        md.append(f"### {title}\n\n![step_share](figures/{Path(figure_path).name})\n")
    md.append(
        "### Expected acceptance per budget\n\n"
        + (writer(step.acceptance) if not step.acceptance.empty else "_no data_\n")
    )
    return md


def _step_html(step: StepSections, image: str, title, writer=None) -> list[str]:
    writer = writer or html_table

    def table(df):
        return writer(df) if not df.empty else "<p><em>no data</em></p>"

    missing = "".join(f"<li>{escape(line)}</li>" for line in _missing_lines(step))
    missing = f"<ul>{missing}</ul>" if missing else ""
    peaks = "; ".join(f"{label}: {line}" for label, line in step.peaks) or "no data"
    parts = [
        "<h2>Verify attention</h2>",
        f"<p>{escape(STEP_INTRO)}</p>",
        missing,
        f"<p><b>GPU peaks:</b> {escape(peaks)}</p>",
        *(
            f"<p><b>How each impl ran ({escape(label)}):</b> {escape(line)}</p>"
            for label, line in step.backends
        ),
        table(step.attention),
        "<h2>Tree accept</h2>",
        "<p>GPU kernel (CUDA events), host-inclusive (launch, copies out, sync), the CPU walk including the "
        "device-to-host copy of the target's tokens, and the empty-kernel floor of the same run.</p>",
        table(step.accept),
        "<h2>Step-time breakdown</h2>",
        f"<p>{escape(BREAKDOWN_INTRO)}</p>",
        f"<p><b>Left out:</b> {escape(step_report.LEFT_OUT)}</p>",
        missing,
    ]
    for label, note, df in step.breakdown:
        parts += [f"<h3>{escape(label)} ({escape(note)})</h3>", table(df)]
    if image:
        parts += [f"<h3>{escape(str(title))}</h3>", image]
    parts += ["<h3>Expected acceptance per budget</h3>", table(step.acceptance)]
    return parts
