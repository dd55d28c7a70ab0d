"""One record format for the step stages next to the tree build: verify attention, tree accept, and the
GPU's measured peaks (bf16 GEMM, device copy, empty-kernel floor).

Every timed call is one row (``phase`` "warmup" or "timed"), like the tree-build records of ``bench``:

==================  ==========================================================================================
column              meaning
==================  ==========================================================================================
stage               "verify-attention", "accept", "peak", or the rest of the round (``stages.model``,
                    ``stages.draft``, ``stages.allreduce``): "forward", "moe", "dense", "lm-head",
                    "draft", "allreduce"; and the whole round run (``stages.round``): "round"
impl                verify-attention: "ours", "ours-mma", "flexattention", "sdpa", "flashmla",
                    "sglang-triton", "sglang-fa3", "read-stream" (no attention: a read of the call's bytes,
                    the measured bound); accept: "gpu-kernel",
                    "gpu-host-inclusive", "cpu-walk", "floor"; peak: "bf16-gemm", "device-copy", "floor";
                    forward and moe: the MoE impl ("marlin-w4a16", "triton-w4a16", "bf16-grouped-mm");
                    dense, lm-head, draft: "torch"; allreduce: "nccl" (or "gloo"); round: the builder
batch, budget       the grid point (0 for peaks)
heads, prefix       attention only: query heads per GPU, prefix length S of every request (null elsewhere)
depth, distribution the trace the trees were built from (null for peaks)
repetition, phase   call index within its phase; "warmup" or "timed"
timing              "cuda-events" (device time of a call as it is launched), "cuda-graph" (device time of the
                    call captured in a CUDA graph and replayed, as a round runs it) or "wall"
                    (``time.perf_counter_ns``, host-inclusive); round: "wall" (the run round) or
                    "sum-of-parts" (its parts timed one by one, summed); stack: also "part-<part>" (one
                    part, waited for), "model-one-graph" (the chain's round as one graph: a model),
                    "estimate-allreduce" and "estimate-gather" (tensor-parallel terms, estimated, not
                    measured), each prefixed "run<k>:" in a repeated run
cache               "warm", "cold" (L2 flushed before the call) or "n/a"
seconds             the call's time
flops, bytes        work of one call (attention: 2·H·1088·visible keys; bytes moved at least once), or null
status              "ok", "unavailable" (the impl cannot run this shape here; reason in status_reason)
                    or "failed" (it ran and raised; reason in status_reason)
correct             matches the stage's reference (attention: within bf16 tolerance of float32; accept:
                    equal to the CPU walk); null where not checked
error               attention: max abs error against the float32 reference; null elsewhere
mask                attention: the mask the impl applies, "tree" or "causal (no tree mask)" (FlashMLA);
                    null for the read stream and elsewhere
accept_length_mean  accept: mean accepted nodes per request (root included) of the timed walk
expected_accept_mean accept: mean over requests of the expected accepted draft tokens (sum of path
                    probabilities of the tree's nodes under the drafter's own distributions)
trace_sha256        the sha256 of the trace the trees were built from (``traces.arrays_sha256``; null for
                    peaks)
tokens              the rest of the round: tokens of the call (the forward's T = B x (N + 1); the draft's
                    B x block); null elsewhere
experts_touched     forward and moe: mean distinct routed experts per MoE layer of the call's routing
world_size          allreduce: the processes (GPUs) of the tensor-parallel group measured
launches            verify attention (one call) and stack rows (its attention, one layer): the GPU
                    operations it issues (kernels, copies, fills; the profiler's count)
note                what else a row of the rest of the round needs said (the weights' layout, the graph)
==================  ==========================================================================================

plus the environment columns (``environment.ENVIRONMENT_COLUMNS``).
"""

from __future__ import annotations

import math

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.environment import ENVIRONMENT_COLUMNS, collect_environment

#: The rest of the round's record stages (the catalog's stages with their own switch: ``stages.model``,
#: ``stages.draft``, ``stages.allreduce``, ``stages.round``).
ROUND_STAGES = tuple(record for s in catalog.STAGES.values() if s.switch is not None for record in s.records)
STAGE_COLUMNS = (
    "stage",
    "impl",
    "batch",
    "budget",
    "heads",
    "prefix",
    "depth",
    "distribution",
    "repetition",
    "phase",
    "timing",
    "cache",
    "seconds",
    "flops",
    "bytes",
    "status",
    "status_reason",
    "correct",
    "error",
    "mask",
    "accept_length_mean",
    "expected_accept_mean",
    "trace_sha256",
    "tokens",
    "experts_touched",
    "world_size",
    "launches",
    "note",
    *ENVIRONMENT_COLUMNS,
)
_FLOAT = (
    "seconds",
    "flops",
    "bytes",
    "error",
    "accept_length_mean",
    "expected_accept_mean",
    "experts_touched",
)
_INT = ("batch", "budget", "repetition")
_NULLABLE_INT = ("heads", "prefix", "depth", "cpu_count", "tokens", "world_size", "launches")


def unavailable_row(base: dict, reason, status: str = "unavailable") -> dict:
    """``base`` as one row saying its configuration could not run (``status`` "unavailable") or raised
    ("failed"), and why: no timings."""
    return {
        **base,
        "phase": "timed",
        "repetition": 0,
        "seconds": math.nan,
        "status": status,
        "status_reason": " ".join(str(reason).split()),
    }


def stage_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows as a DataFrame with exactly ``STAGE_COLUMNS`` (missing values as nulls), in that order.
    Unknown keys are a ValueError (a misspelt column must not vanish silently)."""
    unknown = sorted({key for row in rows for key in row} - set(STAGE_COLUMNS))
    if unknown:
        raise ValueError(f"stage records: unknown columns {unknown}")
    stages = catalog.record_stages()
    bad = sorted({row.get("stage") for row in rows} - set(stages))
    if bad:
        raise ValueError(f"stage records: unknown stage {bad[0]!r}; expected one of {list(stages)}")
    df = pd.DataFrame.from_records(rows, columns=list(STAGE_COLUMNS))
    for column in _FLOAT:
        df[column] = df[column].astype("float64")
    for column in _INT:
        df[column] = df[column].fillna(0).astype("int64")
    for column in _NULLABLE_INT:
        df[column] = df[column].astype("Int64")
    df["correct"] = df["correct"].astype("boolean")
    return df


def unavailable_stage_frame(
    stage: str,
    reason: str,
    *,
    impls: dict | None = None,
    machine: str | None = None,
    environment: dict | None = None,
) -> pd.DataFrame:
    """One row per impl of ``stage`` (a catalog stage, or one of its record stages) saying it could not run
    here and why (``budget``/``batch`` 0: every configuration). ``impls``: the configured impls per record
    stage, where they are fewer than the catalog's."""
    if stage in catalog.STAGES:
        records = catalog.STAGES[stage].records
    elif stage in catalog.record_stages():
        records = {stage: catalog.record_stages()[stage]}
    else:
        raise ValueError(f"unknown step stage {stage!r}; expected one of {list(catalog.STAGES)}")
    env = environment or collect_environment(machine)
    common = {key: env.get(key) for key in ENVIRONMENT_COLUMNS if key in env}
    rows = [
        {
            **common,
            "stage": record,
            "impl": impl,
            "batch": 0,
            "budget": 0,
            "repetition": -1,
            "phase": "timed",
            "timing": None,
            "cache": "n/a",
            "seconds": math.nan,
            "status": "unavailable",
            "status_reason": " ".join(str(reason).split()),
        }
        for record, all_impls in records.items()
        for impl in (impls or {}).get(record) or all_impls
    ]
    return stage_frame(rows)


def describe_rows(rows: pd.DataFrame) -> str:
    """A job log's summary of its rows: counts, statuses, and the timed calls' statistics per impl."""
    timed = rows[(rows["phase"] == "timed") & (rows["status"] == "ok")]
    lines = [f"{len(rows)} rows, {len(timed)} timed; status {sorted(set(rows['status']))}"]
    bad = rows[rows["status"] != "ok"].drop_duplicates(["impl", "status", "status_reason"])
    lines += [f"{r.impl}: {r.status}: {r.status_reason}" for r in bad.itertuples()]
    if len(timed):
        stats = timed.groupby(["impl", "timing", "cache"], dropna=False)["seconds"].describe()
        lines.append(stats.to_string())
    return "\n".join(lines)
