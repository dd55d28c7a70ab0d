"""Snakemake's logger plugin ``ddtree`` (``snakemake --logger ddtree``): a run's progress in compact lines,
errors in full. The handler is ``ddtree_bench.progress``'s; Snakemake finds plugins by this module's name."""

from ddtree_bench.progress import CompactLogHandler as LogHandler

__all__ = ["LogHandler"]
