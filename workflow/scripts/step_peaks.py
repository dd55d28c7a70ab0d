from _job import logged

from ddtree_bench.io import write_frame
from ddtree_bench.summary.step import describe_rows

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    from ddtree_bench.stages.peaks import peak_rates, run_peaks

    params = snakemake.params
    rows = run_peaks(timing=dict(params.timing), machine=params.machine, util_fatbin=snakemake.input.util)
    print(describe_rows(rows))
    print(f"peaks: {peak_rates(rows)}")
    write_frame(rows, snakemake.output.rows)
