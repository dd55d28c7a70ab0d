"""Where a verify attention call's time goes, block by block: the Hopper kernels' timeline build on a GPU.

``--build FATBIN`` (no GPU needed: nvcc, sm_90a code only) builds kernels/verify_attn with -DVX_TIMELINE:
thread 0 of every block then records %globaltimer at five points (``VX_MARK`` in the kernels: start,
prologue done, warpgroup 0's loop done, rows written, end). ``--fatbin FATBIN`` runs that build: for each
shape, the plan's grid and, on the same 64-row grid (one wave of blocks, or each ``--splits`` count, the
splits merged by the combine launch), the 64-row kernel and the seesaw kernel. Each call is timed with CUDA
events (queued behind a spin kernel, warm, medians); then one more warm call is recorded, and its blocks'
phases are printed as medians over the blocks (p90 beside the loop), with the kernel's span (first start to
last end) and what the events see beyond it (the launch and, with splits, the combine kernel). The hooks
are compiled out of every other build. Results: docs/verify_attention.md, "Where a block's time goes".

    PYTHONPATH=src:tests/support python tools/attention_timeline.py --build OUT.fatbin
    PYTHONPATH=src:tests/support python tools/attention_timeline.py --fatbin OUT.fatbin [--json OUT] \
        [--splits N ...] [BxNxS ...]

Needs an sm_90 GPU, CuPy, PyTorch and the tests' input helpers (tests/support/gpu_inputs.py) to run.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from ddtree_bench.io import write_json

MARKS = ("start", "prologue", "loop", "rows out", "end")
HEADS = 8
DEFAULT_SHAPES = ["1x8x32768", "1x16x32768", "1x32x32768", "8x8x4096", "8x32x4096"]
TIMELINE_SLOTS = 16384  # blocks vx_timeline holds (kernels/verify_attn/verify_attn_wgmma.cuh)


def phases(marks: np.ndarray) -> dict:
    """Per-block phases of one call from its ``[blocks, 5]`` %globaltimer marks (ns): medians over the
    blocks in µs (``loop_p90`` too), the kernel's span and the spread of the blocks' starts. Raises
    ValueError where a block has no marks or they run backwards (a build without the hooks, or a grid that
    did not run)."""
    marks = np.asarray(marks, dtype=np.int64)
    if marks.ndim != 2 or marks.shape[1] != len(MARKS) or not len(marks):
        raise ValueError(f"timeline: expected [blocks, {len(MARKS)}] marks, got shape {marks.shape}")
    steps = np.diff(marks, axis=1)
    if (marks == 0).any() or (steps < 0).any():
        raise ValueError(
            "timeline: a block has missing or out-of-order marks (is this the -DVX_TIMELINE build?)"
        )
    us = steps / 1e3
    return {
        "blocks": int(len(marks)),
        "span_us": float(marks[:, -1].max() - marks[:, 0].min()) / 1e3,
        "start_spread_us": float(marks[:, 0].max() - marks[:, 0].min()) / 1e3,
        "prologue_us": float(np.median(us[:, 0])),
        "loop_us": float(np.median(us[:, 1])),
        "loop_p90_us": float(np.percentile(us[:, 1], 90)),
        "rows_out_us": float(np.median(us[:, 2])),
        "merge_us": float(np.median(us[:, 3])),
        "block_us": float(np.median(marks[:, -1] - marks[:, 0]) / 1e3),
    }


def build(out: str) -> None:
    from ddtree_bench.cuda import loader as cuda  # noqa: PLC0415

    Path(out).parent.mkdir(parents=True, exist_ok=True)
    cuda.build_fatbin(
        cuda.kernel_source("verify_attn"), Path(out), ("sm_90",), ptx=False, defines=("VX_TIMELINE",)
    )
    print(out, flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--build", metavar="FATBIN", help="build the timeline fatbin here and stop")
    group.add_argument("--fatbin", help="the timeline build to run")
    parser.add_argument("--json", help="write every call's phases here")
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--splits", type=int, action="append", default=[], help="also these split counts")
    parser.add_argument("shapes", nargs="*", default=DEFAULT_SHAPES)
    args = parser.parse_args(argv)
    if args.build:
        build(args.build)
        return
    import cupy as cp  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from attention_plan_sweep import describe  # noqa: PLC0415
    from gpu_inputs import probe_call  # noqa: PLC0415

    from ddtree_bench.cuda import loader as cuda  # noqa: PLC0415
    from ddtree_bench.ops.attention import AttentionPlan, PreparedAttention, VerifyAttention  # noqa: PLC0415
    from ddtree_bench.timing.gpu import EventTimer  # noqa: PLC0415

    if not Path(args.fatbin).is_file():
        parser.error(f"--fatbin: no such file {args.fatbin!r}")
    attention = VerifyAttention(fatbin=args.fatbin, path="wgmma")
    kernels = attention.kernels
    timeline = cp.ndarray(
        (TIMELINE_SLOTS, len(MARKS)), cp.uint64, memptr=kernels.module.get_global("vx_timeline")
    )
    util = cp.RawModule(path=str(cuda.cached_fatbin(cuda.BENCH_UTIL_SOURCE)))
    timer = EventTimer(cp.cuda.get_current_stream(), util.get_function("ddtree_spin_kernel"))
    sm_count = kernels.sm_count
    print(f"{torch.cuda.get_device_name()}, {sm_count} SMs", flush=True)

    records = []
    for shape in args.shapes:
        batch, budget, prefix = (int(x) for x in shape.split("x"))
        q, kv, lengths, bits, out, _ = probe_call(batch, budget, prefix, HEADS)
        tokens = budget + 1
        prepared = attention.prepare(q, kv, lengths, bits, out)
        tiles = math.ceil((prefix + tokens) / kernels.keys_per_tile)
        row_tiles = math.ceil(tokens * HEADS / 64)
        grids = {f"plan: {describe(prepared.plan)}": prepared.plan}
        for wanted in [max(1, sm_count // (row_tiles * batch)), *args.splits]:
            per = -(-tiles // min(wanted, tiles))
            base = AttentionPlan(row_tiles, -(-tiles // per), per, 64)
            for grid in (base, replace(base, seesaw=True)):
                grids.setdefault(describe(grid), grid)
        print(
            f"B={batch} N={budget} S={prefix} ({row_tiles} row tiles of 64, {tiles} key tiles):", flush=True
        )
        for name, grid in grids.items():
            run = PreparedAttention(kernels, prepared.shape, grid, prepared.views, prepared.prefix_lengths)
            for _ in range(3):
                run.launch()
            t = float(np.median([timer(run.launch) * 1e6 for _ in range(args.reps)]))
            blocks = grid.row_tiles * grid.splits * batch
            if blocks > TIMELINE_SLOTS:
                print(f"  {name}: {blocks} blocks, more than the timeline holds; skipped", flush=True)
                continue
            timeline.fill(0)
            run.launch()
            cp.cuda.get_current_stream().synchronize()
            p = phases(timeline[:blocks].get())
            per_tile = p["loop_us"] / grid.tiles_per_split
            # the 72-row kernel marks its output staged in shared memory, then written
            third, fourth = ("stage", "rows out") if grid.rows_per_block == 72 else ("rows out", "merge")
            print(
                f"  {name}: {t:.1f} us by events | span {p['span_us']:.1f} (starts within "
                f"{p['start_spread_us']:.1f}) | prologue {p['prologue_us']:.1f} | loop {p['loop_us']:.1f} "
                f"(p90 {p['loop_p90_us']:.1f}; {per_tile:.2f} a tile) | {third} {p['rows_out_us']:.1f} | "
                f"{fourth} {p['merge_us']:.1f} | events - span {t - p['span_us']:.1f}",
                flush=True,
            )
            records.append(dict(shape=shape, grid=name, us=t, tiles_per_split=grid.tiles_per_split, **p))
        del q, kv, out, prepared
        torch.cuda.empty_cache()
    if args.json:
        write_json(records, args.json)


if __name__ == "__main__":
    main()
