from _job import logged

from ddtree_bench.summary.step import aggregate_steps

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    summary = aggregate_steps(list(snakemake.input.rows), snakemake.output.summary)
    print(f"{len(summary)} step configurations")
