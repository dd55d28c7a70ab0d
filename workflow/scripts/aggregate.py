from _job import logged

from ddtree_bench.environment import collect_environment
from ddtree_bench.settings import RECORDED, merge_recorded
from ddtree_bench.summary.build import aggregate

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)
BUILD_KEYS = ("native", "fatbin", "attention_fatbin", "accept_fatbin")

with logged(snakemake):
    params = snakemake.params
    environment = collect_environment(params.machine)
    environment.update(
        config=merge_recorded({name: dict(getattr(params, name)) for name in (*RECORDED, "step")}),
        unavailable=dict(params.unavailable),
        builds={key: snakemake.input[key] for key in BUILD_KEYS if key in snakemake.input.keys()},
        nvcc=params.nvcc,
    )
    aggregate(
        snakemake.input.bench,
        snakemake.output.summary,
        shape_paths=snakemake.input.shapes,
        shape_path=snakemake.output.shapes,
        environment=environment,
        environment_path=snakemake.output.environment,
    )
