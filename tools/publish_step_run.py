"""Publish a run of the step stages alone (the round's stacks and chains, verify attention) as a folder of
``results/published/``: its ``step_summary.parquet`` (``summary.step.aggregate_steps`` of the step files)
and its ``environment.json`` (the machine and library columns of its rows, and the configuration it ran).
The report takes such a folder with ``--published`` beside the tree-build publications.

    python tools/publish_step_run.py --config config/h200.yaml --config config/stacks.yaml \\
        --config MACHINE.yaml results/h100/step/*/*.parquet -o results/published/h100
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from ddtree_bench.environment import ENVIRONMENT_COLUMNS
from ddtree_bench.io import write_json
from ddtree_bench.settings import load_settings
from ddtree_bench.summary.step import aggregate_steps, read_stage_rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, action="append", required=True, help="repeat to merge")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("files", type=Path, nargs="+", help="the run's step files (parquet)")
    args = parser.parse_args(argv)
    try:
        missing = [str(f) for f in args.files if not f.is_file()]
        if missing:
            raise ValueError(f"no such step file: {missing[0]}")
        settings = load_settings(*args.config)
        rows = read_stage_rows(args.files)
        if rows.empty:
            raise ValueError("the step files hold no rows")
        args.output.mkdir(parents=True, exist_ok=True)
        aggregate_steps(args.files, args.output / "step_summary.parquet")
        write_json(environment(rows, settings), args.output / "environment.json")
    except ValueError as error:
        print(f"publish_step_run: {error}", file=sys.stderr)
        return 2
    print(f"published {len(rows)} rows to {args.output}")
    return 0


def environment(rows: pd.DataFrame, settings) -> dict:
    """The machine's columns of the rows (the newest row's), their commits, and the configuration."""
    newest = rows.sort_values("timestamp").iloc[-1]
    env = {key: (None if pd.isna(newest.get(key)) else newest.get(key)) for key in ENVIRONMENT_COLUMNS}
    env["git_commits"] = sorted(str(c) for c in rows["git_commit"].dropna().unique())
    env["config"] = settings.recorded()
    return {key: (value.item() if hasattr(value, "item") else value) for key, value in env.items()}


if __name__ == "__main__":
    sys.exit(main())
