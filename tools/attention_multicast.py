"""Key tiles read once per request: the seesaw kernel with a request's row tiles in one cluster, each key
tile multicast to all of them, against the same kernel unclustered on the same grid, on a GPU.

For each shape and split count (64-row tiles; grids of at most one block an SM) it times, on the same inputs
and taking turns call by call (CUDA events queued behind a spin kernel, warm, medians):
- ``seesaw``: ``ddtree_verify_attn_seesaw``, each row tile reading every key tile of its split;
- ``multicast``: ``ddtree_verify_attn_seesaw_multicastN``, the N row tiles of a request and split in one
  cluster, each key tile leaving L2 once for all of them;
- the plan's grid (``AttentionKernels.plan``) and the read stream of the call's bytes.
Each output is checked against the plan's (within 2e-2), and the multicast's against the unclustered
kernel's on the same grid (the same tiles in the same order: expected equal). It also prints how many
clusters of each size fit the GPU at once (``cuOccupancyMaxActiveClusters``). Results:
docs/verify_attention.md, "Key tiles read once per request".

    PYTHONPATH=src:tests/support python tools/attention_multicast.py [--json OUT] [--few] \
        [--variant NAME=FATBIN ...] [BxNxS ...]

Each ``--variant NAME=FATBIN`` adds the multicast kernels of another build of kernels/verify_attn, on the
same grids and inputs. ``--build-ablations DIR`` (no GPU needed: nvcc) builds the two timing-only
ablations there, sm_90a only (``VS_MC_ABLATION``; their outputs may be wrong and are only reported):
``no-wait.fatbin``, the owner copies a block without waiting for the other CTAs to release it (the
handshake off the loads' path), and ``own-copies.fatbin``, the clusters launched but every CTA copying its
own tiles (no multicast, no handshake).

Needs an sm_90 GPU, CuPy, PyTorch and the tests' input helpers (tests/support/gpu_inputs.py).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
from attention_plan_sweep import DEFAULT_SHAPES, describe
from gpu_inputs import probe_call

from ddtree_bench.cuda import loader as cuda
from ddtree_bench.cuda.occupancy import max_active_clusters
from ddtree_bench.io import write_json
from ddtree_bench.ops.attention import (
    ROW_CLUSTER_SIZES,
    THREADS,
    AttentionPlan,
    PreparedAttention,
    VerifyAttention,
)
from ddtree_bench.stages.attention import stream_read_launcher
from ddtree_bench.timing.gpu import EventTimer

HEADS = 8
TOLERANCE = 2e-2
ABLATIONS = {"no-wait": 1, "own-copies": 2}


def build_ablations(folder: str) -> None:
    """The ``VS_MC_ABLATION`` builds of kernels/verify_attn (sm_90a code only) into ``folder``."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    for name, value in ABLATIONS.items():
        out = Path(folder) / f"{name}.fatbin"
        cuda.build_fatbin(
            cuda.kernel_source("verify_attn"),
            out,
            ("sm_90",),
            ptx=False,
            defines=(f"VS_MC_ABLATION={value}",),
        )
        print(out, flush=True)


def split_counts(tiles: int, most: int) -> list[int]:
    """Split counts (no split empty) from ``most`` down, about 1.4x apart, to 1."""
    counts, wanted = [], most
    while wanted >= 1:
        per = -(-tiles // wanted)
        splits = -(-tiles // per)
        if splits not in counts:
            counts.append(splits)
        wanted = min(wanted - 1, int(wanted / 1.4))
    return counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every grid's time here")
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FATBIN")
    parser.add_argument("--build-ablations", metavar="DIR", help="build the ablations here and stop")
    parser.add_argument("--few", action="store_true", help="only the most splits of one wave, and 1")
    parser.add_argument("shapes", nargs="*", default=DEFAULT_SHAPES)
    args = parser.parse_args(argv)
    if args.build_ablations:
        build_ablations(args.build_ablations)
        return
    import cupy as cp  # noqa: PLC0415
    import torch  # noqa: PLC0415

    variants = {}
    for spec in args.variant:
        name, sep, path = spec.partition("=")
        if not sep or not name or not Path(path).is_file():
            parser.error(f"--variant wants NAME=FATBIN with an existing file, got {spec!r}")
        variants[name] = VerifyAttention(fatbin=path, path="wgmma").kernels

    util = cp.RawModule(path=str(cuda.cached_fatbin(cuda.BENCH_UTIL_SOURCE)))
    spin, stream_read = util.get_function("ddtree_spin_kernel"), util.get_function("ddtree_stream_read")
    sm_count = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    timer = EventTimer(cp.cuda.get_current_stream(), spin)
    attention = VerifyAttention(path="wgmma")
    kernels = attention.kernels
    resident = {
        size: max_active_clusters(
            kernels.attn_seesaw_multicast[size], size, THREADS, kernels.seesaw_smem_bytes
        )
        for size in ROW_CLUSTER_SIZES
    }
    print(f"{torch.cuda.get_device_name()}, {sm_count} SMs", flush=True)
    for size, clusters in resident.items():
        print(f"  clusters of {size}: {clusters} resident at once ({clusters * size} blocks)", flush=True)

    records = []
    for shape in args.shapes:
        batch, budget, prefix = (int(x) for x in shape.split("x"))
        q, kv, lengths, bits, out, nbytes = probe_call(batch, budget, prefix, HEADS)
        tokens = budget + 1
        row_tiles = math.ceil(tokens * HEADS / 64)
        if row_tiles not in ROW_CLUSTER_SIZES:
            print(f"{shape}: {row_tiles} row tiles, no cluster of that size; skipped", flush=True)
            continue
        prepared = attention.prepare(q, kv, lengths, bits, out)
        prepared.launch()
        expected = out.float().clone()
        tiles = math.ceil((prefix + tokens) / kernels.keys_per_tile)
        most = min(sm_count, resident[row_tiles] * row_tiles) // (row_tiles * batch)
        calls = {"read stream": stream_read_launcher(stream_read, sm_count, nbytes)[0]}
        calls[f"plan: {describe(prepared.plan)}"] = prepared.launch
        checks = {}
        counts = split_counts(tiles, max(1, most))
        for splits in [counts[0], 1] if args.few and len(counts) > 1 else counts:
            per = -(-tiles // splits)
            base = AttentionPlan(row_tiles, splits, per, seesaw=True)
            outputs = {}
            clustered = replace(base, row_cluster=row_tiles)
            runs = [("seesaw", kernels, base), ("multicast", kernels, clustered)]
            runs += [(f"multicast[{name}]", k, clustered) for name, k in variants.items()]
            for name, owner, plan in runs:
                run = PreparedAttention(owner, prepared.shape, plan, prepared.views, prepared.prefix_lengths)
                out.fill_(float("nan"))
                run.launch()
                outputs[name] = out.float().clone()
                calls[f"{name}: {describe(plan)}"] = run.launch
                checks[f"{name}: {describe(plan)}"] = float((outputs[name] - expected).abs().max())
            key = f"multicast: {describe(clustered)}"  # and against the unclustered kernel's
            checks[key] = max(checks[key], float((outputs["multicast"] - outputs["seesaw"]).abs().max()))
        for fn in calls.values():
            for _ in range(3):
                fn()
        samples = {name: [] for name in calls}
        for _ in range(args.reps):  # taking turns: clock drift is shared alike
            for name, fn in calls.items():
                samples[name].append(timer(fn) * 1e6)
        stream_us = float(np.median(samples["read stream"]))
        print(f"B={batch} N={budget} S={prefix} ({row_tiles} row tiles, {tiles} key tiles):", flush=True)
        for name, times in samples.items():
            us = float(np.median(times))
            error = checks.get(name)
            flag = "" if error is None or error <= TOLERANCE else "  OUTPUT OFF"
            print(
                f"  {name:60s} {us:8.1f} us  p10 {np.percentile(times, 10):7.1f}  p90 "
                f"{np.percentile(times, 90):7.1f}  {us / stream_us:5.2f}x stream"
                + (f"  max abs {error:.2e}" if error is not None else "")
                + flag,
                flush=True,
            )
            records.append(
                dict(
                    shape=shape,
                    grid=name,
                    us=us,
                    p10=float(np.percentile(times, 10)),
                    p90=float(np.percentile(times, 90)),
                    max_abs_vs_plan=error,
                )
            )
        del q, kv, out, prepared
        torch.cuda.empty_cache()
    if args.json:
        write_json(dict(resident_clusters=resident, records=records), args.json)


if __name__ == "__main__":
    main()
