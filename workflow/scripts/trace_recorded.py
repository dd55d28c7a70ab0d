from _job import logged

from ddtree_bench.traces import import_recorded

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    import_recorded(
        snakemake.input.recorded,
        snakemake.output.trace,
        depth=int(snakemake.wildcards.depth),
        topk=snakemake.params.topk,
        requests=snakemake.params.requests,
    )
