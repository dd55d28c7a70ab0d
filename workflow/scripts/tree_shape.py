from _job import logged

from ddtree_bench.io import write_json
from ddtree_bench.summary.build import tree_shape

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    shape = tree_shape(
        snakemake.input.trace, int(snakemake.wildcards.budget), distribution=snakemake.wildcards.distribution
    )
    write_json(shape, snakemake.output.shape)
