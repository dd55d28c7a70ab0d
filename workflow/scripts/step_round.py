from _job import logged

from ddtree_bench.io import write_frame
from ddtree_bench.summary.step import describe_rows

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    from ddtree_bench.k26.shapes import DrafterShape, ModelShape
    from ddtree_bench.stages.round import run_round_stage

    wildcards, params = snakemake.wildcards, snakemake.params
    model, draft = params.model, params.draft
    budgets = list(params.budgets)
    rows = run_round_stage(
        batch=int(wildcards.batch),
        prefix=int(wildcards.prefix),
        budgets=budgets,
        builders=list(params.builders),
        builder_options=dict(params.builder_options),
        shape=ModelShape.from_config(model["shape"]),
        drafter_shape=DrafterShape.from_config(draft["shape"]),
        forward_impl=model["forward_impl"],
        block_size=draft["block_size"],
        follow_budget=draft["follow_budget"],
        topk=int(params.topk),
        routing=model["routing"],
        skew=model["skew"],
        sglang_files=model["sglang_files"],
        timing=dict(params.timing),
        machine=params.machine,
        attention_fatbin=snakemake.input.attention,
        accept_fatbin=snakemake.input.accept,
        stacks=dict(params.stacks),
    )
    for budget, path in zip(budgets, snakemake.output.rows, strict=True):
        print(f"N = {budget}: {describe_rows(rows[budget])}")
        write_frame(rows[budget], path)
