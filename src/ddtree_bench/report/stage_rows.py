"""Every step stage's rows, whatever the stage: one line per (machine, stage, record stage, impl) of the step
summary, in the catalog's order (``catalog.STAGES``), so a stage added to the catalog is listed without a
table of its own."""

from __future__ import annotations

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.report.document import Section, Table, Text
from ddtree_bench.report.fmt import fmt_us

INTRO = (
    "Every step stage's configurations per impl: how many were timed, the range of their medians, and why "
    "the others were not (how many, and the first two reasons); a stage's own tables above read these rows."
)
COLUMNS = ("machine", "stage", "record stage", "impl", "timed", "medians", "not timed")


def _line(rows: pd.DataFrame) -> tuple[int, str, str]:
    """(configurations timed, the range of their medians, why the others were not) of one impl's rows."""
    ok = rows[(rows["status"] == "ok") & (rows["n"] > 0)]
    medians = f"{fmt_us(ok['median_s'].min())} - {fmt_us(ok['median_s'].max())}" if len(ok) else "-"
    bad = rows[rows["status"] != "ok"]
    reasons = bad["status_reason"].dropna().astype(str).unique()
    return len(ok), medians, f"{len(bad)}: {'; '.join(reasons[:2])}" if len(bad) else "-"


def stage_rows_table(step: pd.DataFrame, machine: str) -> pd.DataFrame:
    """One machine's step summary, one line per (stage, record stage, impl)."""
    lines = []
    for stage in catalog.STAGES.values():
        for record, impls in stage.records.items():
            rows = step[step["stage"] == record]
            for impl in [*impls, *sorted(set(rows["impl"]) - set(impls))]:
                sel = rows[rows["impl"] == impl]
                if not sel.empty:
                    lines.append((machine, stage.name, record, impl, *_line(sel)))
    return pd.DataFrame(lines, columns=list(COLUMNS))


def section(machines) -> Section:
    tables = [stage_rows_table(m.step, m.label) for m in machines if not m.step.empty]
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=list(COLUMNS))
    return Section("Every step stage's rows").add(Text(INTRO), Table(table, collapsed=True, empty="no data"))
