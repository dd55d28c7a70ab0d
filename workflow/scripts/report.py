from _job import logged

from ddtree_bench.report import render_report

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    render_report(
        summary=snakemake.input.summary,
        shapes=snakemake.input.shapes,
        environment=snakemake.input.environment,
        published=list(snakemake.input.published),
        html=snakemake.output.html,
        markdown=snakemake.output.markdown,
        figures=list(snakemake.output.figures),
        depth=snakemake.params.depth,
        distribution=snakemake.params.distribution,
    )
