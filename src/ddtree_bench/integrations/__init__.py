"""Bridges from live serving systems to this benchmark (``ddtree_bench.integrations.sglang``)."""
