from _job import logged

from ddtree_bench.io import write_frame
from ddtree_bench.stages.build import unavailable_frame

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    builder, reason = snakemake.wildcards.builder, snakemake.params.reason
    print(f"{builder}: unavailable: {reason}")
    write_frame(unavailable_frame(builder, reason, machine=snakemake.params.machine), snakemake.output.bench)
