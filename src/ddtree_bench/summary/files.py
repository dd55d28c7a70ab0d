"""The results files the report reads, checked before anything runs: each opens, and holds the columns the
report needs (``REPORT_COLUMNS``). A truncated ``summary.parquet`` under ``results/published/``, or one of an
older schema, would otherwise be found by the last job of an hour's run (the report), or end ``ddtree-bench
report`` in a traceback. ``check_results_folder`` raises ``ValueError`` with one line naming the file and
what is wrong with it (the columns missing); the workflow runs ``check_published`` when it loads its
settings, the dry run included, and the ``report`` and ``budget`` commands check the folders they are given.
"""

from __future__ import annotations

import json
from pathlib import Path

from ddtree_bench.config import PUBLISHED_ROOT

#: The columns the report reads from each results file (each file optional; where it is there, these are in
#: it). A test checks them against what the aggregation writes, and that the report fails without each.
REPORT_COLUMNS = {
    "summary.parquet": (
        "builder",
        "distribution",
        "depth",
        "budget",
        "batch",
        "timing",
        "cache",
        "status",
        "correct",
        "n",
        "median_s",
        "p10_s",
        "p90_s",
        "median_per_tree_s",
    ),
    "tree_shape.parquet": ("distribution", "depth", "budget", "tree_nodes_mean", "expected_accept_mean"),
    "step_summary.parquet": (
        "stage",
        "impl",
        "distribution",
        "depth",
        "budget",
        "batch",
        "heads",
        "prefix",
        "timing",
        "cache",
        "status",
        "status_reason",
        "n",
        "median_s",
        "p10_s",
        "p90_s",
    ),
}


def check_parquet(path, columns=()) -> None:
    """``path`` opens as a parquet file, its ``columns`` read whole: else ``ValueError``, one line naming the
    file and the columns it lacks (or why it does not open)."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    path = Path(path)
    unreadable = (OSError, ValueError, pa.ArrowException)  # a truncated file: ArrowInvalid, no footer
    try:
        handle = pq.ParquetFile(path)
    except unreadable as error:
        why = " ".join(str(getattr(error, "strerror", None) or error).split())
        raise ValueError(f"{path}: cannot be read as a parquet file ({why})") from None
    names = set(handle.schema_arrow.names)
    missing = [column for column in columns if column not in names]
    if missing:
        raise ValueError(
            f"{path}: lacks the columns the report needs: {', '.join(missing)} (an older or another schema; "
            "rerun the aggregation that wrote it, or remove it)"
        )
    try:
        handle.read(columns=list(columns))
    except unreadable as error:
        raise ValueError(
            f"{path}: cannot be read as a parquet file ({' '.join(str(error).split())})"
        ) from None


def check_results_folder(folder) -> None:
    """Every file of ``REPORT_COLUMNS`` in ``folder`` opens with the columns the report needs, and its
    ``environment.json`` (where there is one) is a JSON object: else one line naming the file."""
    folder = Path(folder)
    for name, columns in REPORT_COLUMNS.items():
        if (folder / name).is_file():
            check_parquet(folder / name, columns)
    environment = folder / "environment.json"
    if environment.is_file():
        try:
            data = json.loads(environment.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise ValueError(
                f"{environment}: cannot be read as JSON ({' '.join(str(error).split())})"
            ) from None
        if not isinstance(data, dict):
            raise ValueError(f"{environment}: must hold a JSON object, got {type(data).__name__}")


def check_published(root=PUBLISHED_ROOT) -> None:
    """Every published folder the report reads (``<root>/<label>/`` with a ``summary.parquet``) holds files
    it can read (``check_results_folder``)."""
    for summary in sorted(Path(root).glob("*/summary.parquet")):
        check_results_folder(summary.parent)
