"""Rows to summaries (parquet): the tree build and tree shapes (``build``), the step stages (``step``)."""
