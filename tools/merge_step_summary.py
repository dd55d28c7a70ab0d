"""Merge a later run's step files into a published step summary (their rows replace the same
configurations'; percentages of peak from the summary's own peaks where the new rows measured none).

    python tools/merge_step_summary.py results/published/h200/step_summary.parquet \
        results/h200/step/*/*.parquet
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddtree_bench.summary.step import merge_step_summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary", type=Path, help="the step_summary.parquet to update")
    parser.add_argument("files", nargs="+", type=Path, help="step stage files (parquet) of the later run")
    args = parser.parse_args(argv)
    for path in [args.summary, *args.files]:
        if not path.is_file():
            print(f"merge_step_summary: {path}: no such file", file=sys.stderr)
            return 2
    before = len(__import__("pandas").read_parquet(args.summary))
    merged = merge_step_summary(args.summary, args.files)
    print(f"{args.summary}: {before} rows before, {len(merged)} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
