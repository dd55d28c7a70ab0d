from _job import logged

from ddtree_bench.io import write_frame
from ddtree_bench.summary.step import describe_rows

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    from ddtree_bench.stages.accept import run_accept_benchmark

    wildcards, params = snakemake.wildcards, snakemake.params
    rows = run_accept_benchmark(
        snakemake.input.trace,
        int(wildcards.budget),
        int(wildcards.batch),
        timing=dict(params.timing),
        machine=params.machine,
        distribution=wildcards.distribution,
        accept_fatbin=snakemake.input.accept,
        util_fatbin=snakemake.input.util,
    )
    print(describe_rows(rows))
    write_frame(rows, snakemake.output.rows)
