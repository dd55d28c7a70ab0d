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
  tree build), ``warm`` samples back to back and ``cold`` samples after an L2 flush. Each call is captured
  in a CUDA graph and timed replayed (``timing = "cuda-graph"``), as a round runs the layer; a peer's call
  (a PyTorch function: its launches cost host time) is also timed as launched (``"cuda-events"``, warm), the
  eager column. ``launches``: the GPU operations one call issues. An implementation that
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

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ddtree_bench.builders import get_builder
from ddtree_bench.catalog import (
    ATTENTION_IMPLS,
    FLEXATTENTION,
    NATIVE,
    OURS,
    OURS_MMA,
    SGLANG_FA3_ATTENTION,
    SGLANG_TRITON_ATTENTION,
    STREAM_IMPL,
)
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
from ddtree_bench.paths import layout
from ddtree_bench.stages import points
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
OUR_PATHS = {OURS: "auto", OURS_MMA: "mma"}
#: the peers that load SGLang's files (its Triton attention; the merge of its FA3 passes)
SGLANG_PEERS = (SGLANG_TRITON_ATTENTION, SGLANG_FA3_ATTENTION)
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


def stream_read_launcher(kernel, sm_count: int, nbytes: int, stream=None):
    """``(call, grid)``: ``call()`` launches ``ddtree_stream_read`` (``kernel``) once over a buffer of
    ``nbytes`` (allocated here, on the current CuPy stream) on ``stream`` (None: the current one), ``grid``
    blocks."""
    import cupy as cp  # noqa: PLC0415

    words = -(-int(nbytes) // 16)
    buffer, sink = cp.ones(words * 4, cp.uint32), cp.zeros(1, cp.uint32)
    grid = STREAM_BLOCKS_PER_SM * sm_count
    args = (buffer, np.int64(words), np.uint32(STREAM_NEVER), sink)

    def call():
        kernel((grid,), (STREAM_THREADS,), args, stream=stream)

    return call, grid


def backend_name(prepared) -> str:
    """How our kernel ran a call: its path, the 72-row tiles where the plan took that kernel (else, on the
    wgmma path, "seesaw" for the 64-row seesaw kernel, and its clusters of row tiles that share key tiles by
    multicast), the clusters whose splits were merged on chip, and the splits merged in the kernel (no
    combine launch)."""
    plan = prepared.plan
    name = f"{prepared.kernels.path} path"
    if plan.rows_per_block == WIDE_ROWS_PER_BLOCK:
        name += f", {WIDE_ROWS_PER_BLOCK}-row tiles"
    elif plan.rows_per_block == SMALL_ROWS_PER_BLOCK:
        name += f", {SMALL_ROWS_PER_BLOCK}-row tiles of {SMALL_KEYS_PER_TILE} keys"
    elif plan.seesaw:
        name += ", seesaw"
        if plan.row_cluster > 1:
            name += f", key tiles multicast to clusters of {plan.row_cluster} row tiles"
    if plan.cluster > 1:
        name += f", clusters of {plan.cluster} splits"
    if plan.merged_in_kernel:
        name += f", {plan.splits} splits merged in the kernel"
    return name


@dataclass(frozen=True)
class Job:
    """One verify-attention job: the trace's first ``batch`` requests at ``budget``, ``heads`` query heads
    per GPU and prefix length ``prefix``; every impl of ``impls`` on the same inputs. ``timing``:
    ``TimingPolicy``'s keyword arguments; the fatbins: prebuilt ``verify_attn.cu`` / ``bench_util.cu`` (None:
    the cached builds)."""

    trace: str
    budget: int
    batch: int
    heads: int
    prefix: int
    timing: dict
    impls: tuple[str, ...] = IMPLS
    machine: str | None = None
    distribution: str | None = None
    flex_kernel_options: dict | None = None
    sglang_triton_source: str | None = None
    attention_fatbin: str | None = None
    util_fatbin: str | None = None
    seed: int = 0

    @classmethod
    def grid(cls, settings) -> list[dict]:
        step = settings.step_options()
        return points(
            distribution=[step["distribution"]],
            depth=[step["depth"]],
            budget=step["budgets"],
            batch=step["batch_sizes"],
            prefix=step["prefix_lengths"],
            heads=step["heads"],
        )

    @classmethod
    def from_settings(cls, settings, *, distribution, depth, budget, batch, prefix, heads, results=None):
        step, files = settings.step_options(), layout(settings, results)
        return cls(
            trace=files.trace_of(distribution, depth),
            budget=int(budget),
            batch=int(batch),
            heads=int(heads),
            prefix=int(prefix),
            timing=step["attention_timing"],
            impls=tuple(step["impls"]),
            machine=settings.machine,
            distribution=distribution,
            flex_kernel_options=step["flex_kernel_options"],
            sglang_triton_source=step["sglang_triton_source"],
            attention_fatbin=files.artefact("verify_attn"),
            util_fatbin=files.artefact("bench_util"),
        )

    @property
    def inputs(self) -> dict[str, str]:
        return {"trace": self.trace, "attention": self.attention_fatbin, "util": self.util_fatbin}


def configured_impls(settings) -> dict[str, tuple[str, ...]]:
    """The impls the configuration runs (its rows saying why name these)."""
    return {"verify-attention": tuple(settings.step.attention.impls)}


def _mask_of(impl):
    """The mask an impl applies, as its rows record it (None for the read stream)."""
    return None if impl == STREAM_IMPL else PEER_MASKS.get(impl, TREE_MASK)


def run(job: Job) -> pd.DataFrame:
    """Time every impl of the job on the same inputs (module docstring): its rows
    (``timing.records.stage_frame``). Bad arguments are a one-line ValueError before anything runs."""
    impls = list(job.impls)
    _check_args(job.budget, job.batch, job.heads, job.prefix, impls)
    if job.sglang_triton_source is not None and SGLANG_TRITON_ATTENTION in impls:
        find_sglang_kernel(
            job.sglang_triton_source
        )  # a path without SGLang's file: ValueError, nothing measured
    policy = TimingPolicy(**job.timing)
    problem = _Problem.of(job)
    ours = {impl: VerifyAttention(job.attention_fatbin, path=path) for impl, path in OUR_PATHS.items()}
    reason = ours[OURS].unavailable_reason()
    if reason is not None:
        return stage_frame([problem.unavailable(impl, reason) for impl in impls])
    session = _Session(job, problem, ours, policy)
    rows = []
    for impl in impls:
        rows += session.measure(impl)
    return stage_frame(rows)


@dataclass
class _Problem:
    """The job's trees and the fields every row of it carries."""

    trees: object
    bits_host: np.ndarray
    lengths: np.ndarray
    base: dict
    work: dict

    @classmethod
    def of(cls, job: Job) -> _Problem:
        budget, batch = int(job.budget), int(job.batch)
        lp, ids, columns, metadata = read_batch(job.trace, batch)
        topk = min(budget, columns)
        env = collect_environment(job.machine)
        base = {
            "stage": "verify-attention",
            "batch": batch,
            "budget": budget,
            "heads": int(job.heads),
            "prefix": int(job.prefix),
            "depth": int(lp.shape[1]),
            "distribution": job.distribution or metadata.get("distribution"),
            "trace_sha256": row_sha256(job.trace, metadata),
            **{key: env.get(key) for key in ENVIRONMENT_COLUMNS},
        }
        trees = get_builder(NATIVE).build(
            np.ascontiguousarray(lp[..., :topk]), np.ascontiguousarray(ids[..., :topk]), budget
        )
        bits_host = packed_visibility(trees.visibility)
        lengths = np.full(batch, int(job.prefix), np.int64)
        work = {
            "flops": attention_flops(visible_keys(lengths, bits_host), int(job.heads)),
            "bytes": attention_bytes(lengths, budget + 1, int(job.heads), bits_host.shape[-1]),
        }
        return cls(trees, bits_host, lengths, base, work)

    def unavailable(self, impl, reason, status="unavailable") -> dict:
        return {
            **self.base,
            **self.work,
            "impl": impl,
            "mask": _mask_of(impl),
            "phase": "timed",
            "repetition": 0,
            "timing": "cuda-events",
            "cache": "n/a",
            "status": status,
            "status_reason": " ".join(str(reason).split()),
        }

    def timed(self, impl, samples, backend, correct, error, launches=None) -> list[dict]:
        return [
            {
                **self.base,
                **self.work,
                **({"flops": float("nan")} if impl == STREAM_IMPL else {}),
                "impl": impl,
                "mask": _mask_of(impl),
                "phase": phase,
                "repetition": rep,
                "timing": timing,
                "cache": cache,
                "seconds": seconds,
                "status": "ok",
                "status_reason": f"backend: {backend}" if backend else None,
                "correct": correct,
                "error": error,
                "launches": launches,
            }
            for timing, cache, phase, rep, seconds in samples
        ]


class _Session:
    """The GPU side of a job: streams, the event timer, the inputs on the device, the references."""

    def __init__(self, job: Job, problem: _Problem, ours: dict, policy: TimingPolicy):
        import cupy as cp  # noqa: PLC0415
        import torch  # noqa: PLC0415

        from ddtree_bench.cuda.loader import BENCH_UTIL_SOURCE, cached_fatbin  # noqa: PLC0415

        self.job, self.problem, self.ours, self.cp, self.torch = job, problem, ours, cp, torch
        self.policy = policy
        util = cp.RawModule(path=str(job.util_fatbin or cached_fatbin(BENCH_UTIL_SOURCE)))
        self.stream_read = util.get_function("ddtree_stream_read")
        flush_kernel = util.get_function("ddtree_flush_l2")
        properties = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        l2_bytes, self.sm_count = int(properties["l2CacheSize"]), int(properties["multiProcessorCount"])
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.torch_stream = torch.cuda.ExternalStream(self.stream.ptr)
        flush_words = 2 * l2_bytes // 4
        flush_buf = cp.empty(flush_words, cp.uint32)

        def flush():
            flush_kernel(
                (4 * self.sm_count,),
                (1024,),
                (flush_buf, np.int64(flush_words), np.uint32(3)),
                stream=self.stream,
            )

        spin = util.get_function("ddtree_spin_kernel")
        self.event_time = EventTimer(self.stream, spin, spin_ns=ATTENTION_SPIN_NS, flush=flush)
        self._inputs()
        self.ours_reason = {}
        for impl in OUR_PATHS:
            if impl in job.impls:
                try:
                    _ = ours[impl].kernels  # loads the fatbin: a GPU with too little shared memory refuses it
                except AttentionUnavailable as exc:
                    self.ours_reason[impl] = str(exc)

    def _inputs(self) -> None:
        torch, job, problem = self.torch, self.job, self.problem
        gen = torch.Generator(device="cuda").manual_seed(job.seed)
        self.tokens = int(job.budget) + 1
        batch, heads, prefix = int(job.batch), int(job.heads), int(job.prefix)
        with torch.cuda.stream(self.torch_stream):
            q = torch.randn((batch, self.tokens, heads, HEAD_DIM), generator=gen, device="cuda")
            kv = torch.randn((batch, prefix + self.tokens, HEAD_DIM), generator=gen, device="cuda")
            self.q, self.kv = q.to(torch.bfloat16), kv.to(torch.bfloat16)
            self.bits = torch.as_tensor(problem.bits_host.view(np.int32), device="cuda")
            self.visibility = torch.as_tensor(problem.trees.visibility, device="cuda")
            self.prefix_t = torch.as_tensor(problem.lengths.astype(np.int32), device="cuda")
        self.torch_stream.synchronize()
        self.check_requests = sorted({0, batch - 1})
        reference = reference_attention(
            self.q, self.kv, problem.lengths, problem.trees.visibility, requests=self.check_requests
        )
        self.references = {_mask_of(OURS): reference}

    def reference_for(self, impl):
        """The float32 reference with the mask ``impl`` applies (computed once per mask)."""
        mask = _mask_of(impl)
        if mask not in self.references:
            visibility = check_visibility(impl, self.problem.trees.visibility)
            self.references[mask] = reference_attention(
                self.q, self.kv, self.problem.lengths, visibility, requests=self.check_requests
            )
        return self.references[mask]

    def _stream_call(self):
        with self.stream:
            call, grid = stream_read_launcher(
                self.stream_read, self.sm_count, self.problem.work["bytes"], self.stream
            )
        call()
        return call, None, f"one read of the call's bytes, {grid} blocks x {STREAM_THREADS} threads"

    def _ours_call(self, impl):
        torch, job = self.torch, self.job
        shape = (int(job.batch), self.tokens, int(job.heads), VALUE_DIM)
        out = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
        prepared = self.ours[impl].prepare(self.q, self.kv, self.problem.lengths, self.bits, out)

        def call(prepared=prepared):
            prepared.launch(self.stream)

        def on_current(prepared=prepared):
            prepared.launch(self.cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream))

        call()
        return call, out, backend_name(prepared), on_current

    def _peer_call(self, impl):
        from ddtree_bench.ops.attention_peers import make_peer  # noqa: PLC0415

        job = self.job
        peer = make_peer(
            impl,
            self.q,
            self.kv,
            self.prefix_t,
            self.visibility,
            kernel_options=job.flex_kernel_options if impl == FLEXATTENTION else None,
            sglang_source=job.sglang_triton_source if impl in SGLANG_PEERS else None,
        )

        def call(peer=peer):
            with self.torch.cuda.stream(self.torch_stream):
                peer()

        return call, peer(), getattr(peer, "backend", None), peer

    def _graph_call(self, on_current):
        """``on_current`` (the call's work on torch's current stream) captured as a CUDA graph, and a call
        that replays it on the timer's stream; None where it cannot be captured."""
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(self.torch_stream):
                on_current()  # warm on the capture's stream
            self.torch_stream.synchronize()
            with torch.cuda.graph(graph):
                on_current()
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 (not capturable: the eager rows stand alone, said in the reason)
            torch.cuda.synchronize()
            return None

        def call(graph=graph):
            with torch.cuda.stream(self.torch_stream):
                graph.replay()

        call.graph = graph
        return call

    def _checked(self, impl, result):
        """(max abs error, correct) of a call's output against the reference (NaN, None: nothing to check)."""
        if result is None:  # the read stream computes nothing to check
            return float("nan"), None
        got = result[self.check_requests].float()
        if self.torch.isnan(got).any():
            return float("nan"), False
        error = float((got - self.reference_for(impl)).abs().max().item())
        return error, bool(error < TOLERANCE)

    def _sampled(self, impl):
        """Set one impl up, check it, time it: (samples ``(timing, cache, phase, rep, seconds)``, backend,
        correct, error, launches). The call is timed replayed from a CUDA graph (``cuda-graph``, warm and
        cold), as a round runs it; a peer's call also as it is launched (``cuda-events``, warm)."""
        from ddtree_bench.ops.sglang_verify import launches  # noqa: PLC0415

        with self.torch.cuda.stream(self.torch_stream):
            if impl == STREAM_IMPL:
                call, result, backend = self._stream_call()
                on_current = None
            elif impl in OUR_PATHS:
                call, result, backend, on_current = self._ours_call(impl)
            else:
                call, result, backend, on_current = self._peer_call(impl)
        self.torch_stream.synchronize()
        self.stream.synchronize()
        error, correct = self._checked(impl, result)
        count = None if on_current is None else launches(self.torch, on_current)
        graphed = None if on_current is None else self._graph_call(on_current)
        timed = [("cuda-graph", graphed, ("warm", "cold"))] if graphed is not None else []
        if graphed is None:
            timed.append(("cuda-events", call, ("warm", "cold")))
            if on_current is not None:
                backend = f"{backend}; not capturable as a CUDA graph: timed as launched"
        elif impl not in OUR_PATHS:
            timed.append(("cuda-events", call, ("warm",)))
        samples = [
            (timing, cache, phase, rep, seconds)
            for timing, fn, caches in timed
            for cache in caches
            for phase, rep, seconds in self.policy.samples(
                lambda cache=cache, fn=fn: self.event_time(fn, cache == "cold")
            )
        ]
        return samples, backend, correct, error, count

    def measure(self, impl) -> list[dict]:
        """One impl's rows: its timed calls, or one row saying why it did not run."""
        from ddtree_bench.ops.attention_peers import PeerUnavailable  # noqa: PLC0415

        torch, problem, job = self.torch, self.problem, self.job
        if impl in self.ours_reason:
            return [problem.unavailable(impl, self.ours_reason[impl])]
        try:
            samples, backend, correct, error, count = self._sampled(impl)
        except PeerUnavailable as exc:
            return [problem.unavailable(impl, exc)]
        except torch.cuda.OutOfMemoryError as exc:
            where = f"B={job.batch}, N={job.budget}, S={job.prefix}, H={job.heads}"
            return [problem.unavailable(impl, f"out of memory at {where}: {str(exc).splitlines()[0]}")]
        except Exception as exc:  # a peer that fails at run time: recorded, not fatal for the other impls
            if impl in OUR_PATHS or impl == STREAM_IMPL:
                raise
            first = str(exc).splitlines()[0] if str(exc) else ""
            return [problem.unavailable(impl, f"{type(exc).__name__}: {first}", status="failed")]
        finally:
            torch.cuda.empty_cache()
            self.cp.get_default_memory_pool().free_all_blocks()
        return problem.timed(impl, samples, backend, correct, error, count)
