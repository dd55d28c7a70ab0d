"""Our verify attention's kernels side by side on a GPU: the plan the pipeline runs, the seesaw kernel at
64-row tiles alone, and the previous default (64-row kernel with one warpgroup's S and the other's loads,
beside the 72-row tiles), on the same inputs.

Each is checked against the float32 reference first (max abs error; requests of different prefix lengths,
padding past every request's keys filled with NaN), then timed (CUDA events queued behind a spin kernel,
warm, medians of 21). TFLOP/s count the visible keys, as the pipeline does.

    PYTHONPATH=src:tests/support python tools/attention_compare.py [BxNxS ...]

Needs an sm_90 GPU, nvcc, CuPy, PyTorch and the tests' input helpers (tests/support/gpu_inputs.py).
"""

from __future__ import annotations

import sys

import numpy as np
from gpu_inputs import topk_inputs

from ddtree_bench.builders import get_builder
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.ops.attention import (
    HEAD_DIM,
    VALUE_DIM,
    VerifyAttention,
    attention_flops,
    reference_attention,
    visible_keys,
)
from ddtree_bench.stages.attention import backend_name
from ddtree_bench.timing.gpu import EventTimer
from ddtree_bench.tree import packed_visibility

HEADS = 8
DEFAULT = [
    "1x8x32768",
    "8x8x32768",
    "64x8x32768",
    "1x64x32768",
    "8x64x32768",
    "64x64x32768",
    "8x256x32768",
    "1x1024x32768",
    "64x1024x4096",
    "8x1024x4096",
    "1x1024x4096",
    "64x256x4096",
]
VARIANTS = {
    "plan": {},
    "seesaw-64": {"wide_rows": False},
    "previous": {"seesaw": False},
}


def main(argv: list[str]) -> None:
    import cupy as cp  # noqa: PLC0415
    import torch  # noqa: PLC0415

    util = cp.RawModule(path=str(cuda.cached_fatbin(cuda.BENCH_UTIL_SOURCE)))
    timer = EventTimer(cp.cuda.get_current_stream(), util.get_function("ddtree_spin_kernel"))

    def median_us(fn, reps=21) -> float:
        for _ in range(3):
            fn()
        return float(np.median([timer(fn) * 1e6 for _ in range(reps)]))

    attention = {name: VerifyAttention(path="wgmma", **kw) for name, kw in VARIANTS.items()}
    for case in argv or DEFAULT:
        batch, budget, prefix = (int(x) for x in case.split("x"))
        logits, ids = topk_inputs("peaked", batch, 16, budget, seed=1)
        trees = get_builder("native").build(logits, ids, budget)
        bits_host = packed_visibility(trees.visibility)
        bits = torch.as_tensor(bits_host.view(np.int32), device="cuda")
        tokens = budget + 1
        # prefix lengths S, S - 13, S - 26, ... (tails of every length mod 64), NaN past each request's keys
        lengths = np.array([max(1, prefix - 13 * (b % 5)) for b in range(batch)])
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn((batch, tokens, HEADS, HEAD_DIM), generator=gen, device="cuda").to(torch.bfloat16)
        kv = torch.randn((batch, prefix + tokens + 40, HEAD_DIM), generator=gen, device="cuda").to(
            torch.bfloat16
        )
        for b in range(batch):
            kv[b, int(lengths[b]) + tokens :] = float("nan")
        out = torch.empty((batch, tokens, HEADS, VALUE_DIM), device="cuda", dtype=torch.bfloat16)
        check = range(min(batch, 3))
        ref = reference_attention(q, kv, lengths, trees.visibility, requests=check)
        flops = attention_flops(visible_keys(lengths, bits_host), HEADS)
        line = f"B={batch} N={budget} S={prefix}"
        for name, att in attention.items():
            prepared = att.prepare(q, kv, lengths, bits, out)
            out.fill_(float("nan"))
            prepared.launch()
            err = float((out[list(check)].float() - ref).abs().max())
            t = median_us(prepared.launch)
            p = prepared.plan
            line += (
                f" | {name} [{backend_name(prepared)}; {p.rows_per_block}x{p.row_tiles}, {p.splits} splits]"
                f" {t:.1f} us {flops / t / 1e6:.0f} TFLOP/s err {err:.4f}"
            )
        print(line, flush=True)
        del q, kv, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
