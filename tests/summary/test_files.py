"""The results files the report reads are checked before anything runs: each opens and holds the columns the
report needs, so a truncated or older-schema file under results/published/ is one line naming it, in the dry
run, instead of a failure of the last job (before: found by render_report, an hour into a run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from workflow_copy import ROOT, error_lines, snakemake, workdir_copy

from ddtree_bench.cli import main
from ddtree_bench.summary.build import SUMMARY_COLUMNS
from ddtree_bench.summary.files import REPORT_COLUMNS, check_published, check_results_folder
from ddtree_bench.summary.step import STEP_SUMMARY_COLUMNS

PUBLISHED = ROOT / "results" / "published"


def test_the_columns_the_report_needs_are_written_by_the_aggregation_and_in_every_published_folder():
    assert set(REPORT_COLUMNS["summary.parquet"]) <= set(SUMMARY_COLUMNS)
    assert set(REPORT_COLUMNS["step_summary.parquet"]) <= set(STEP_SUMMARY_COLUMNS)
    check_published(PUBLISHED)  # the committed results: every file opens, with those columns
    assert len(list(PUBLISHED.glob("*/summary.parquet"))) >= 3


def copy_of(tmp_path: Path, label: str = "h200") -> Path:
    folder = tmp_path / "published" / label
    shutil.copytree(PUBLISHED / label, folder, ignore=shutil.ignore_patterns("figures", "racecheck"))
    return folder


def test_a_truncated_file_is_one_line_naming_it(tmp_path):
    folder = copy_of(tmp_path)
    data = (folder / "summary.parquet").read_bytes()
    (folder / "summary.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as error:
        check_published(tmp_path / "published")
    assert str(error.value).startswith(f"{folder / 'summary.parquet'}: cannot be read as a parquet file (")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["summary.parquet", "step_summary.parquet", "tree_shape.parquet"])
def test_an_older_schema_names_the_file_and_the_missing_columns(tmp_path, name):
    folder = copy_of(tmp_path)
    dropped = list(REPORT_COLUMNS[name][-2:])
    pd.read_parquet(folder / name).drop(columns=dropped).to_parquet(folder / name, index=False)
    with pytest.raises(ValueError) as error:
        check_results_folder(folder)
    assert str(error.value) == (
        f"{folder / name}: lacks the columns the report needs: {', '.join(dropped)} (an older or another "
        "schema; rerun the aggregation that wrote it, or remove it)"
    )


def test_a_broken_environment_json_is_one_line(tmp_path):
    folder = copy_of(tmp_path, "h200-sglang")
    (folder / "environment.json").write_text('{"config": ')
    with pytest.raises(ValueError, match=r"environment\.json: cannot be read as JSON \("):
        check_results_folder(folder)


def test_the_workflow_refuses_a_broken_published_file_in_the_dry_run(tmp_path):
    work = workdir_copy(tmp_path)
    folder = work / "results" / "published" / "h200"
    shutil.copytree(PUBLISHED / "h200", folder, ignore=shutil.ignore_patterns("figures", "racecheck"))
    step = pd.read_parquet(folder / "step_summary.parquet").drop(columns=["median_s"])
    step.to_parquet(folder / "step_summary.parquet", index=False)
    result = snakemake(work, "-n", "--cores", "1", "--configfile", "config/smoke.yaml", "--", "report")
    assert result.returncode == 2
    (line,) = error_lines(result.stderr)
    needs = "results/published/h200/step_summary.parquet: lacks the columns the report needs: "
    assert line.startswith(needs), line
    assert not (work / "results" / "smoke").exists()


def test_the_report_command_refuses_an_older_schema_before_writing_anything(tmp_path, capsys):
    """Before: a traceback and a half-written report folder."""
    folder = copy_of(tmp_path)
    pd.read_parquet(folder / "summary.parquet").drop(columns=["median_s"]).to_parquet(
        folder / "summary.parquet", index=False
    )
    out = tmp_path / "report"
    assert main(["report", "--results", str(folder), "-o", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"ddtree-bench: error: {folder / 'summary.parquet'}: lacks the columns the report needs: median_s "
        "(an older or another schema; rerun the aggregation that wrote it, or remove it)"
    )
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["published"]
    assert main(["budget", str(folder)]) == 2  # the budget command reads the same files
    assert "lacks the columns the report needs: median_s" in capsys.readouterr().err
