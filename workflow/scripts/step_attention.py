from _job import logged

from ddtree_bench.io import write_frame
from ddtree_bench.summary.step import describe_rows

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    from ddtree_bench.stages.attention import run_attention_benchmark

    wildcards, params = snakemake.wildcards, snakemake.params
    rows = run_attention_benchmark(
        snakemake.input.trace,
        int(wildcards.budget),
        int(wildcards.batch),
        heads=int(wildcards.heads),
        prefix=int(wildcards.prefix),
        impls=list(params.impls),
        flex_kernel_options=params.flex_kernel_options,
        sglang_source=getattr(params, "sglang_triton_source", None),
        timing=dict(params.timing),
        machine=params.machine,
        distribution=wildcards.distribution,
        attention_fatbin=snakemake.input.attention,
        util_fatbin=snakemake.input.util,
    )
    print(describe_rows(rows))
    write_frame(rows, snakemake.output.rows)
