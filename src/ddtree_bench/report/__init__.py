"""The report: ``report/index.html`` (self-contained, figures embedded as base64 PNG) and
``report/summary.md``.

It reads this machine's summary (``results/<machine>/summary.parquet``, its ``tree_shape.parquet``,
``environment.json`` and ``step_summary.parquet``) and every published summary
(``results/published/<machine>/``), and opens with the answer: what the tree build costs the decode round
per builder and budget, and its share of the round. Then the figures, the detail tables (collapsed), the
environment, and the project's goals.

One pass: ``load`` (machines, parquet/json, once) -> ``compose`` (``compose_report``: the answer, the tables,
the figures' files, as sections of ``document`` blocks) -> ``render`` (Markdown and HTML, two writers of that
one page). ``names`` declares the series, builders and figures once; ``fmt`` writes numbers; ``figures``,
``tables``, ``goals``, ``answer`` and the sections ``step``, ``throughput``, ``acceptance`` compute the
page's parts.
"""

from ddtree_bench.report.compose import ReportOptions, ReportPage, compose_report
from ddtree_bench.report.goals import (
    SGLANG_FUNCTION_TARGET,
    TargetResult,
    evaluate_targets,
    sglang_function_targets,
)
from ddtree_bench.report.load import (
    Machine,
    baseline_of,
    load_machine,
    load_machines,
    series_name,
    speedups,
    timings,
)
from ddtree_bench.report.names import BUILD_FIGURES, FIGURE_NAMES, FIGURES, SERIES_NAMES
from ddtree_bench.report.render import ReportFiles, render_report, to_html, to_markdown
from ddtree_bench.report.tables import (
    compact_table,
    html_table,
    in_situ_tables,
    markdown_table,
    medians_table,
    reference_vs_sglang_table,
    sglang_source_table,
)

__all__ = [
    "BUILD_FIGURES",
    "FIGURES",
    "FIGURE_NAMES",
    "SERIES_NAMES",
    "SGLANG_FUNCTION_TARGET",
    "Machine",
    "ReportFiles",
    "ReportPage",
    "ReportOptions",
    "TargetResult",
    "baseline_of",
    "compose_report",
    "compact_table",
    "evaluate_targets",
    "html_table",
    "in_situ_tables",
    "load_machine",
    "load_machines",
    "markdown_table",
    "medians_table",
    "reference_vs_sglang_table",
    "render_report",
    "series_name",
    "sglang_function_targets",
    "sglang_source_table",
    "speedups",
    "timings",
    "to_html",
    "to_markdown",
]
