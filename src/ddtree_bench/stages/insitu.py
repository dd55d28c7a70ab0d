"""In-situ cost: what the decode round's critical path pays between the drafter's top-K on the GPU and the
padded tree on the GPU, for every builder, on the same inputs (``timing = "in-situ"`` rows).

``run_insitu_benchmark`` (a ``stages.timing_job.TimingJob``, as ``stages.build.run_benchmark``; the same
columns) times one CPU builder:

- ``sglang`` and ``reference``, the way SGLang's DDTree worker does it (torch): the [B, L, K] top-K starts as
  torch CUDA tensors; a call copies them to the host with pageable copies (``.to("cpu")``), builds and pads
  each request (``sglang``: SGLang's function, then its ``pad_ddtree_build_outputs`` where the module has
  one, else the same padding by our code; ``reference``: its per-request loop writing the padded batch),
  moves the padded visibility, retrieve_next_token, retrieve_next_sibling, node token ids and depths to the
  device (pageable ``.to("cuda")``, one copy per tensor for the whole batch) and synchronises;
- ``native`` and ``native-mt``, as an engineer would (CuPy): pinned host buffers allocated once (untimed); a
  call copies the top-K (one buffer) to pinned memory on one stream, waits for it (the CPU needs the data),
  builds into the pinned output, copies the same five tensors (one contiguous range) to the device on the
  same stream and synchronises.

Each call is wall time by ``time.perf_counter_ns``. The ``gpu`` builder's in-situ rows come from
``stages.build_gpu.run_gpu_benchmark`` given a job with ``in_situ`` (CUDA events around a CUDA-graph replay;
launch + synchronise wall as a secondary row; both with the bool mask and with packed bits only).

Where the mode cannot run (no GPU; no torch with CUDA for ``sglang``/``reference``) the result is one row with
``status = "unavailable"``, ``timing = "in-situ"`` and the reason. After timing, the five tensors the last
call left on the device are copied back (untimed) and compared with ``reference``'s trees: ``correct``.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.builders import get_builder
from ddtree_bench.builders.gpu import device_layout, device_views
from ddtree_bench.builders.sglang import sglang_call
from ddtree_bench.environment import ENVIRONMENT_COLUMNS
from ddtree_bench.stages.build import (
    UNAVAILABLE_FIELDS,
    call_rows,
    frame,
    prechecked_budget,
    samples_without_gc,
    start_run,
    unavailable_frame,
)
from ddtree_bench.timing.gpu import pinned
from ddtree_bench.tree import FIELD_DTYPES, TreeBatch

IN_SITU = catalog.IN_SITU
#: The timing values of the in-situ rows (the gpu builder's variants: packed bits, launch + sync wall).
IN_SITU_TIMINGS = catalog.in_situ_timings()
#: What the verify needs back on the device, in this order (one contiguous range for the native copies).
VERIFY_FIELDS = (
    "visibility",
    "retrieve_next_token",
    "retrieve_next_sibling",
    "node_token_ids",
    "node_depths",
)
TORCH_BUILDERS = catalog.builders_where(copies=catalog.PAGEABLE)
PINNED_BUILDERS = catalog.builders_where(copies=catalog.PINNED)


def torch_cuda_reason() -> str | None:
    """``None`` where torch imports and sees a CUDA device, else why not."""
    try:
        import torch  # noqa: PLC0415
    except Exception as error:  # noqa: BLE001 - any import failure is the reason
        return f"torch is not installed or does not import ({type(error).__name__}: {error})"
    try:
        if not torch.cuda.is_available():
            return f"torch {torch.__version__} sees no CUDA device"
    except Exception as error:  # noqa: BLE001
        return f"torch cannot query CUDA ({type(error).__name__}: {error})"
    return None


def in_situ_unavailable_reason(builder: str) -> str | None:
    """Why the in-situ mode cannot time ``builder`` here (None: it can)."""
    from ddtree_bench.cuda.loader import gpu_unavailable_reason  # noqa: PLC0415

    if builder in TORCH_BUILDERS:
        reason = torch_cuda_reason()
        return None if reason is None else f"in-situ timing needs torch with a CUDA device: {reason}"
    if builder in PINNED_BUILDERS or builder in catalog.builders_where(copies=catalog.DEVICE):
        reason = gpu_unavailable_reason()
        return None if reason is None else f"in-situ timing needs a CUDA GPU: {reason}"
    raise ValueError(f"in-situ timing: unknown builder {builder!r}")


def _unavailable(builder: str, reason: str, **keywords) -> pd.DataFrame:
    df = unavailable_frame(builder, reason, **keywords)
    df["timing"] = IN_SITU
    return df


def unavailable_like(rows: pd.DataFrame, reason: str) -> pd.DataFrame:
    """One ``timing = "in-situ"`` row saying why, for the configuration of a timing job's ``rows``."""
    first = rows.iloc[0]

    def value(column):
        item = first.get(column)
        return None if item is None or pd.isna(item) else item

    fields = {k: value(k) for k in ("label", "depth", "topk", "input_columns", "distribution")}
    for key in ("depth", "topk", "input_columns"):
        fields[key] = None if fields[key] is None else int(fields[key])
    fields.update(budget=int(first["budget"]), batch=int(first["batch"]))
    environment = {k: value(k) for k in ENVIRONMENT_COLUMNS if k in first.index}
    return _unavailable(str(first["builder"]), reason, fields=fields, environment=environment)


def pad_request_torch(torch, result, budget: int, pad_function=None):
    """One request's SGLang outputs padded to the budget: ``(visibility [N+1, N+1], retrieve_next_token,
    retrieve_next_sibling [N+1], node_token_ids, node_depths [N])`` CPU tensors. ``pad_function`` (SGLang's
    ``pad_ddtree_build_outputs(visibility, next_token, next_sibling, target_q_len)``) pads the first three
    where given; else, and always for the token ids and depths, our code pads by the contract (pad rows and
    columns False, pad links and token ids -1, pad depths 0)."""
    tokens, depths, _parents, _maps, visibility, next_token, next_sibling = result
    n1 = int(budget) + 1
    visibility = torch.as_tensor(visibility)
    next_token = torch.as_tensor(next_token)
    next_sibling = torch.as_tensor(next_sibling)
    if pad_function is not None:
        visibility, next_token, next_sibling = pad_function(visibility, next_token, next_sibling, n1)
    else:
        m = int(visibility.shape[0])
        padded = torch.zeros((n1, n1), dtype=torch.bool)
        padded[:m, :m] = visibility
        visibility = padded
        nt = torch.full((n1,), -1, dtype=torch.int64)
        nt[:m] = next_token
        ns = torch.full((n1,), -1, dtype=torch.int64)
        ns[:m] = next_sibling
        next_token, next_sibling = nt, ns
    tokens = torch.as_tensor(tokens).reshape(-1)
    depths = torch.as_tensor(depths).reshape(-1)
    n = int(tokens.shape[0])
    padded_tokens = torch.full((int(budget),), -1, dtype=torch.int64)
    padded_tokens[:n] = tokens
    padded_depths = torch.zeros((int(budget),), dtype=torch.int64)
    padded_depths[:n] = depths
    return visibility, next_token, next_sibling, padded_tokens, padded_depths


def torch_measure(obj, name: str, lp: np.ndarray, ids: np.ndarray, budget: int, keep: list, device="cuda"):
    """The measured call of ``sglang``/``reference`` (module docstring), a fetch of what the last call left
    on the device, and the device memory it holds (``device="cpu"``: the same steps without a GPU: tests)."""
    import torch  # noqa: PLC0415

    device = torch.device(device)
    on_gpu = device.type == "cuda"
    d_lp = torch.from_numpy(lp).to(device)
    d_ids = torch.from_numpy(ids).to(device)
    if on_gpu:
        torch.cuda.synchronize()
    clock = time.perf_counter_ns
    if name == catalog.SGLANG:
        function, pad_function, extra = sglang_call(obj)

        def build_pad(h_lp, h_ids):
            per_request = [
                pad_request_torch(torch, function(h_lp[b], h_ids[b], budget, **extra), budget, pad_function)
                for b in range(h_lp.shape[0])  # the per-request loop SGLang's worker runs
            ]
            return [torch.stack(parts) for parts in zip(*per_request, strict=True)]
    else:

        def build_pad(h_lp, h_ids):
            trees = obj.build(h_lp.numpy(), h_ids.numpy(), budget)  # builds and pads each request
            return [torch.from_numpy(getattr(trees, field)) for field in VERIFY_FIELDS]

    def measure() -> float:
        t0 = clock()
        h_lp, h_ids = d_lp.to("cpu"), d_ids.to("cpu")
        padded = build_pad(h_lp, h_ids)
        moved = [tensor.to(device) for tensor in padded]
        if on_gpu:
            torch.cuda.current_stream().synchronize()
        t1 = clock()
        keep[:] = moved
        return (t1 - t0) / 1e9

    def fetch() -> list[np.ndarray]:
        return [tensor.cpu().numpy() for tensor in keep]

    return measure, fetch, float(d_lp.nbytes + d_ids.nbytes)


def _pinned_measure(obj, lp: np.ndarray, ids: np.ndarray, budget: int, keep: list):
    """The measured call of ``native``/``native-mt`` (module docstring) and the device memory it holds."""
    import cupy as cp  # noqa: PLC0415

    batch = lp.shape[0]
    n1 = budget + 1
    shapes = {
        "visibility": (batch, n1, n1),
        "retrieve_next_token": (batch, n1),
        "retrieve_next_sibling": (batch, n1),
        "node_token_ids": (batch, budget),
        "node_depths": (batch, budget),
        "node_count": (batch,),
        "parents": (batch, n1),
    }
    fields = [(name, shape, FIELD_DTYPES[name]) for name, shape in shapes.items()]
    out_offsets, out_bytes = device_layout(fields)
    verify_bytes = device_layout(fields[: len(VERIFY_FIELDS)])[1]
    in_offsets, in_bytes = device_layout([("lp", lp.shape, lp.dtype), ("ids", ids.shape, ids.dtype)])
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        d_in = cp.zeros(in_bytes, cp.uint8)  # the drafter's top-K on the device (filled once, untimed)
        staging = pinned(in_bytes)
        host_in = device_views(staging, in_offsets)
        host_in["lp"][...] = lp
        host_in["ids"][...] = ids
        d_in.set(staging, stream=stream)
        d_out = cp.zeros(verify_bytes, cp.uint8)
        pinned_out = pinned(out_bytes)
        stream.synchronize()
        staging[...] = 0  # so that the timed copy in is what fills it
    host_lp, host_ids = host_in["lp"], host_in["ids"]
    trees = TreeBatch(**device_views(pinned_out, out_offsets))
    verify_region = pinned_out[:verify_bytes]
    clock = time.perf_counter_ns

    def measure() -> float:
        t0 = clock()
        d_in.get(stream=stream, out=staging)  # one copy in: the top-K, to pinned memory
        stream.synchronize()  # the CPU builds from it
        obj.build(host_lp, host_ids, budget, out=trees)
        d_out.set(verify_region, stream=stream)  # one copy out: the five tensors the verify reads
        stream.synchronize()
        t1 = clock()
        keep[:] = [d_out]
        return (t1 - t0) / 1e9

    def fetch() -> list[np.ndarray]:
        host = keep[0].get()
        views = device_views(host, {name: out_offsets[name] for name in VERIFY_FIELDS})
        return [views[name] for name in VERIFY_FIELDS]

    return measure, fetch, float(d_in.nbytes + d_out.nbytes)


def run_insitu_benchmark(job) -> pd.DataFrame:
    """In-situ timing of one CPU builder (module docstring); one row per call, ``timing = "in-situ"``.
    ``job.correct``: the check job's verdict on the builder's trees (``None``: not known); the rows'
    ``correct`` is it and-ed with the equality of the tensors the in-situ calls left on the device to
    ``reference``'s."""
    policy, prepared = start_run(job)
    if isinstance(prepared, pd.DataFrame):
        prepared["timing"] = IN_SITU
        return prepared
    obj, lp, ids, budget, base = prepared
    name = base["builder"]
    if name not in TORCH_BUILDERS + PINNED_BUILDERS:
        raise ValueError(
            f"run_insitu_benchmark times the CPU builders, not {name!r} (gpu: run_gpu_benchmark)"
        )
    reason = in_situ_unavailable_reason(name)
    if reason is not None:
        fields = {k: base[k] for k in UNAVAILABLE_FIELDS if k != "trace_sha256"}
        environment = {k: v for k, v in base.items() if k in ENVIRONMENT_COLUMNS}
        return _unavailable(name, reason, fields=fields, environment=environment)

    obj.check = prechecked_budget
    base["threads"] = obj.info().get("threads", 1)
    keep: list = []
    if name in TORCH_BUILDERS:
        measure, fetch, device_bytes = torch_measure(obj, name, lp, ids, budget, keep)
    else:
        measure, fetch, device_bytes = _pinned_measure(obj, lp, ids, budget, keep)
    samples = samples_without_gc(policy, measure)

    expected = get_builder(catalog.ORACLE).build(lp, ids, budget)
    same = all(
        np.array_equal(getattr(expected, field), value)
        for field, value in zip(VERIFY_FIELDS, fetch(), strict=True)
    )
    common = {
        **base,
        "timing": IN_SITU,
        "cache": "n/a",
        "correct": bool(same and (True if job.correct is None else job.correct)),
        "nodes_mean": float(np.mean(expected.node_count)),
        "device_memory_bytes": device_bytes,
        "clock": "time.perf_counter_ns",
    }
    return frame(call_rows(common, samples))


__all__ = ["IN_SITU", "IN_SITU_TIMINGS", "VERIFY_FIELDS", "run_insitu_benchmark", "torch_cuda_reason"]
