"""ddtree-bench: reference benchmark for DDTree draft-tree construction (CPU vs GPU)."""

from ddtree_bench.tree import TreeBatch

__all__ = ["TreeBatch"]
__version__ = "0.1.0"
