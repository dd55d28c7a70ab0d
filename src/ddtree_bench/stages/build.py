"""Timing one configuration (builder, budget, batch size, trace) on the CPU: ``run_benchmark(job)``, ``job`` a
``stages.timing_job.TimingJob``.

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
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from ddtree_bench import catalog
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

#: The configuration's row fields an "unavailable" row can name (``unavailable_frame``).
UNAVAILABLE_FIELDS = (
    "label",
    "budget",
    "batch",
    "depth",
    "topk",
    "input_columns",
    "distribution",
    "trace_sha256",
)
#: The column a timing job's rows add after ``COLUMNS`` (``stages.timing_job.run``): which of the
#: configuration's independent timing jobs (``timing.jobs``, 1-based) timed them (``summary.spread``); the
#: summary reads rows without it as job 1.
JOB_COLUMN = "job"

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
    fields: Mapping | None = None,
    environment: dict | None = None,
) -> pd.DataFrame:
    """One row saying ``builder`` could not run here and why (no timings). ``fields``: the configuration's
    row fields (``UNAVAILABLE_FIELDS``: label, budget, batch, depth, topk, input_columns, distribution,
    trace_sha256); a field not given is null, but the label (the builder's name) and budget and batch (0:
    "every configuration"; the workflow writes one such row per builder it leaves out). ``environment``: the
    environment columns (None: collected here, for ``machine``)."""
    env = environment or collect_environment(machine)
    given = dict(fields or {})
    unknown = sorted(set(given) - set(UNAVAILABLE_FIELDS))
    if unknown:
        raise ValueError(f"unavailable_frame: unknown row fields {unknown}")
    row = {
        "builder": builder,
        **dict.fromkeys(UNAVAILABLE_FIELDS),
        "budget": 0,
        "batch": 0,
        **given,
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
        **{k: env.get(k) for k in COLUMNS if k in env},
    }
    row["label"] = row["label"] or builder
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
    expected = get_builder(catalog.ORACLE).build(lp, ids, budget)
    return first_difference(expected, trees) is None


INPUT_COLUMNS = ("topk", "trace")


def check_input_columns(value) -> str:
    """``input_columns``: "topk" (hand builders the first min(N, K) columns) or "trace" (all K)."""
    if value not in INPUT_COLUMNS:
        raise ValueError(f"input_columns must be one of {', '.join(INPUT_COLUMNS)}, got {value!r}")
    return value


def start_run(job):
    """What every tree-build timing job (``run_benchmark``, ``run_gpu_benchmark``, ``run_insitu_benchmark``,
    each given a ``stages.timing_job.TimingJob``, which imports them) starts with: the timing policy (the
    job's timing section) and ``prepare_run``'s result."""
    return TimingPolicy(**job.timing), prepare_run(job)


def builder_name(builder) -> str:
    """The rows' ``builder`` of a builder name or object."""
    return builder if isinstance(builder, str) else getattr(builder, "name", type(builder).__name__)


def prepare_run(job):
    """What every timing job starts with: the batch (the trace's first ``batch`` requests; with
    ``input_columns="topk"`` only their first ``min(budget, K)`` columns), the builder object, and the row
    fields every row shares. Returns ``(builder_object, lp, ids, budget, base_row)``, or a one-row
    "unavailable" frame when the builder cannot run here."""
    budget = check_budget(job.budget)
    batch = check_count(job.batch, "batch", 1)
    input_columns = check_input_columns(job.input_columns)
    lp, ids, columns, metadata = read_batch(
        job.trace_path, batch, budget if input_columns == "topk" else None
    )
    depth = int(lp.shape[1])
    if job.depth is not None and depth != job.depth:
        raise ValueError(f"trace {job.trace_path} has depth {depth}, not the job's {job.depth}")
    distribution = job.distribution if job.distribution is not None else metadata.get("distribution")
    sha256 = row_sha256(job.trace_path, metadata)
    env = collect_environment(job.machine)
    name = builder_name(job.builder)
    obj = _builder_object(job.builder, job.builder_options)
    fields = {
        "label": obj.label or name,
        "budget": budget,
        "batch": batch,
        "depth": depth,
        "topk": min(budget, columns),
        "input_columns": int(lp.shape[2]),
        "distribution": distribution,
        "trace_sha256": sha256,
    }
    reason = obj.unavailable_reason()
    if reason is not None:
        return unavailable_frame(name, reason, fields=fields, environment=env)
    budget = obj.check(lp, ids, budget)  # validate once; the timed calls skip it (module docstring)
    base = {
        "builder": name,
        **fields,
        "budget": budget,
        "status": "ok",
        "status_reason": None,
        **{k: env.get(k) for k in COLUMNS if k in env},
        **provenance_fields(obj),
    }
    return obj, lp, ids, budget, base


def samples_without_gc(policy: TimingPolicy, measure) -> list[tuple[str, int, float]]:
    """``policy.samples(measure)`` with Python's garbage collector off (after a collection); restored."""
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return policy.samples(measure)
    finally:
        if gc_was_enabled:
            gc.enable()


def call_rows(common: dict, samples) -> list[dict]:
    """One row per ``(phase, repetition, seconds)`` sample: ``common`` with the call's fields."""
    return [
        {
            **common,
            "repetition": rep,
            "phase": phase,
            "seconds": seconds,
            "per_tree_seconds": seconds / common["batch"],
        }
        for phase, rep, seconds in samples
    ]


def run_benchmark(job) -> pd.DataFrame:
    """Time ``job.builder`` (a name, or a builder object) on the first ``job.batch`` requests of the trace at
    ``job.trace_path`` with budget ``job.budget``; one row per call (see the module docstring).

    ``job.correct``: whether the builder's trees were checked equal to ``reference``'s (the workflow's check
    job passes ``True``); ``None`` compares the last timed call's trees with ``reference`` here
    (``reference`` itself is correct by definition).
    """
    policy, prepared = start_run(job)
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

    samples = samples_without_gc(policy, measure)
    trees = last[0]
    correct = job.correct
    if base["builder"] == catalog.ORACLE:
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
    return frame(call_rows(common, samples))
