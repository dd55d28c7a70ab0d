"""The published report's page as a reader sees it (results/published/h200/report.md, which
test_published_snapshot holds equal to a fresh render): one number style (signs, thousands separators,
units), and one tokens/s per (stack, batch, prefix, budget, profile) wherever the page gives it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "results" / "published" / "h200" / "report.md"


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text()


def test_no_negative_zero_percent(page):
    assert "-0%" not in page and "(-0.0%)" not in page


def test_large_numbers_carry_thousands_separators(page):
    bare = re.findall(r"(?<![\d,.\-])\d{4,}(?![\d,.])\s?(?:tokens/s|µs)", page)
    assert bare == [], bare[:5]


def test_no_zero_duration_written_with_a_decimal(page):
    assert re.search(r"(?<![\d.])0\.0 µs", page) is None


def _stack_section(page: str) -> str:
    start = page.index("## What the three kernels are worth")
    return page[start : page.index("\n## ", start + 5)]


def _tables_after(text: str, heading: str) -> list[list[str]]:
    """The rows (cells) of the first Markdown table after ``heading``."""
    lines = text[text.index(heading) :].splitlines()
    rows, started = [], False
    for line in lines[1:]:
        if line.startswith("|"):
            started = True
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif started:
            break
    return rows[2:]  # without the header and the rule


def test_each_stack_configuration_has_one_tokens_per_second_on_the_page(page):
    """The tree-or-chain table's best rounds (paper profile) equal the same rounds in the per-budget tables
    of the same profile."""
    section = _stack_section(page)
    chain_rows = _tables_after(section, "**Tree or chain? tau: paper")
    assert chain_rows, "no tree-or-chain table"
    per_budget = section[section.index("### Tokens/s per stack and budget (tau: paper)") :]
    for batch, prefix, ours, *_ in chain_rows:
        value, budget = re.match(r"([\d,]+) \(N = (\d+)\)", ours).groups()
        block = per_budget[per_budget.index(f"B = {batch}, S = {prefix}") :]
        header = next(line for line in block.splitlines() if line.startswith("| N |"))
        columns = [c.strip() for c in header.strip("|").split("|")]
        row = next(line for line in block.splitlines() if line.startswith(f"| {budget} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[columns.index("ours")] == value, (batch, prefix, budget)


def test_a_machine_without_step_stages_has_no_modelled_tokens_per_second_on_the_page(page):
    """h200-sglang and h200-sglang-regime ran no step stages: the "Which budget?" section says so once and
    models only the machines that measured them, each on its own rows."""
    start = page.index("### Which budget?\n")
    which = page[start : page.index("\n### ", start + 5)]
    assert (
        "h200-sglang (published) and h200-sglang-regime (published) have no GPU step stages (no "
        "step_summary.parquet; the step stages were off in that run), so they have no modelled K2.6 tokens/s "
        "of their own." in which
    )
    headings = [line for line in which.splitlines() if line.startswith("#### ")]
    assert headings and not [h for h in headings if h.startswith("#### h200-sglang")]
    for line in page.splitlines():
        if "h200-sglang" in line and "tokens/s" in line:
            assert "no modelled" in line, line
