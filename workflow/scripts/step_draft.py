from _job import logged

from ddtree_bench.io import write_frame
from ddtree_bench.summary.step import describe_rows

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    from ddtree_bench.k26.shapes import DrafterShape
    from ddtree_bench.stages.draft import run_draft_stage

    wildcards, params = snakemake.wildcards, snakemake.params
    draft = params.draft
    budgets = list(params.budgets)
    rows = run_draft_stage(
        batch=int(wildcards.batch),
        prefix=int(wildcards.prefix),
        budgets=budgets,
        shape=DrafterShape.from_config(draft["shape"]),
        vocab_shard=int(params.vocab_shard),
        block_size=draft["block_size"],
        follow_budget=draft["follow_budget"],
        topk=int(params.topk),
        timing=dict(params.timing),
        machine=params.machine,
        util_fatbin=snakemake.input.util,
    )
    for budget, path in zip(budgets, snakemake.output.rows, strict=True):
        print(f"N = {budget}: {describe_rows(rows[budget])}")
        write_frame(rows[budget], path)
