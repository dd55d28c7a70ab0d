"""The one entry of a tree-build timing job: ``TimingJob`` says what to time, ``run`` runs it.

A job is made by ``TimingJob.from_settings(settings, builder=..., ...)`` (the settings give the timing
section, the machine, the input columns and the in-situ switch) or field by field (the workflow's ``bench``
rule, from its params; ``ddtree-bench bench``, from its options). The builder's runner comes from the
catalog (``catalog.BUILDERS[name].runner``): a CPU builder is timed by ``stages.build.run_benchmark``, a GPU
builder by ``stages.build_gpu.run_gpu_benchmark`` (which times its own in-situ variants). With ``in_situ``, a
CPU builder whose timed calls all succeeded is also timed in situ (``stages.insitu.run_insitu_benchmark``);
where the in-situ mode cannot run here (``in_situ_reason``), one in-situ row says why instead. Every row
records the job's number (``job``: which of ``timing.jobs``' independent jobs it is; ``summary.spread``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.config import TIMING_KEYS
from ddtree_bench.paths import layout
from ddtree_bench.stages import build
from ddtree_bench.timing.policy import check_count


@dataclass(frozen=True)
class TimingJob:
    """One timing job: the builder (a name, or a builder object: timed on the CPU), the trace's first
    ``batch`` requests at ``budget``, the timing section (``TIMING_KEYS``: ``timing.policy.TimingPolicy``'s
    arguments), and what every row records. ``builder_options``: ``builders.get_builder``'s keyword options
    (the libraries the workflow built among them); ``input_columns``: ``stages.build.check_input_columns``;
    ``correct``: the check job's verdict (None: compared here); ``depth``: the trace's depth where known (a
    trace of another depth is an error); ``job``: which of the configuration's independent timing jobs this
    is (1-based); ``in_situ``: time the in-situ mode too, unless ``in_situ_reason`` says why it cannot run."""

    builder: object
    trace_path: str | Path
    budget: int
    batch: int
    timing: Mapping
    machine: str | None = None
    distribution: str | None = None
    builder_options: Mapping = field(default_factory=dict)
    input_columns: str = "trace"
    correct: bool | None = None
    depth: int | None = None
    job: int = 1
    in_situ: bool = False
    in_situ_reason: str | None = None

    def __post_init__(self):
        missing = [key for key in TIMING_KEYS if key not in self.timing]
        if missing:
            raise ValueError(f"timing job: the timing section has no {missing[0]!r}")
        object.__setattr__(self, "timing", {key: self.timing[key] for key in TIMING_KEYS})
        object.__setattr__(self, "builder_options", dict(self.builder_options or {}))
        object.__setattr__(self, "job", check_count(self.job, "timing job", 1))

    @classmethod
    def from_settings(
        cls,
        settings,
        *,
        builder,
        distribution: str,
        depth: int,
        budget: int,
        batch: int,
        job: int = 1,
        results=None,
    ) -> TimingJob:
        """The workflow's job of one configuration under ``settings`` (``settings.Settings``): its trace and
        the builder's libraries where ``paths.layout`` puts them, the configured builder options, timing
        section, machine, input columns and in-situ switch. Wildcard-like values (strings of digits) are
        taken as ints. What only the run knows (``correct``, ``in_situ_reason``) is set with
        ``dataclasses.replace``."""
        files = layout(settings, results)
        return cls(
            builder=builder,
            trace_path=files.trace_of(distribution, depth),
            budget=int(budget),
            batch=int(batch),
            timing=settings.timing.options(),
            machine=settings.machine,
            distribution=distribution,
            builder_options={**files.libraries(builder), **settings.builder_options(builder)},
            input_columns=settings.builder_input_columns,
            depth=int(depth),
            job=int(job),
            in_situ=bool(settings.timing.in_situ),
        )

    @property
    def runner(self) -> str:
        entry = catalog.BUILDERS.get(self.builder) if isinstance(self.builder, str) else None
        return entry.runner if entry is not None else catalog.CPU


def run(job: TimingJob) -> pd.DataFrame:
    """Every row of the job (module docstring): the runner's, then the in-situ rows where asked for, each
    with the job's number (``stages.build.JOB_COLUMN``, last)."""
    if job.runner == catalog.GPU:
        from ddtree_bench.stages.build_gpu import run_gpu_benchmark  # noqa: PLC0415

        rows = run_gpu_benchmark(job)
    else:
        rows = build.run_benchmark(job)
    rows = _with_in_situ(job, rows)
    rows[build.JOB_COLUMN] = job.job
    return rows


def _with_in_situ(job: TimingJob, rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` and, where the job asks for them and its timed calls all succeeded, the in-situ rows (the
    gpu runner's are among its rows) or one row saying why they cannot be timed here."""
    if not job.in_situ or not (rows["status"] == "ok").all():
        return rows
    if job.in_situ_reason:
        from ddtree_bench.stages.insitu import unavailable_like  # noqa: PLC0415

        reason = f"in-situ timing needs a CUDA GPU: {job.in_situ_reason}"
        return pd.concat([rows, unavailable_like(rows, reason)], ignore_index=True)
    if job.runner == catalog.GPU:
        return rows
    from ddtree_bench.stages.insitu import run_insitu_benchmark  # noqa: PLC0415

    return pd.concat([rows, run_insitu_benchmark(job)], ignore_index=True)
