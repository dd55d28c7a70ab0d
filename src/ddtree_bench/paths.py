"""Where a run's files live: every result path pattern, defined once. The workflow's rules, the stage jobs,
the CLI and the tools all take their paths from a ``Layout`` (``layout(settings)``); a pattern's wildcards
are in braces (``{distribution}``), as Snakemake's."""

from __future__ import annotations

from dataclasses import dataclass

from ddtree_bench import catalog
from ddtree_bench.environment import default_machine_label

#: The sources of what a run compiles, by artefact name (``catalog.Builder.libraries``' second field).
KERNEL_SOURCE = "kernels/{kernel}/{kernel}.cu"
NATIVE_SOURCE = "kernels/native/tree_build_cpu.cpp"
#: The artefacts compiled from ``KERNEL_SOURCE`` (fatbins); "native" is the C++ builder's library.
FATBINS = ("tree_build", "bench_util", "verify_attn", "tree_accept")


@dataclass(frozen=True)
class Layout:
    """One machine's results folder (``results/<machine>``) and every file in it."""

    results: str

    @property
    def logs(self) -> str:
        return f"{self.results}/logs"

    def log_of(self, pattern: str) -> str:
        """A result file's log: the same path under ``logs``, ending in .log."""
        return self.logs + pattern[len(self.results) :].rsplit(".", 1)[0] + ".log"

    # ------------------------------------------------------------------------------------- inputs and builds
    @property
    def trace(self) -> str:
        return f"{self.results}/traces/{{distribution}}-L{{depth}}.npz"

    def trace_of(self, distribution: str, depth: int) -> str:
        return self.trace.format(distribution=distribution, depth=depth)

    @property
    def fatbin(self) -> str:
        return f"{self.results}/build/{{kernel}}.fatbin"

    @property
    def native_library(self) -> str:
        return f"{self.results}/build/libddtree_native.so"

    def artefact(self, name: str) -> str:
        """A compiled artefact's file: "native" (the C++ library) or a fatbin (``FATBINS``)."""
        if name == catalog.NATIVE_ARTEFACT:
            return self.native_library
        if name not in FATBINS:
            raise ValueError(f"unknown artefact {name!r}; expected native or one of {list(FATBINS)}")
        return self.fatbin.format(kernel=name)

    def libraries(self, builder: str) -> dict[str, str]:
        """The compiled libraries a builder loads, by its constructor's option (empty for Python builders)."""
        return {option: self.artefact(name) for option, name in catalog.BUILDERS[builder].libraries}

    # ------------------------------------------------------------------------------------- the tree build
    @property
    def check(self) -> str:
        return f"{self.results}/check/{{builder}}/{{distribution}}-L{{depth}}-N{{budget}}.json"

    @property
    def bench(self) -> str:
        """A timing job's rows; ``{rep}``: its job's suffix (none for job 1, -r2, -r3, ... for the others)."""
        name = "{distribution}-L{depth}-N{budget}-B{batch}{rep}.parquet"
        return f"{self.results}/bench/{{builder}}/{name}"

    @property
    def bench_unavailable(self) -> str:
        return f"{self.results}/bench/{{builder}}/unavailable.parquet"

    @property
    def shape(self) -> str:
        return f"{self.results}/shape/{{distribution}}-L{{depth}}-N{{budget}}.json"

    # ------------------------------------------------------------------------------------- the step stages
    def step(self, stage: str) -> str:
        """A step stage's result pattern (``catalog.Stage.path``)."""
        return f"{self.results}/{catalog.STAGES[stage].path}"

    def step_log(self, stage: str) -> str:
        """A step job's log: one per job, so a per-budget stage's drops its ``{budget}``."""
        pattern = self.step(stage)
        if catalog.STAGES[stage].per_budget:
            pattern = pattern.replace("N{budget}-", "").replace("-N{budget}", "")
        return self.log_of(pattern)

    @property
    def step_unavailable(self) -> str:
        return f"{self.results}/step/{{stage}}/unavailable.parquet"

    # ------------------------------------------------------------------------------------- summaries
    @property
    def summary(self) -> str:
        return f"{self.results}/summary.parquet"

    @property
    def shapes(self) -> str:
        return f"{self.results}/tree_shape.parquet"

    @property
    def step_summary(self) -> str:
        return f"{self.results}/step_summary.parquet"

    @property
    def environment(self) -> str:
        return f"{self.results}/environment.json"


def machine_label(settings) -> str:
    """The configured machine label, else this machine's (``<host>-<gpu>``)."""
    return settings.machine or default_machine_label()


def layout(settings, results: str | None = None) -> Layout:
    """The layout of ``results`` (default: ``results/<machine>``)."""
    return Layout(str(results).rstrip("/") if results else f"results/{machine_label(settings)}")
