from _job import logged

from ddtree_bench.native_build import build_native_library

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    build_native_library(snakemake.input.source, snakemake.output.library)
