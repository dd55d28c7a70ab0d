"""The report's pages: ``index.html`` (self-contained, figures embedded as base64 PNG) and ``summary.md``,
two writers of one ``compose.ReportPage``."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, replace
from html import escape
from pathlib import Path

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.report.compose import ReportOptions, ReportPage, compose_report
from ddtree_bench.report.document import Bullets, Figure, Section, Table, Text
from ddtree_bench.report.load import load_machines
from ddtree_bench.report.tables import html_table, markdown_table

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1250px;
color:#222;padding:0 1em;line-height:1.45}
h1{font-size:1.6em}h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;font-size:.82em;margin:.6em 0}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
td.nw{white-space:nowrap}.scroll{overflow-x:auto;max-width:100%}th{background:#f3f3f3}
.wide table{border-collapse:separate;border-spacing:0;border-top:1px solid #ccc;border-left:1px solid #ccc}
.wide th,.wide td{border-width:0 1px 1px 0}
.wide th:first-child,.wide td:first-child,.key2 th:nth-child(2),.key2 td:nth-child(2){position:sticky;left:0;
z-index:1;background:#fff}.wide th:first-child,.key2 th:nth-child(2){background:#f3f3f3}
.key2 th:first-child,.key2 td:first-child{box-sizing:border-box;width:4.5em;min-width:4.5em;max-width:4.5em}
.key2 th:nth-child(2),.key2 td:nth-child(2){left:4.5em}
.wide tr>:first-child,.key2 tr>:nth-child(2){box-shadow:inset -1px 0 #999}
.key2 tr>:first-child{box-shadow:none}
td.met,.wide td.met{background:#dff5df}td.not-met,.wide td.not-met{background:#f9dcdc}td.no-data{color:#777}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}details{margin:.5em 0}.note{color:#555}
figure{margin:0}figcaption{color:#555;font-size:.9em}
.banner{background:#fff4d6;border:1px solid #e0c060;padding:.5em .8em;font-weight:600}
"""


@dataclass(frozen=True)
class ReportFiles:
    """Where ``render_report`` writes: the HTML page, the Markdown summary and the figures' PNG files
    (``figures``: their paths, by file name; a figure not among them goes into the same folder; None: all
    in ``figures/`` beside the page)."""

    html: str | Path = "report/index.html"
    markdown: str | Path = "report/summary.md"
    figures: tuple | list | None = None

    @classmethod
    def in_folder(cls, folder: str | Path) -> ReportFiles:
        """``folder/index.html``, ``folder/summary.md`` and ``folder/figures/``."""
        return cls(Path(folder) / "index.html", Path(folder) / "summary.md")


def render_report(
    *,
    summary,
    shapes=None,
    environment=None,
    published=(),
    step_summary=None,
    files: ReportFiles | None = None,
    grid: dict | None = None,
    **options,
) -> None:
    """Render the HTML page and the Markdown summary (and the figures as PNG files next to them) where
    ``files`` says (``ReportFiles``; None: its defaults, under report/).

    ``options``: ``compose.ReportOptions``'s fields (depth, distribution, step_layers, step_depth,
    step_distribution, step_enabled, throughput_options, distributions, profiles, published_answer), or
    ``options=`` one ``ReportOptions`` (the workflow's, ``ReportOptions.from_settings``). ``grid``: the
    configuration's grid lists (``consistency.configured_grid``); where given, a summary or tree-shape
    table that does not hold exactly that grid is refused (``ValueError``) before anything is written.
    ``step_summary``: this run's step summary (default: ``step_summary.parquet`` beside ``summary``)."""
    import matplotlib  # noqa: PLC0415

    from ddtree_bench import consistency  # noqa: PLC0415
    from ddtree_bench.traces import atomic_output  # noqa: PLC0415

    given = options.pop("options", None)
    options = given if given is not None else ReportOptions(**options)
    machines = load_machines(summary, shapes, environment, published, step=step_summary)
    if grid is not None:
        consistency.check_summary(machines[0].summary, grid, where=f"summary {summary}")
        consistency.check_shapes(machines[0].shapes, grid, where=f"tree shapes beside {summary}")
    if not options.step_enabled:
        machines[0].step = pd.DataFrame()
        machines[0].step_missing = "step stages off (step.enabled: false in the configuration)"
    files = files or ReportFiles()
    html_path, md_path = Path(files.html), Path(files.markdown)
    figure_paths = _figure_paths(files.figures, html_path.parent / "figures")
    for path in (html_path, md_path, *figure_paths.values()):
        path.parent.mkdir(parents=True, exist_ok=True)
    matplotlib.use("Agg")
    page = compose_report(machines, options, figure_paths)
    with atomic_output(md_path) as tmp:
        Path(tmp).write_text(to_markdown(page, md_path.parent))
    with atomic_output(html_path) as tmp:
        Path(tmp).write_text(to_html(page))


def _figure_paths(figures, folder: Path) -> dict[str, Path]:
    given = {Path(p).stem: Path(p) for p in figures or ()}
    unknown = sorted(set(given) - set(catalog.FIGURES))
    if unknown:
        raise ValueError(f"figures: {', '.join(unknown)} not among {', '.join(catalog.FIGURES)}")
    if given:
        folder = next(iter(given.values())).parent
    return {name: given.get(name, folder / f"{name}.png") for name in catalog.FIGURES}


# ----------------------------------------------------------------------------------------------- Markdown


def to_markdown(page: ReportPage, folder: Path | None = None) -> str:
    """The page as Markdown (figures linked relative to ``folder``, the summary's folder)."""
    lines = [f"# {page.title}\n"]
    if page.banner:
        lines.append(f"**{page.banner}**\n")
    lines.append(f"{page.lead}\n")
    for section in page.sections:
        lines += _md_section(section, 2, folder)
    return "\n".join(lines)


def labelled(section: Section) -> list:
    """The section's blocks, each collapsed table without a summary given one: what it holds, named by the
    short text just before it (e.g. "B = 1, S = 4096") or else by its section's title."""
    out, before = [], None
    for block in section.blocks:
        if isinstance(block, Table) and block.collapsed and not block.summary:
            name = before if before is not None else section.title
            block = replace(block, summary=name)
        short = isinstance(block, Text) and len(block.text) <= 80
        before = block.text.strip("*_ ").rstrip(":") if short else None
        out.append(block)
    return out


def rows_text(table: Table) -> str:
    """A collapsed table's line: its row count and what it holds."""
    n = len(table.frame)
    return f"{n} row{'' if n == 1 else 's'}" + (f": {table.summary}" if table.summary else "")


def _md_section(section: Section, level: int, folder) -> list[str]:
    out = [f"{'#' * level} {section.title}\n"]
    for block in labelled(section):
        if isinstance(block, Section):
            out += _md_section(block, level + 1, folder)
        else:
            out.append(_md_block(block, level + 1, folder))
    return out


def _md_block(block, level: int, folder) -> str:
    if isinstance(block, Text):
        return f"_{block.text}_\n" if block.style == "em" else f"{block.text}\n"
    if isinstance(block, Bullets):
        mark = "1." if block.ordered else "-"
        return "\n".join(f"{mark} {item}" for item in block.items) + "\n"
    if isinstance(block, Table):
        if block.frame.empty:
            return f"_{block.empty}_\n"
        table = markdown_table(block.frame)
        if not block.collapsed:
            return table
        return f"<details><summary>{rows_text(block)}</summary>\n\n{table}\n</details>\n"
    if isinstance(block, Figure):
        link = block.path.name if folder is None else _relative(block.path, folder)
        image = f"![{block.name}]({link})\n\n_{block.caption}_\n"
        if block.collapsed:
            return f"<details><summary>{block.title}</summary>\n\n{image}\n</details>\n"
        return f"{'#' * level} {block.title}\n\n{image}"
    raise TypeError(f"no Markdown for {type(block).__name__}")


def _relative(path: Path, folder: Path) -> str:
    try:
        return path.resolve().relative_to(Path(folder).resolve()).as_posix()
    except ValueError:
        return path.as_posix()


# ----------------------------------------------------------------------------------------------- HTML

_BOLD = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]+)`")


def _inline(text: str) -> str:
    """Escaped text with its ``**bold**`` and ```code``` spans as HTML."""
    return _CODE.sub(r"<code>\1</code>", _BOLD.sub(r"<b>\1</b>", escape(text)))


def to_html(page: ReportPage) -> str:
    """The page as one self-contained HTML page (figures embedded)."""
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{escape(page.title)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{escape(page.title)}</h1>",
    ]
    if page.banner:
        parts.append(f"<p class='banner'>{escape(page.banner)}</p>")
    parts.append(f"<p class='note'>{escape(page.lead)}</p>")
    for section in page.sections:
        parts += _html_section(section, 2)
    parts.append("</body></html>")
    return "\n".join(parts)


def _html_section(section: Section, level: int) -> list[str]:
    out = [f"<h{level}>{escape(section.title)}</h{level}>"]
    for block in labelled(section):
        if isinstance(block, Section):
            out += _html_section(block, min(level + 1, 6))
        else:
            out.append(_html_block(block, min(level + 1, 6)))
    return out


def _html_block(block, level: int) -> str:
    if isinstance(block, Text):
        text = _inline(block.text)
        if block.style == "em":
            return f"<p><em>{text}</em></p>"
        return f"<p class='note'>{text}</p>" if block.style == "note" else f"<p>{text}</p>"
    if isinstance(block, Bullets):
        tag = "ol" if block.ordered else "ul"
        return f"<{tag}>" + "".join(f"<li>{_inline(item)}</li>" for item in block.items) + f"</{tag}>"
    if isinstance(block, Table):
        if block.frame.empty:
            return f"<p><em>{escape(block.empty)}</em></p>"
        table = html_table(block.frame, status_column=block.status_column)
        if not block.collapsed:
            return table
        return f"<details><summary>{escape(rows_text(block))}</summary>{table}</details>"
    if isinstance(block, Figure):
        data = base64.b64encode(block.path.read_bytes()).decode("ascii")
        figure = (
            f'<figure><img alt="{escape(block.name)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_inline(block.caption)}</figcaption></figure>"
        )
        if block.collapsed:
            return f"<details><summary>{escape(block.title)}</summary>{figure}</details>"
        return f"<h{level}>{escape(block.title)}</h{level}>{figure}"
    raise TypeError(f"no HTML for {type(block).__name__}")
