from _job import logged

from ddtree_bench.io import write_json
from ddtree_bench.stages.check import check_builder

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    # Raises TreeMismatch (naming the first differing request and field) on any difference: the job fails.
    result = check_builder(
        snakemake.wildcards.builder,
        snakemake.input.trace,
        int(snakemake.wildcards.budget),
        builder_options=dict(snakemake.params.options),
    )
    print(result)
    write_json(result, snakemake.output.check)
