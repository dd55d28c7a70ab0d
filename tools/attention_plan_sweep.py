"""Every grid the verify attention kernels can run a shape with, timed against the plan's on a GPU.

Is the loop's structure what keeps batch 1 and 8 from the memory limit, or only the plan's choice of tiles
and splits (``AttentionKernels.plan``, fitted on an H200)? For each shape this times the plan's grid and
every other grid the kernels run: 64- and 72-row tiles, the split counts that keep at most two waves of
blocks, the 72-row kernel's clusters of 2 splits and the merge in the kernel where every block is resident,
on the same inputs (CUDA events queued behind a spin kernel, warm, medians). Each grid's output is checked
against the plan's (within 2e-2; the plan's against float32 in tests/ops/test_attention.py). Results:
docs/verify_attention.md, "At the memory limit".

    PYTHONPATH=src:tests/support python tools/attention_plan_sweep.py [--json OUT] [BxNxS ...]

Default shapes: the memory-limit goals' (batch 1 at S = 32768 and batch 8 at S = 4096 and 32768, N = 8, 16,
32; batch 64 at N = 16, S = 4096). Needs an sm_90 GPU, CuPy, PyTorch and the tests' input helpers
(tests/support/gpu_inputs.py).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import numpy as np
from gpu_inputs import probe_call

from ddtree_bench.cuda import loader as cuda
from ddtree_bench.io import write_json
from ddtree_bench.ops.attention import (
    WIDE_ROWS_PER_BLOCK,
    AttentionPlan,
    PreparedAttention,
    VerifyAttention,
)
from ddtree_bench.stages.attention import stream_read_launcher
from ddtree_bench.timing.gpu import EventTimer

HEADS = 8
DEFAULT_SHAPES = (
    [f"1x{n}x32768" for n in (8, 16, 32)]
    + [f"8x{n}x{s}" for s in (4096, 32768) for n in (8, 16, 32)]
    + ["64x16x4096"]
)
TOLERANCE = 2e-2


def describe(plan: AttentionPlan) -> str:
    kind = "seesaw" if plan.seesaw else f"{plan.rows_per_block}-row"
    text = f"{kind}, {plan.row_tiles} x {plan.splits} splits of {plan.tiles_per_split} tiles"
    if plan.row_cluster > 1:
        text += f", key tiles multicast to the {plan.row_cluster} row tiles"
    if plan.cluster > 1:
        text += f", clusters of {plan.cluster}"
    if plan.merged_in_kernel:
        text += ", merged in the kernel"
    elif plan.partials > 1:
        text += ", combine launch"
    return text


def grid_fields(plan: AttentionPlan, batch: int, tiles: int) -> dict:
    """The grid's shape as numbers, for fits over the records: blocks, and the key tiles of the longest
    block against the shape's key tiles spread evenly over the blocks."""
    blocks = plan.row_tiles * plan.splits * batch
    return dict(
        rows_per_block=plan.rows_per_block,
        row_tiles=plan.row_tiles,
        splits=plan.splits,
        tiles_per_split=plan.tiles_per_split,
        cluster=plan.cluster,
        merged_in_kernel=plan.merged_in_kernel,
        blocks=blocks,
        tile_units=plan.row_tiles * batch * tiles,
    )


def candidates(
    rows: int, tiles: int, batch: int, sm_count: int, wide: bool, include: tuple[int, ...] = ()
) -> list[AttentionPlan]:
    """The grids of at most two waves of blocks, no split empty, for both tile heights: every split count up
    to 16, then about 12 % apart, and the counts in ``include`` (the plan's)."""
    counts = set(range(1, 17)) | set(include)
    while max(counts) < tiles:
        counts.add(math.ceil(max(counts) * 1.12))
    plans = []
    for rows_per_block in (64, WIDE_ROWS_PER_BLOCK) if wide else (64,):
        row_tiles = -(-rows // rows_per_block)
        seen = set()
        for wanted in sorted(c for c in counts if c <= tiles):
            per = -(-tiles // wanted)
            splits = -(-tiles // per)  # no empty split
            if (splits, per) in seen or row_tiles * splits * batch > 2 * sm_count:
                continue
            seen.add((splits, per))
            base = AttentionPlan(row_tiles, splits, per, rows_per_block)
            plans.append(base)
            resident = row_tiles * splits * batch <= sm_count
            if splits > 1 and resident:
                plans.append(replace(base, merged_in_kernel=True))
            if rows_per_block == WIDE_ROWS_PER_BLOCK and splits % 2 == 0:
                plans.append(replace(base, cluster=2))
    return plans


def main(argv=None) -> None:
    import cupy as cp  # noqa: PLC0415
    import torch  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every grid's time here")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("shapes", nargs="*", default=DEFAULT_SHAPES)
    args = parser.parse_args(argv)

    util = cp.RawModule(path=str(cuda.cached_fatbin(cuda.BENCH_UTIL_SOURCE)))
    spin, stream_read = util.get_function("ddtree_spin_kernel"), util.get_function("ddtree_stream_read")
    sm_count = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    timer = EventTimer(cp.cuda.get_current_stream(), spin)

    def median_us(fn) -> float:
        for _ in range(3):
            fn()
        return float(np.median([timer(fn) * 1e6 for _ in range(args.reps)]))

    attention = VerifyAttention(path="wgmma")
    kernels = attention.kernels
    wide = kernels.attn_wide is not None
    print(f"{torch.cuda.get_device_name()}, {sm_count} SMs; 72-row kernel loaded: {wide}", flush=True)
    records = []
    for shape in args.shapes:
        batch, budget, prefix = (int(x) for x in shape.split("x"))
        q, kv, lengths, bits, out, nbytes = probe_call(batch, budget, prefix, HEADS)
        tokens = budget + 1
        t_stream = median_us(stream_read_launcher(stream_read, sm_count, nbytes)[0])
        prepared = attention.prepare(q, kv, lengths, bits, out)
        plan = prepared.plan
        t_plan = median_us(prepared.launch)
        expected = out.float().clone()
        tiles = math.ceil((prefix + tokens) / kernels.keys_per_tile)
        timed = []
        for cand in candidates(tokens * HEADS, tiles, batch, sm_count, wide, include=(plan.splits,)):
            try:
                run = PreparedAttention(
                    kernels, prepared.shape, cand, prepared.views, prepared.prefix_lengths
                )
            except ValueError as error:
                print(f"  skip {describe(cand)}: {error}", flush=True)
                continue
            out.zero_()
            try:
                run.launch()
            except Exception as error:  # noqa: BLE001 - a grid this GPU or build cannot launch
                print(f"  skip {describe(cand)}: {error}", flush=True)
                continue
            error = float((out.float() - expected).abs().max())
            t = median_us(run.launch)
            timed.append((t, cand, error))
            records.append(
                dict(
                    shape=shape,
                    grid=describe(cand),
                    us=t,
                    max_abs_vs_plan=error,
                    plan=cand == plan,
                    **grid_fields(cand, batch, tiles),
                )
            )
        ok = [(t, c, e) for t, c, e in timed if e <= TOLERANCE]
        best_t, best, _ = min(ok, key=lambda x: x[0])
        wrong = [describe(c) for t, c, e in timed if e > TOLERANCE]
        print(
            f"B={batch} N={budget} S={prefix}: read stream {t_stream:.1f} us | plan [{describe(plan)}] "
            f"{t_plan:.1f} us | best of {len(ok)} grids [{describe(best)}] {best_t:.1f} us "
            f"({t_plan / best_t:.2f}x the plan, {best_t / t_stream:.2f}x the stream)"
            + (f" | outputs off: {wrong}" if wrong else ""),
            flush=True,
        )
        records.append(dict(shape=shape, grid="read stream", us=t_stream, max_abs_vs_plan=None, plan=False))
        records.append(
            dict(
                shape=shape,
                grid=f"plan: {describe(plan)}",
                us=t_plan,
                max_abs_vs_plan=0.0,
                plan=True,
                **grid_fields(plan, batch, tiles),
            )
        )
        del q, kv, out, prepared
        torch.cuda.empty_cache()
    if args.json:
        write_json(records, args.json)


if __name__ == "__main__":
    main()
