"""Every name the report declares once: the series (builder, timing) and their colours, the builders and their
styles, the answer's columns, and the figures in page order (name, title, caption, maker)."""

from __future__ import annotations

from ddtree_bench import catalog

#: How each (builder, timing) is named in figures and tables. ``reference`` is ours, never SGLang.
SERIES_NAMES = {key: series.name for key, series in catalog.all_series().items()}
SERIES_ORDER = list(SERIES_NAMES.values())
BASELINE_NAMES = {catalog.SGLANG: "SGLang's CPU builder", catalog.REFERENCE: "reference (ours)"}
#: The timing values of the in-situ rows (what the decode round pays; ``insitu_bench``).
IN_SITU_TIMINGS = catalog.in_situ_timings()

#: The builders, in legend order, with their name in figures and their (colour, marker, line style): one
#: line per builder in every main figure, the same on every machine.
BUILDER_STYLES = {b.name: b.style for b in catalog.BUILDERS.values()}
BUILDER_LABELS = {b.name: b.label for b in catalog.BUILDERS.values()}
CPU_BUILDERS = catalog.builders_where(runner=catalog.CPU)
#: Each builder's one line in the main figures: its in-situ series where the machine has in-situ rows
#: (what the decode round pays), else its per-call timing (CPU builders: wall clock; gpu: kernel events).
PER_CALL_TIMING = {b.name: b.fallback[0] for b in catalog.BUILDERS.values()}

#: The in-situ build labels of the step breakdown (``summary.step.BUILD_LABELS``), in column order, with the
#: builder each one is and the column name of the answer's tables.
IN_SITU_COLUMNS = tuple(
    (s.step, b.name, b.column_name)
    for b in catalog.BUILDERS.values()
    for s in b.in_situ
    if s.timing == catalog.IN_SITU and s.step
)


#: The figures in page order (the catalog's): name, title, caption, drawing function and place.
FigureSpec = catalog.Figure
FIGURES = tuple(catalog.FIGURES.values())
FIGURE_NAMES = tuple(spec.name for spec in FIGURES)
#: The figures of the tree build (drawn from summary.parquet).
BUILD_FIGURES = tuple(spec.name for spec in FIGURES if spec.section == "build")
#: The main figures: at most one line per builder in each panel.
PER_BUILDER_FIGURES = tuple(spec.name for spec in FIGURES if spec.per_builder)
