from _job import logged

from ddtree_bench.io import write_frame
from ddtree_bench.summary.step import describe_rows

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    from ddtree_bench.k26.shapes import ModelShape
    from ddtree_bench.stages.model import run_model_stage

    wildcards, params = snakemake.wildcards, snakemake.params
    model = params.model
    budgets = list(params.budgets)
    rows = run_model_stage(
        snakemake.input.trace,
        batch=int(wildcards.batch),
        prefix=int(wildcards.prefix),
        budgets=budgets,
        shape=ModelShape.from_config(model["shape"]),
        moe_impls=model["moe_impls"],
        forward_impl=model["forward_impl"],
        parts=bool(params.parts),
        routing=model["routing"],
        skew=model["skew"],
        sglang_files=model["sglang_files"],
        timing=dict(params.timing),
        machine=params.machine,
        distribution=wildcards.distribution,
        attention_fatbin=snakemake.input.attention,
        util_fatbin=snakemake.input.util,
    )
    for budget, path in zip(budgets, snakemake.output.rows, strict=True):
        print(f"N = {budget}: {describe_rows(rows[budget])}")
        write_frame(rows[budget], path)
