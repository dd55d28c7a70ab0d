"""The seesaw verify attention as committed and with every named-barrier arrive made a full sync, for
compute-sanitizer racecheck: do its hazard reports come from the producer/consumer hand-overs
(``bar.arrive`` by one warpgroup, ``bar.sync`` by the other), or from the warpgroup-only barrier of the tail
zeroing, or from the in-kernel split merge?

The variant changes no memory access and no order in which the data is handed over: the producer also
waits at the barrier it arrives at (the protocol stays deadlock-free: every pair of warpgroups meets at the
same barrier in the same order). Inputs:
- ``ragged``: 5 requests whose key counts are not multiples of 64 (each last tile is zeroed past the keys,
  behind a barrier of the warpgroup's own threads); 1-5 and all key tiles a split;
- ``aligned``: the same with key counts that are multiples of 64 (no tail zeroing, no such barrier);
- ``merged``: 1 request, 1 and 2 key tiles a split, the splits merged in the kernel (``va_merge_splits``);
- ``skipped``: budget 700 (the others' is 40), 3 requests, uniform trees: 64-row blocks that skip the tree
  tiles none of their rows sees (the prologue's bitmap and table), splits of only skipped tiles among them.

    compute-sanitizer --tool racecheck --kernel-name kns=ddtree_verify_attn_seesaw \\
        python tools/attention_racecheck.py {committed,all-sync} {ragged,aligned,merged,skipped}

Needs an sm_90 GPU, nvcc, CuPy and PyTorch; run from the repository root with PYTHONPATH=src:tests/support.
The fatbins are built once into the project's build cache and reused while the sources are unchanged.
"""

from __future__ import annotations

import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from gpu_inputs import random_case, topk_inputs

from ddtree_bench.builders import get_builder
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.ops.attention import (
    AttentionPlan,
    PreparedAttention,
    VerifyAttention,
    reference_attention,
)
from ddtree_bench.tree import packed_visibility

KERNELS = Path(__file__).resolve().parent.parent / "kernels" / "verify_attn"
ARRIVE = '    asm volatile("bar.arrive %0, %1;\\n" ::"r"(id), "n"(VW_THREADS) : "memory");'
SYNC = '    asm volatile("bar.sync %0, %1;\\n" ::"r"(id), "n"(VW_THREADS) : "memory");'


def fatbin(variant: str) -> Path:
    """The attention fatbin of a variant, in the project's build cache (keyed by the sources' content)."""
    with tempfile.TemporaryDirectory() as tmp:
        kernels = Path(tmp) / "verify_attn"
        shutil.copytree(KERNELS, kernels)
        if variant == "all-sync":
            header = kernels / "verify_attn_wgmma.cuh"
            text = header.read_text()
            if text.count(ARRIVE) != 1:
                raise SystemExit("attention_racecheck: vw_bar_arrive is not the one-line bar.arrive patched")
            header.write_text(text.replace(ARRIVE, SYNC))
        return cuda.cached_fatbin(kernels / "verify_attn.cu", ("sm_90",))


#: inputs: prefix lengths of the requests, key tiles a split, merged in the kernel, budget, trees
INPUTS = {
    "ragged": ([0, 61, 64, 200, 1000], (1, 2, 3, 4, 5, None), False, 40, "peaked"),
    "aligned": ([23, 87, 151, 215, 1047], (1, 2, 3, 4, 5, None), False, 40, "peaked"),
    "merged": ([1047], (1, 2), True, 40, "peaked"),
    "skipped": ([0, 61, 300], (1, 3, None), False, 700, "uniform"),
}


def main(variant: str, inputs: str) -> None:
    import torch  # noqa: PLC0415

    if variant not in ("committed", "all-sync"):
        raise SystemExit(f"attention_racecheck: variant must be committed or all-sync, got {variant!r}")
    if inputs not in INPUTS:
        raise SystemExit(f"attention_racecheck: inputs must be one of {sorted(INPUTS)}, got {inputs!r}")
    prefix, per_split, merged, budget, kind = INPUTS[inputs]
    attn = VerifyAttention(fatbin=fatbin(variant), path="wgmma")
    kernels = attn.kernels
    batch, heads = len(prefix), 8
    lp, ids = topk_inputs(kind, batch, 16, budget, seed=7)
    trees = get_builder("native").build(lp, ids, budget)
    bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
    tokens = budget + 1
    q, kv, out = random_case(trees, heads, prefix, seed=11)
    base = attn.prepare(q, kv, np.array(prefix), bits, out)
    ref = reference_attention(q, kv, prefix, trees.visibility)
    tiles = math.ceil((max(prefix) + tokens) / kernels.keys_per_tile)
    for per in per_split:
        per = per or tiles
        plan = AttentionPlan(
            row_tiles=math.ceil(tokens * heads / 64),
            splits=math.ceil(tiles / per),
            tiles_per_split=per,
            seesaw=True,
            merged_in_kernel=merged,
        )
        PreparedAttention(kernels, base.shape, plan, base.views, base.prefix_lengths).launch()
        torch.cuda.synchronize()
        err = float((out.float() - ref).abs().max())
        print(
            f"{variant} {inputs}: {per} key tiles a split, {plan.splits} splits: max abs error {err:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main(*(sys.argv[1:3] + ["committed", "ragged"][len(sys.argv[1:3]) :]))
