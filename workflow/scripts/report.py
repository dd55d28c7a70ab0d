from pathlib import Path

from _job import logged

from ddtree_bench.io import staged_folder
from ddtree_bench.report import ReportFiles, render_report

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)


def staged(path, folder: Path, stage: Path) -> Path:
    """An output's path in the staging folder (its place under the report's folder)."""
    return stage / Path(path).relative_to(folder)


with logged(snakemake):
    options = snakemake.params.options  # report.compose.ReportOptions, made from the run's settings
    folder = Path(snakemake.output.html).parent
    # rendered into a folder beside the report's, moved into place only when complete
    with staged_folder(folder) as stage:
        render_report(
            summary=snakemake.input.summary,
            shapes=snakemake.input.shapes,
            environment=snakemake.input.environment,
            step_summary=next(iter(snakemake.input.step_summary), None),
            published=list(snakemake.params.published),
            files=ReportFiles(
                staged(snakemake.output.html, folder, stage),
                staged(snakemake.output.markdown, folder, stage),
                figures=[staged(path, folder, stage) for path in snakemake.output.figures],
            ),
            grid=snakemake.params.grid,
            options=options,
        )
