from _job import logged

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    from ddtree_bench import stages

    job = snakemake.params.job
    stages.write_rows(stages.run(job), list(snakemake.output), getattr(job, "budgets", ()))
