"""Run the GPU builder on a few inputs and compare with the reference (used under compute-sanitizer):
``python -m ddtree_bench.builders.selftest``."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from ddtree_bench import catalog
from ddtree_bench.builders import get_builder
from ddtree_bench.tree import first_difference


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddtree_bench.builders.selftest")
    parser.add_argument("--budgets", type=int, nargs="+", default=[8, 32, 256, 1024])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--depth", type=int, default=16)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    gpu, ref = get_builder(catalog.GPU_BUILDER), get_builder(catalog.ORACLE)
    failures = 0
    for budget in args.budgets:
        logits = rng.standard_normal((args.batch, args.depth, 4096))
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        order = np.argsort(-logp, axis=-1, kind="stable")[..., :budget]
        lp = np.take_along_axis(logp, order, -1).astype(np.float32)
        ids = order.astype(np.int64)
        expected = ref.build(lp, ids, budget)
        # the default path; the sequential heap; the parallel kernel writing the bool mask itself and
        # leaving it to the expansion kernel
        for force, in_build in ((False, None), (True, None), (False, True), (False, False)):
            gpu.force_heap, gpu.bool_in_build = force, in_build
            gpu.path = "parallel" if in_build is not None else None
            diff = first_difference(expected, gpu.build(lp, ids, budget))
            result = "ok" if diff is None else diff
            print(f"budget {budget} force_heap={force} bool_in_build={in_build}: {result}")
            failures += diff is not None
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
