"""Timing-only ablations of the 72-row verify attention kernel (kernels/verify_attn/verify_attn_wgmma72.cuh)
on a GPU.

Which part bounds the memory-bound loop: each variant is a text patch of a copy of kernels/ (outputs
wrong, never used), built for sm_90a and timed beside the unpatched kernel and the read stream of the
call's bytes, on the same inputs (CUDA events queued behind a spin kernel, warm, medians). Results:
docs/verify_attention.md, "What bounds the loop".

    PYTHONPATH=src:tests/support python tools/attention_ablation.py [BxNxS[:forced_splits] ...]

Default shapes: 8x8x32768 64x8x32768 1x8x32768:16 8x8x32768:8 8x64x32768. Needs an sm_90 GPU, nvcc, CuPy,
PyTorch and the tests' input helpers (tests/support/gpu_inputs.py).
"""

from __future__ import annotations

import math
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from gpu_inputs import probe_call

from ddtree_bench.cuda import loader as cuda
from ddtree_bench.ops.attention import (
    PreparedAttention,
    VerifyAttention,
)
from ddtree_bench.stages.attention import stream_read_launcher
from ddtree_bench.timing.gpu import EventTimer

KERNELS = Path(__file__).resolve().parent.parent / "kernels" / "verify_attn"
WIDE = "verify_attn_wgmma72.cuh"
HEADS = 8
# warpgroup 1's key loads in the loop (tile i + 1)
LOOP_LOADS = (
    "                if (i > 0)\n"
    "                    vw_load_key_tile<128>(latent, srope, kv_b, key0, kv_len, wtid);\n"
    "                else\n"
    "                    vw_load_key_tile<128, false, true>(latent, srope, kv_b, key0, kv_len, wtid);\n"
)
QK_LATENT = "    for (int step = 0; step < 32; ++step)\n        wgmma_m64n72k16_ss<0>(s, wgmma_desc(nope_addr"
PV_STEPS = (
    "    for (int kk = 0; kk < VW_BN / 16; ++kk)\n#pragma unroll\n        for (int blk = 0; blk < NB; ++blk)"
)


def patch(text: str, no_loads=False, half_loads=False, light_mma=False) -> str:
    """The kernel's source with the loop's loads removed or halved, or about a fifth of its MMAs kept."""
    for part in (LOOP_LOADS, QK_LATENT, PV_STEPS):
        if part not in text:
            first = part.splitlines()[0]
            raise ValueError(f"{WIDE} changed: the ablation patch no longer applies ({first!r})")
    if no_loads:
        text = text.replace(LOOP_LOADS, "                (void)latent; (void)key0;\n")
    if half_loads:  # keys 0..31 of each tile only
        text = text.replace(LOOP_LOADS, LOOP_LOADS.replace("kv_len, wtid", "min(kv_len, key0 + 32), wtid"))
    if light_mma:  # S^T: the 4 rope and 4 of 32 latent k-steps; P V: one of four
        text = text.replace(QK_LATENT, QK_LATENT.replace("step < 32", "step < 4"))
        text = text.replace(PV_STEPS, PV_STEPS.replace("kk < VW_BN / 16", "kk < 1"))
    return text


VARIANTS = {
    "kernel": {},
    "no loads": {"no_loads": True},
    "half loads": {"half_loads": True},
    "light MMA": {"light_mma": True},
    "neither": {"no_loads": True, "light_mma": True},
}


def build(workdir: Path) -> dict[str, Path]:
    """A fatbin of every variant under ``workdir``."""
    fatbins = {}
    for i, (name, kw) in enumerate(VARIANTS.items()):
        kernels = workdir / f"v{i}" / "verify_attn"
        shutil.copytree(KERNELS, kernels)
        (kernels / WIDE).write_text(patch((KERNELS / WIDE).read_text(), **kw))
        fatbins[name] = kernels.parent / "verify_attn.fatbin"
        cuda.build_fatbin(kernels / "verify_attn.cu", fatbins[name], ("sm_90",))
    return fatbins


def main(argv: list[str]) -> None:
    import cupy as cp  # noqa: PLC0415
    import torch  # noqa: PLC0415

    cases = argv or ["8x8x32768", "64x8x32768", "1x8x32768:16", "8x8x32768:8", "8x64x32768"]
    util = cp.RawModule(path=str(cuda.cached_fatbin(cuda.BENCH_UTIL_SOURCE)))
    spin, stream_read = util.get_function("ddtree_spin_kernel"), util.get_function("ddtree_stream_read")
    sm_count = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    timer = EventTimer(cp.cuda.get_current_stream(), spin)

    def median_us(fn, reps=21) -> float:
        for _ in range(3):
            fn()
        return float(np.median([timer(fn) * 1e6 for _ in range(reps)]))

    with tempfile.TemporaryDirectory() as tmp:
        attention = {name: VerifyAttention(fatbin=fb, path="wgmma") for name, fb in build(Path(tmp)).items()}
        for case in cases:
            shape, _, forced = case.partition(":")
            batch, budget, prefix = (int(x) for x in shape.split("x"))
            q, kv, lengths, bits, out, nbytes = probe_call(batch, budget, prefix, HEADS)
            tokens = budget + 1
            t_stream = median_us(stream_read_launcher(stream_read, sm_count, nbytes)[0])
            line = f"B={batch} N={budget} S={prefix}"
            for name, att in attention.items():
                prepared = att.prepare(q, kv, lengths, bits, out)
                if forced:
                    splits, tiles = int(forced), math.ceil((prefix + tokens) / 64)
                    plan = replace(
                        prepared.plan,
                        rows_per_block=72,
                        row_tiles=math.ceil(tokens * HEADS / 72),
                        splits=splits,
                        tiles_per_split=math.ceil(tiles / splits),
                        cluster=1,
                        merged_in_kernel=False,
                    )
                    prepared = PreparedAttention(
                        att.kernels, prepared.shape, plan, prepared.views, prepared.prefix_lengths
                    )
                if name == "kernel":
                    p = prepared.plan
                    line += (
                        f" [{p.rows_per_block}-row, {p.row_tiles} x {p.splits} splits"
                        f" x {p.tiles_per_split} tiles, cluster {p.cluster}]"
                        f" read stream {t_stream:.1f} us ({nbytes / t_stream / 1e6:.2f} TB/s)"
                    )
                t = median_us(prepared.launch)
                line += f" | {name} {t:.1f} us ({nbytes / t / 1e6:.2f} TB/s)"
            print(line, flush=True)
            del q, kv, out
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
