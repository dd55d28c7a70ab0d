from _job import logged

from ddtree_bench.cuda.loader import build_fatbin

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    build_fatbin(snakemake.input.source, snakemake.output.fatbin, list(snakemake.params.archs))
