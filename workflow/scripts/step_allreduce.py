from _job import logged

from ddtree_bench.io import write_frame
from ddtree_bench.summary.step import describe_rows

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    from ddtree_bench.k26.shapes import ModelShape
    from ddtree_bench.stages.allreduce import run_allreduce_stage

    wildcards, params = snakemake.wildcards, snakemake.params
    budgets = list(params.budgets)
    rows = run_allreduce_stage(
        batch=int(wildcards.batch),
        budgets=budgets,
        shape=ModelShape.from_config(params.model_shape),
        world_size=params.model_shape["tp"],
        block_size=params.draft["block_size"],
        follow_budget=params.draft["follow_budget"],
        topk=int(params.topk),
        timing=dict(params.timing),
        machine=params.machine,
    )
    for budget, path in zip(budgets, snakemake.output.rows, strict=True):
        print(f"N = {budget}: {describe_rows(rows[budget])}")
        write_frame(rows[budget], path)
