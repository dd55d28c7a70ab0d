"""Timing one configuration (builder, budget, batch size, trace): ``run_benchmark``.

Method (the same for every CPU builder, on the same inputs):

- The batch is the first ``batch`` requests of the trace, made contiguous once, before any call. Only those
  requests are read from the file (trace files are uncompressed ``.npz`` archives, so each array is
  memory-mapped in place) and validated like ``traces.load_trace`` validates a whole trace.
- ``warmup`` untimed calls, then timed calls until both ``repeats`` calls and ``min_seconds`` of timed calls
  are reached; a slow configuration stops at ``max_seconds`` once it has ``min_repeats`` calls, a fast one at
  ``max_repeats`` calls. Warm-up calls are timed too and kept as rows with ``phase = "warmup"``.
- ``input_columns="topk"`` (the workflow's choice, whatever the traces' fixed K) hands every builder
  the first ``topk = min(N, K)`` columns of the trace, contiguous, as a drafter emitting top-N would;
  ``"trace"`` hands over all K columns of the trace (each builder still reads only ``topk`` of them). The
  row's ``input_columns`` says which K the builder was handed: it sets what a host-inclusive GPU call copies.
- Every call is one row: nothing is averaged away. ``seconds`` is the call's wall time by
  ``time.perf_counter_ns`` (a monotonic clock; its implementation and resolution are in the ``clock``
  column), ``per_tree_seconds`` is ``seconds / batch``.
- Python's garbage collector is disabled while timing (after a ``gc.collect()``), and restored after.
- The inputs are validated once, before timing (``builder.check``); the timed calls skip that validation
  for every builder alike (it is the harness's, not part of any builder's algorithm, and on a whole trace
  it costs more than a native build of small trees).
- ``sglang`` and ``reference`` run the per-request loop over the batch that SGLang's DDTree worker runs
  (their ``build`` does that); ``native`` builds the whole batch per call. Builders whose ``build`` accepts
  ``out=`` (``native``) reuse one preallocated output batch from call to call, as a serving engine would.
- A builder that cannot run here gives one row with ``status = "unavailable"`` and the reason, no timings.
"""

from __future__ import annotations

import gc
import inspect
import math
import struct
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from ddtree_bench.builders import get_builder
from ddtree_bench.environment import ENVIRONMENT_COLUMNS, collect_environment
from ddtree_bench.timing.policy import TimingPolicy, check_count
from ddtree_bench.traces import load_trace, recorded_vocab_size, row_sha256
from ddtree_bench.tree import TreeBatch, first_difference
from ddtree_bench.validation import check_budget, check_topk_arrays

COLUMNS = (
    "builder",
    "label",
    "budget",
    "batch",
    "depth",
    "topk",
    "input_columns",
    "distribution",
    "repetition",
    "phase",
    "timing",
    "cache",
    "seconds",
    "per_tree_seconds",
    "status",
    "status_reason",
    "correct",
    "nodes_mean",
    "device_memory_bytes",
    "threads",
    "trace_sha256",
    *ENVIRONMENT_COLUMNS,
)
#: Where a builder's code came from, for builders that load it (``sglang``): the module path or file given,
#: the file's sha256, the git commit of the checkout tracking it, and whether a workspace was passed.
PROVENANCE_COLUMNS = (
    "builder_source",
    "builder_source_sha256",
    "builder_source_git_commit",
    "builder_workspace",
)
COLUMNS = (*COLUMNS, *PROVENANCE_COLUMNS)

STATUSES = ("ok", "unavailable", "failed")
PHASES = ("warmup", "timed")


def _builder_object(builder, builder_options):
    if isinstance(builder, str):
        return get_builder(builder, **(builder_options or {}))
    if builder_options:
        raise ValueError("builder_options can only be given with a builder name")
    return builder


def _accepts_out(builder) -> bool:
    try:
        return "out" in inspect.signature(builder.build).parameters
    except (TypeError, ValueError):
        return False


def frame(rows: list[dict]) -> pd.DataFrame:
    """Rows as a DataFrame with exactly ``COLUMNS`` (missing values as nulls), in that order."""
    df = pd.DataFrame.from_records(rows, columns=list(COLUMNS))
    for column in ("seconds", "per_tree_seconds", "nodes_mean", "device_memory_bytes"):
        df[column] = df[column].astype("float64")
    for column in ("budget", "batch", "repetition"):
        df[column] = df[column].astype("int64")
    for column in ("depth", "topk", "input_columns", "threads", "cpu_count"):
        df[column] = df[column].astype("Int64")
    df["correct"] = df["correct"].astype("boolean")
    df["builder_workspace"] = df["builder_workspace"].astype("boolean")
    return df


def provenance_fields(builder) -> dict:
    """``PROVENANCE_COLUMNS`` of a builder that records where its code came from (its ``source_info``);
    nothing for the others."""
    info = getattr(builder, "source_info", None)
    if not info:
        return {}
    return {
        "builder_source": info.get("source"),
        "builder_source_sha256": info.get("sha256"),
        "builder_source_git_commit": info.get("git_commit"),
        "builder_workspace": info.get("workspace"),
    }


def unavailable_frame(
    builder: str,
    reason: str,
    *,
    machine: str | None = None,
    label: str | None = None,
    budget: int = 0,
    batch: int = 0,
    depth: int | None = None,
    topk: int | None = None,
    input_columns: int | None = None,
    distribution: str | None = None,
    environment: dict | None = None,
    trace_sha256: str | None = None,
) -> pd.DataFrame:
    """One row saying ``builder`` could not run here and why (no timings). ``budget``/``batch`` 0 mean "every
    configuration" (the workflow writes one such row per builder it leaves out)."""
    env = environment or collect_environment(machine)
    row = {
        "builder": builder,
        "label": label or builder,
        "budget": budget,
        "batch": batch,
        "depth": depth,
        "topk": topk,
        "input_columns": input_columns,
        "distribution": distribution,
        "repetition": -1,
        "phase": "timed",
        "timing": "wall",
        "cache": "n/a",
        "seconds": math.nan,
        "per_tree_seconds": math.nan,
        "status": "unavailable",
        "status_reason": " ".join(str(reason).split()),
        "correct": None,
        "nodes_mean": math.nan,
        "device_memory_bytes": math.nan,
        "threads": None,
        "trace_sha256": trace_sha256,
        **{k: env.get(k) for k in COLUMNS if k in env},
    }
    return frame([row])


def prechecked_budget(top_log_probs, top_token_ids, budget) -> int:
    """Stands in for ``Builder.check`` once the inputs were validated: the budget, as an int."""
    return int(budget)


def _stored_array(path: Path, archive: zipfile.ZipFile, name: str) -> np.ndarray | None:
    """``name`` of an uncompressed .npz archive, memory-mapped where it lies (None for any other layout)."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        return None
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    with open(path, "rb") as handle:
        handle.seek(info.header_offset)
        local = handle.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            return None
        name_length, extra_length = struct.unpack("<HH", local[26:30])
        handle.seek(info.header_offset + 30 + name_length + extra_length)
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
        else:
            return None
        offset = handle.tell()
    if fortran or dtype.hasobject or len(shape) == 0 or 0 in shape:
        return None
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def read_batch(
    trace_path, batch: int, max_columns: int | None = None
) -> tuple[np.ndarray, np.ndarray, int, dict]:
    """``(top_log_probs, top_token_ids, K, metadata)`` of the first ``batch`` requests of a trace file (of
    their first ``max_columns`` columns where given), contiguous, without reading the rest; K is the trace's
    column count; validated as ``traces.load_trace`` validates a trace (one-line ValueError)."""
    cut = slice(None) if max_columns is None else slice(0, max_columns)

    path = Path(trace_path)
    arrays = None
    try:
        with zipfile.ZipFile(path) as archive:
            lp = _stored_array(path, archive, "top_log_probs.npy")
            ids = _stored_array(path, archive, "top_token_ids.npy")
            if lp is not None and ids is not None and lp.ndim == 3 and ids.shape == lp.shape:
                names = [n[:-4] for n in archive.namelist() if n.endswith(".npy")]
                arrays = lp, ids, names
    except (OSError, zipfile.BadZipFile, ValueError):
        arrays = None
    if arrays is None:  # anything unusual: the full loader says what is wrong with it
        trace = load_trace(path)
        lp, ids = trace.batch(batch)
        lp, ids = np.ascontiguousarray(lp[:, :, cut]), np.ascontiguousarray(ids[:, :, cut])
        return lp, ids, trace.topk, dict(trace.metadata)
    lp, ids, names = arrays
    if batch > lp.shape[0]:
        raise ValueError(f"batch {batch} is larger than the {lp.shape[0]} requests in trace {path}")
    columns = int(lp.shape[2])
    # contiguous copies: the file is closed behind them
    lp, ids = np.array(lp[:batch, :, cut], order="C"), np.array(ids[:batch, :, cut], order="C")
    metadata = {}
    with np.load(path, allow_pickle=False) as data:
        for name in names:
            if name not in ("top_log_probs", "top_token_ids"):
                value = data[name]
                metadata[name] = value.item() if value.ndim == 0 else value
    check_topk_arrays(lp, ids, where=f"trace {path}", vocab_size=recorded_vocab_size(metadata, path))
    return lp, ids, columns, metadata


def _trees_equal_reference(lp, ids, budget, trees) -> bool:
    expected = get_builder("reference").build(lp, ids, budget)
    return first_difference(expected, trees) is None


INPUT_COLUMNS = ("topk", "trace")


def check_input_columns(value) -> str:
    """``input_columns``: "topk" (hand builders the first min(N, K) columns) or "trace" (all K)."""
    if value not in INPUT_COLUMNS:
        raise ValueError(f"input_columns must be one of {', '.join(INPUT_COLUMNS)}, got {value!r}")
    return value


#: The arguments of a tree-build timing job (``run_benchmark``'s) that go to ``TimingPolicy`` and
#: ``prepare_run``.
POLICY_ARGS = ("warmup", "repeats", "min_seconds", "max_seconds", "min_repeats", "max_repeats")
RUN_ARGS = ("machine", "distribution", "builder_options", "input_columns")


def start_run(job: dict):
    """What every tree-build timing job (``run_benchmark``, ``run_gpu_benchmark``, ``run_insitu_benchmark``:
    one signature) starts with, from its arguments ``job`` (``locals()`` at its start): the timing policy and
    ``prepare_run``'s result."""
    policy = TimingPolicy(**{key: job[key] for key in POLICY_ARGS})
    run = {key: job[key] for key in RUN_ARGS}
    return policy, prepare_run(job["builder"], job["trace_path"], job["budget"], job["batch"], **run)


def prepare_run(
    builder, trace_path, budget, batch, *, machine, distribution, builder_options, input_columns="trace"
):
    """What every timing job starts with: the batch (the trace's first ``batch`` requests; with
    ``input_columns="topk"`` only their first ``min(budget, K)`` columns), the builder object, and the row
    fields every row shares. Returns ``(builder_object, lp, ids, budget, base_row)``, or a one-row
    "unavailable" frame when the builder cannot run here."""
    budget = check_budget(budget)
    batch = check_count(batch, "batch", 1)
    input_columns = check_input_columns(input_columns)
    lp, ids, columns, metadata = read_batch(trace_path, batch, budget if input_columns == "topk" else None)
    depth = int(lp.shape[1])
    topk = min(budget, columns)
    if distribution is None:
        distribution = metadata.get("distribution")
    sha256 = row_sha256(trace_path, metadata)
    env = collect_environment(machine)
    name = builder if isinstance(builder, str) else getattr(builder, "name", type(builder).__name__)
    obj = _builder_object(builder, builder_options)
    reason = obj.unavailable_reason()
    if reason is not None:
        return unavailable_frame(
            name,
            reason,
            label=obj.label or name,
            budget=budget,
            batch=batch,
            depth=depth,
            topk=topk,
            input_columns=int(lp.shape[2]),
            distribution=distribution,
            environment=env,
            trace_sha256=sha256,
        )
    budget = obj.check(lp, ids, budget)  # validate once; the timed calls skip it (module docstring)
    base = {
        "builder": name,
        "label": obj.label or name,
        "budget": budget,
        "batch": batch,
        "depth": depth,
        "topk": topk,
        "input_columns": int(lp.shape[2]),
        "distribution": distribution,
        "status": "ok",
        "status_reason": None,
        "trace_sha256": sha256,
        **{k: env.get(k) for k in COLUMNS if k in env},
        **provenance_fields(obj),
    }
    return obj, lp, ids, budget, base


def run_benchmark(
    builder,
    trace_path,
    budget,
    batch,
    *,
    warmup: int,
    repeats: int,
    min_seconds: float,
    machine: str | None,
    distribution: str | None,
    builder_options: dict | None = None,
    max_seconds: float | None = None,
    min_repeats: int = 1,
    max_repeats: int | None = None,
    correct: bool | None = None,
    input_columns: str = "trace",
) -> pd.DataFrame:
    """Time ``builder`` (a name, or a builder object) on the first ``batch`` requests of the trace at
    ``trace_path`` with budget ``budget``; one row per call (see the module docstring).

    ``correct``: whether the builder's trees were checked equal to ``reference``'s (the workflow's check job
    passes ``True``); ``None`` compares the last timed call's trees with ``reference`` here (``reference``
    itself is correct by definition).
    """
    policy, prepared = start_run(locals())  # first: the arguments, nothing else
    if isinstance(prepared, pd.DataFrame):
        return prepared
    obj, lp, ids, budget, base = prepared
    obj.check = prechecked_budget
    base["threads"] = obj.info().get("threads", 1)

    kwargs = {}
    if _accepts_out(obj):
        kwargs["out"] = TreeBatch.empty(base["batch"], budget)
    build = obj.build
    clock = time.perf_counter_ns
    last = []

    def measure() -> float:
        t0 = clock()
        trees = build(lp, ids, budget, **kwargs)
        t1 = clock()
        last[:] = [trees]
        return (t1 - t0) / 1e9

    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        samples = policy.samples(measure)
    finally:
        if gc_was_enabled:
            gc.enable()

    trees = last[0]
    if base["builder"] == "reference":
        correct = True
    elif correct is None:
        correct = _trees_equal_reference(lp, ids, budget, trees)
    common = {
        **base,
        "timing": "wall",
        "cache": "n/a",
        "correct": bool(correct),
        "nodes_mean": float(np.mean(trees.node_count)),
        "device_memory_bytes": math.nan,
    }
    rows = [
        {
            **common,
            "repetition": rep,
            "phase": phase,
            "seconds": seconds,
            "per_tree_seconds": seconds / base["batch"],
        }
        for phase, rep, seconds in samples
    ]
    return frame(rows)
