"""Timing tree-verify attention (one layer): our kernel and its PyTorch peers on the same inputs.

For one grid point (trace, budget N, batch B, heads H, prefix length S):

- The trees are the native builder's (equal to the reference's) for the trace's first ``B`` requests at
  budget ``N`` (K = min(N, the trace's columns)); their packed-bit visibility is our kernel's mask and their
  bool visibility the peers' mask. Every request has the same prefix length ``S``.
- ``q [B, N+1, H, 576]`` and the latent cache ``kv [B, S+N+1, 576]`` are standard-normal bf16 (seeded); the
  values do not change the work, the tree does.
- Each implementation (``ours``, ``ours-mma``, ``flexattention``, ``sdpa``, ``flashmla``, ``sglang-triton``,
  ``sglang-fa3``) is set up untimed (allocation, masks, compilation, one call), checked against the float32
  reference with the mask it applies on the first and the last request (max abs error, ``correct`` when below
  ``TOLERANCE``; every impl applies the tree mask except FlashMLA, which has none and runs causal: its
  reference is causal attention over the same keys, ``ops.attention_peers.check_visibility``), then timed:
  CUDA events around one call queued behind a spin kernel (so the host's launch cost is hidden, as for the
  tree build), ``warm`` samples back to back and ``cold`` samples after an L2 flush. An implementation that
  cannot run a shape (missing, an optional extra that does not import, unsupported head dims, out of
  memory) gives one ``unavailable`` row with the reason, never a number.
- FLOPs and bytes per call (``ops.attention.attention_flops`` / ``attention_bytes``) go on every row, so
  TFLOP/s and TB/s follow from ``seconds``.
- ``read-stream`` is no attention: ``ddtree_stream_read`` (``kernels/bench_util/bench_util.cu``) reads a
  buffer of the call's bytes once, timed the same way. It is the shape's bandwidth bound as measured in the
  same run -- what any kernel that must move these bytes needs at least, launch and ramp included (warm: as
  much of them as L2 holds is read from L2, as for the other impls' warm samples). Its rows carry the bytes,
  no FLOPs and no correctness.
- Every row records the mask its impl applies (``mask``: "tree", or "causal (no tree mask)" for FlashMLA;
  null for the read stream). FLOPs are the tree's (the problem's work) for every impl, FlashMLA included.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ddtree_bench.builders import get_builder
from ddtree_bench.catalog import ATTENTION_IMPLS, STREAM_IMPL
from ddtree_bench.environment import ENVIRONMENT_COLUMNS, collect_environment
from ddtree_bench.ops.attention import (
    HEAD_DIM,
    SMALL_KEYS_PER_TILE,
    SMALL_ROWS_PER_BLOCK,
    VALUE_DIM,
    WIDE_ROWS_PER_BLOCK,
    AttentionUnavailable,
    VerifyAttention,
    attention_bytes,
    attention_flops,
    reference_attention,
    visible_keys,
)
from ddtree_bench.ops.attention_peers import PEER_MASKS, TREE_MASK, check_visibility, find_sglang_kernel
from ddtree_bench.stages.build import read_batch
from ddtree_bench.timing.gpu import SPIN_NS, EventTimer
from ddtree_bench.timing.policy import TimingPolicy
from ddtree_bench.timing.records import stage_frame
from ddtree_bench.traces import row_sha256
from ddtree_bench.tree import packed_visibility

IMPLS = ATTENTION_IMPLS  # ours, ours-mma, the peers (ops.attention_peers), read-stream
# ddtree_stream_read's launch: 2 blocks of 1024 threads per SM (4 words of 16 bytes in flight a thread) was
# the fastest or within 3 % of it over 2-8 blocks per SM, 256-1024 threads and 2-8 words a thread, for 5 MB
# to 2.4 GB on the H200 (scratch probe, 2026-12-01)
STREAM_THREADS, STREAM_BLOCKS_PER_SM = 1024, 2
STREAM_NEVER = 0x9E3779B9  # the kernel stores its fold only if it equals this; a buffer of ones folds to 0
# our kernel's paths: "ours" is what VerifyAttention picks (wgmma on sm_90a, else mma.sync); "ours-mma" forces
# the mma.sync kernel, to set the two side by side on a Hopper GPU
OUR_PATHS = {"ours": "auto", "ours-mma": "mma"}
TOLERANCE = 2e-2  # max abs error against float32 on outputs of unit-variance inputs (bf16 output rounding)
ATTENTION_SPIN_NS = 2 * SPIN_NS  # the peers' (PyTorch) calls take longer to queue than a raw launch


def _check_args(budget, batch, heads, prefix, impls):
    for name, value, minimum in (
        ("budget", budget, 1),
        ("batch", batch, 1),
        ("heads", heads, 1),
        ("prefix", prefix, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
            raise ValueError(
                f"verify attention benchmark: {name} must be an integer >= {minimum}, got {value!r}"
            )
    unknown = [impl for impl in impls if impl not in IMPLS]
    if unknown or not impls:
        raise ValueError(
            f"verify attention benchmark: impls must be a non-empty subset of {list(IMPLS)}, "
            f"got {list(impls)}"
        )


def backend_name(prepared) -> str:
    """How our kernel ran a call: its path, the 72-row tiles where the plan took that kernel (else, on the
    wgmma path, "seesaw" for the 64-row seesaw kernel), the clusters
    whose splits were merged on chip, and the splits merged in the kernel (no combine launch)."""
    plan = prepared.plan
    name = f"{prepared.kernels.path} path"
    if plan.rows_per_block == WIDE_ROWS_PER_BLOCK:
        name += f", {WIDE_ROWS_PER_BLOCK}-row tiles"
    elif plan.rows_per_block == SMALL_ROWS_PER_BLOCK:
        name += f", {SMALL_ROWS_PER_BLOCK}-row tiles of {SMALL_KEYS_PER_TILE} keys"
    elif plan.seesaw:
        name += ", seesaw"
    if plan.cluster > 1:
        name += f", clusters of {plan.cluster} splits"
    if plan.merged_in_kernel:
        name += f", {plan.splits} splits merged in the kernel"
    return name


def run_attention_benchmark(
    trace_path,
    budget,
    batch,
    *,
    heads,
    prefix,
    impls=IMPLS,
    flex_kernel_options: dict | None = None,
    sglang_source=None,
    timing: dict,
    machine: str | None,
    distribution: str | None,
    attention_fatbin=None,
    util_fatbin=None,
    seed: int = 0,
) -> pd.DataFrame:
    impls = list(impls)
    _check_args(budget, batch, heads, prefix, impls)
    budget, batch, heads, prefix = int(budget), int(batch), int(heads), int(prefix)
    if sglang_source is not None and "sglang-triton" in impls:
        find_sglang_kernel(sglang_source)  # a path given without SGLang's file: ValueError, nothing measured
    policy = TimingPolicy(**timing)
    lp, ids, columns, metadata = read_batch(trace_path, batch)
    topk = min(budget, columns)
    env = collect_environment(machine)
    base = {
        "stage": "verify-attention",
        "batch": batch,
        "budget": budget,
        "heads": heads,
        "prefix": prefix,
        "depth": int(lp.shape[1]),
        "distribution": distribution or metadata.get("distribution"),
        "trace_sha256": row_sha256(trace_path, metadata),
        **{key: env.get(key) for key in ENVIRONMENT_COLUMNS},
    }

    trees = get_builder("native").build(
        np.ascontiguousarray(lp[..., :topk]), np.ascontiguousarray(ids[..., :topk]), budget
    )
    bits_host = packed_visibility(trees.visibility)
    lengths = np.full(batch, prefix, np.int64)
    work = {
        "flops": attention_flops(visible_keys(lengths, bits_host), heads),
        "bytes": attention_bytes(lengths, budget + 1, heads, bits_host.shape[-1]),
    }

    def mask_of(impl):
        """The mask an impl applies, as its rows record it (None for the read stream)."""
        return None if impl == STREAM_IMPL else PEER_MASKS.get(impl, TREE_MASK)

    def unavailable(impl, reason, status="unavailable"):
        return {
            **base,
            **work,
            "impl": impl,
            "mask": mask_of(impl),
            "phase": "timed",
            "repetition": 0,
            "timing": "cuda-events",
            "cache": "n/a",
            "status": status,
            "status_reason": " ".join(str(reason).split()),
        }

    ours = {impl: VerifyAttention(attention_fatbin, path=path) for impl, path in OUR_PATHS.items()}
    reason = ours["ours"].unavailable_reason()
    if reason is not None:
        return stage_frame([unavailable(impl, reason) for impl in impls])

    import cupy as cp  # noqa: PLC0415
    import torch  # noqa: PLC0415

    from ddtree_bench.cuda.loader import BENCH_UTIL_SOURCE, cached_fatbin  # noqa: PLC0415

    util = cp.RawModule(path=str(util_fatbin or cached_fatbin(BENCH_UTIL_SOURCE)))
    spin_kernel = util.get_function("ddtree_spin_kernel")
    flush_kernel = util.get_function("ddtree_flush_l2")
    stream_read = util.get_function("ddtree_stream_read")
    dev = cp.cuda.Device()
    l2_bytes = int(cp.cuda.runtime.getDeviceProperties(dev.id)["l2CacheSize"])
    sm_count = int(cp.cuda.runtime.getDeviceProperties(dev.id)["multiProcessorCount"])
    stream = cp.cuda.Stream(non_blocking=True)
    torch_stream = torch.cuda.ExternalStream(stream.ptr)
    flush_words = 2 * l2_bytes // 4
    flush_buf = cp.empty(flush_words, cp.uint32)

    def flush():
        flush_kernel(
            (4 * sm_count,), (1024,), (flush_buf, np.int64(flush_words), np.uint32(3)), stream=stream
        )

    event_time = EventTimer(stream, spin_kernel, spin_ns=ATTENTION_SPIN_NS, flush=flush)

    gen = torch.Generator(device="cuda").manual_seed(seed)
    tokens = budget + 1
    with torch.cuda.stream(torch_stream):
        q = torch.randn((batch, tokens, heads, HEAD_DIM), generator=gen, device="cuda").to(torch.bfloat16)
        kv = torch.randn((batch, prefix + tokens, HEAD_DIM), generator=gen, device="cuda").to(torch.bfloat16)
        bits = torch.as_tensor(bits_host.view(np.int32), device="cuda")
        visibility = torch.as_tensor(trees.visibility, device="cuda")
        prefix_t = torch.as_tensor(lengths.astype(np.int32), device="cuda")
    torch_stream.synchronize()
    check_requests = sorted({0, batch - 1})
    reference = reference_attention(q, kv, lengths, trees.visibility, requests=check_requests)
    references = {mask_of("ours"): reference}

    def reference_for(impl):
        """The float32 reference with the mask ``impl`` applies (computed once per mask)."""
        mask = mask_of(impl)
        if mask not in references:
            visibility_checked = check_visibility(impl, trees.visibility)
            references[mask] = reference_attention(
                q, kv, lengths, visibility_checked, requests=check_requests
            )
        return references[mask]

    rows = []
    ours_reason = {}
    for impl in OUR_PATHS:
        if impl in impls:
            try:
                _ = ours[impl].kernels  # loads the fatbin: a GPU with too little shared memory refuses it
            except AttentionUnavailable as exc:
                ours_reason[impl] = str(exc)
    for impl in impls:
        out, backend = None, None
        if impl in ours_reason:
            rows.append(unavailable(impl, ours_reason[impl]))
            continue
        try:
            with torch.cuda.stream(torch_stream):
                if impl == STREAM_IMPL:
                    words = -(-int(work["bytes"]) // 16)
                    with stream:
                        buffer = cp.ones(words * 4, cp.uint32)
                        sink = cp.zeros(1, cp.uint32)
                    grid = STREAM_BLOCKS_PER_SM * sm_count

                    def call(buffer=buffer, sink=sink, grid=grid, words=words):
                        stream_read(
                            (grid,),
                            (STREAM_THREADS,),
                            (buffer, np.int64(words), np.uint32(STREAM_NEVER), sink),
                            stream=stream,
                        )

                    call()
                    result = None
                    backend = f"one read of the call's bytes, {grid} blocks x {STREAM_THREADS} threads"
                elif impl in OUR_PATHS:
                    out = torch.empty((batch, tokens, heads, VALUE_DIM), device="cuda", dtype=torch.bfloat16)
                    prepared = ours[impl].prepare(q, kv, lengths, bits, out)
                    backend = backend_name(prepared)

                    def call(prepared=prepared):
                        prepared.launch(stream)

                    call()
                    result = out
                else:
                    from ddtree_bench.ops.attention_peers import PeerUnavailable, make_peer  # noqa: PLC0415

                    try:
                        options = flex_kernel_options if impl == "flexattention" else None
                        peer = make_peer(
                            impl,
                            q,
                            kv,
                            prefix_t,
                            visibility,
                            kernel_options=options,
                            sglang_source=sglang_source if impl == "sglang-triton" else None,
                        )
                    except PeerUnavailable as exc:
                        rows.append(unavailable(impl, exc))
                        continue

                    def call(peer=peer):
                        with torch.cuda.stream(torch_stream):
                            peer()

                    result = peer()
                    backend = getattr(peer, "backend", None)
            torch_stream.synchronize()
            stream.synchronize()
            if result is None:  # the read stream computes nothing to check
                error, correct = float("nan"), None
            else:
                got = result[check_requests].float()
                error = (
                    float((got - reference_for(impl)).abs().max().item())
                    if not torch.isnan(got).any()
                    else float("nan")
                )
                correct = bool(error < TOLERANCE)
            samples = [
                (cache, phase, rep, seconds)
                for cache in ("warm", "cold")
                for phase, rep, seconds in policy.samples(
                    lambda cache=cache: event_time(call, cache == "cold")
                )
            ]
        except torch.cuda.OutOfMemoryError as exc:
            rows.append(
                unavailable(
                    impl,
                    f"out of memory at B={batch}, N={budget}, S={prefix}, H={heads}: "
                    f"{str(exc).splitlines()[0]}",
                )
            )
            continue
        except Exception as exc:  # a peer that fails at run time: recorded, not fatal for the other impls
            if impl in OUR_PATHS or impl == STREAM_IMPL:
                raise
            rows.append(
                unavailable(
                    impl,
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                    status="failed",
                )
            )
            continue
        finally:
            out = buffer = sink = None  # (a read stream's buffer lives on in `call` until the next impl)
            torch.cuda.empty_cache()
            cp.get_default_memory_pool().free_all_blocks()
        for cache, phase, rep, seconds in samples:
            rows.append(
                {
                    **base,
                    **work,
                    **({"flops": float("nan")} if impl == STREAM_IMPL else {}),
                    "impl": impl,
                    "mask": mask_of(impl),
                    "phase": phase,
                    "repetition": rep,
                    "timing": "cuda-events",
                    "cache": cache,
                    "seconds": seconds,
                    "status": "ok",
                    "status_reason": f"backend: {backend}" if backend else None,
                    "correct": correct,
                    "error": error,
                }
            )
    return stage_frame(rows)
