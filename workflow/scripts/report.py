from _job import logged

from ddtree_bench.report import ReportFiles, render_report

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    step = snakemake.params.step
    render_report(
        summary=snakemake.input.summary,
        shapes=snakemake.input.shapes,
        environment=snakemake.input.environment,
        step_summary=next(iter(snakemake.input.step_summary), None),
        published=list(snakemake.input.published),
        files=ReportFiles(
            snakemake.output.html, snakemake.output.markdown, figures=list(snakemake.output.figures)
        ),
        depth=snakemake.params.depth,
        distribution=snakemake.params.distribution,
        step_layers=step["layers"],
        step_depth=step["depth"],
        step_distribution=step["distribution"],
        step_enabled=step["enabled"],
        throughput_options=dict(snakemake.params.throughput),
        distributions=list(snakemake.params.distributions),
        profiles=list(snakemake.params.profiles),
        published_answer=snakemake.params.published_answer,
        grid=snakemake.params.grid,
    )
