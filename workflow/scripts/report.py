from _job import logged

from ddtree_bench.report import ReportFiles, render_report

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    options = snakemake.params.options  # report.compose.ReportOptions, made from the run's settings
    render_report(
        summary=snakemake.input.summary,
        shapes=snakemake.input.shapes,
        environment=snakemake.input.environment,
        step_summary=next(iter(snakemake.input.step_summary), None),
        published=list(snakemake.input.published),
        files=ReportFiles(
            snakemake.output.html, snakemake.output.markdown, figures=list(snakemake.output.figures)
        ),
        grid=snakemake.params.grid,
        options=options,
    )
