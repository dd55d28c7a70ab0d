"""The seesaw verify attention as committed and with every named-barrier arrive made a full sync, for
compute-sanitizer racecheck: do its hazard reports come from the producer/consumer hand-overs
(``bar.arrive`` by one warpgroup, ``bar.sync`` by the other)?

The variant changes no memory access and no order in which the data is handed over: the producer also
waits at the barrier it arrives at (the protocol stays deadlock-free: every pair of warpgroups meets at the
same barrier in the same order). Each variant runs the same forced seesaw calls (1 to 5 and 65 key tiles a
split, prefix lengths that put the tree keys across tiles and a partial last tile).

    compute-sanitizer --tool racecheck --kernel-name kns=ddtree_verify_attn_seesaw \\
        python tools/attention_racecheck.py {committed,all-sync}

Needs an sm_90 GPU, nvcc, CuPy and PyTorch; run from the repository root with PYTHONPATH=src:tests/support.
"""

from __future__ import annotations

import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from gpu_inputs import topk_inputs

from ddtree_bench.builders import get_builder
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.ops.attention import (
    HEAD_DIM,
    VALUE_DIM,
    AttentionPlan,
    PreparedAttention,
    VerifyAttention,
    reference_attention,
)
from ddtree_bench.tree import packed_visibility

KERNELS = Path(__file__).resolve().parent.parent / "kernels" / "verify_attn"
ARRIVE = '    asm volatile("bar.arrive %0, %1;\\n" ::"r"(id), "n"(VW_THREADS) : "memory");'
SYNC = '    asm volatile("bar.sync %0, %1;\\n" ::"r"(id), "n"(VW_THREADS) : "memory");'


def fatbin(variant: str, workdir: Path) -> Path:
    kernels = workdir / "verify_attn"
    shutil.copytree(KERNELS, kernels)
    if variant == "all-sync":
        header = kernels / "verify_attn_wgmma.cuh"
        text = header.read_text()
        if text.count(ARRIVE) != 1:
            raise SystemExit("attention_racecheck: vw_bar_arrive is not the one-line bar.arrive this patches")
        header.write_text(text.replace(ARRIVE, SYNC))
    out = workdir / "verify_attn.fatbin"
    cuda.build_fatbin(kernels / "verify_attn.cu", out, ("sm_90",))
    return out


def main(variant: str) -> None:
    import torch  # noqa: PLC0415

    if variant not in ("committed", "all-sync"):
        raise SystemExit(f"attention_racecheck: variant must be committed or all-sync, got {variant!r}")
    with tempfile.TemporaryDirectory() as tmp:
        attn = VerifyAttention(fatbin=fatbin(variant, Path(tmp)), path="wgmma")
        kernels = attn.kernels
        batch, budget, heads, prefix = 5, 40, 8, [0, 61, 64, 200, 1000]
        lp, ids = topk_inputs("peaked", batch, 16, budget, seed=7)
        trees = get_builder("native").build(lp, ids, budget)
        bits = torch.as_tensor(packed_visibility(trees.visibility).view(np.int32), device="cuda")
        gen = torch.Generator(device="cuda").manual_seed(11)
        tokens = budget + 1
        q = torch.randn((batch, tokens, heads, HEAD_DIM), generator=gen, device="cuda").to(torch.bfloat16)
        kv = torch.randn((batch, max(prefix) + tokens + 7, HEAD_DIM), generator=gen, device="cuda")
        kv = kv.to(torch.bfloat16)
        for b in range(batch):
            kv[b, prefix[b] + tokens :] = float("nan")
        out = torch.empty((batch, tokens, heads, VALUE_DIM), device="cuda", dtype=torch.bfloat16)
        base = attn.prepare(q, kv, np.array(prefix), bits, out)
        ref = reference_attention(q, kv, prefix, trees.visibility)
        tiles = math.ceil((max(prefix) + tokens) / kernels.keys_per_tile)
        for per in (1, 2, 3, 4, 5, tiles):
            plan = AttentionPlan(
                row_tiles=math.ceil(tokens * heads / 64),
                splits=math.ceil(tiles / per),
                tiles_per_split=per,
                seesaw=True,
            )
            PreparedAttention(kernels, base.shape, plan, base.views, base.prefix_lengths).launch()
            torch.cuda.synchronize()
            err = float((out.float() - ref).abs().max())
            print(
                f"{variant}: {per} key tiles a split, {plan.splits} splits: max abs error {err:.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "committed")
