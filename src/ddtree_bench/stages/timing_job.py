"""The one entry of a tree-build timing job: ``TimingJob`` says what to time, ``run_timing_job`` runs it.

The builder's runner comes from the catalog (``catalog.BUILDERS[name].runner``): a CPU builder is timed by
``stages.build.run_benchmark``, a GPU builder by ``stages.build_gpu.run_gpu_benchmark`` (which times its own
in-situ variants). With ``in_situ``, a CPU builder whose timed calls all succeeded is also timed in situ
(``stages.insitu.run_insitu_benchmark``); where the in-situ mode cannot run here (``in_situ_reason``), one
in-situ row says why instead. The workflow's ``bench`` rule and ``ddtree-bench bench`` both call it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ddtree_bench import catalog
from ddtree_bench.config import TIMING_KEYS


@dataclass(frozen=True)
class TimingJob:
    """One timing job: the builder (a name, or a builder object: timed on the CPU), the trace's first
    ``batch`` requests at ``budget``, the timing section (``TIMING_KEYS``: ``timing.policy.TimingPolicy``'s
    arguments), and what every row records. ``correct``: the check job's verdict (None: compared here)."""

    builder: object
    trace_path: str
    budget: int
    batch: int
    timing: dict
    machine: str | None = None
    distribution: str | None = None
    builder_options: dict = field(default_factory=dict)
    input_columns: str = "trace"
    correct: bool | None = None

    @property
    def runner(self) -> str:
        entry = catalog.BUILDERS.get(self.builder) if isinstance(self.builder, str) else None
        return entry.runner if entry is not None else catalog.CPU

    def arguments(self) -> tuple[tuple, dict]:
        """The positional and keyword arguments every timing function takes."""
        missing = [key for key in TIMING_KEYS if key not in self.timing]
        if missing:
            raise ValueError(f"timing job: the timing section has no {missing[0]!r}")
        keywords = {key: self.timing[key] for key in TIMING_KEYS}
        keywords.update(
            machine=self.machine,
            distribution=self.distribution,
            builder_options=dict(self.builder_options),
            correct=self.correct,
            input_columns=self.input_columns,
        )
        return (self.builder, self.trace_path, self.budget, self.batch), keywords


def run_timing_job(
    job: TimingJob, *, in_situ: bool = False, in_situ_reason: str | None = None
) -> pd.DataFrame:
    """Every row of the job (module docstring): the runner's, then the in-situ rows where asked for."""
    args, keywords = job.arguments()
    if job.runner == catalog.GPU:
        from ddtree_bench.stages.build_gpu import run_gpu_benchmark  # noqa: PLC0415

        rows = run_gpu_benchmark(*args, **keywords, in_situ=bool(in_situ))
    else:
        from ddtree_bench.stages.build import run_benchmark  # noqa: PLC0415

        rows = run_benchmark(*args, **keywords)
    if not in_situ or not (rows["status"] == "ok").all():
        return rows
    if in_situ_reason:
        from ddtree_bench.stages.insitu import unavailable_like  # noqa: PLC0415

        reason = f"in-situ timing needs a CUDA GPU: {in_situ_reason}"
        return pd.concat([rows, unavailable_like(rows, reason)], ignore_index=True)
    if job.runner == catalog.GPU:
        return rows  # its in-situ variants are among its rows
    from ddtree_bench.stages.insitu import run_insitu_benchmark  # noqa: PLC0415

    return pd.concat([rows, run_insitu_benchmark(*args, **keywords)], ignore_index=True)
