from _job import logged

from ddtree_bench.io import write_frame
from ddtree_bench.timing.records import unavailable_stage_frame

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    stage, params = snakemake.wildcards.stage, snakemake.params
    print(f"step stage {stage}: unavailable: {params.reason}")
    rows = unavailable_stage_frame(stage, params.reason, impls=dict(params.impls), machine=params.machine)
    write_frame(rows, snakemake.output.rows)
