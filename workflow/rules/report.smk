rule render_report:
    """report/index.html (self-contained, figures embedded) and report/summary.md, beside published results;
    with the step stages' tables and the step-time breakdown."""
    input:
        summary=SUMMARY,
        shapes=SHAPES,
        environment=ENVIRONMENT,
        step_summary=STEP_TARGETS,
        published=published_summaries(),
        published_step=published_step_summaries(),
    output:
        html=report(
            REPORT_HTML,
            caption="../report/index.rst",
            category="Report",
            labels={"file": "index.html"},
        ),
        markdown=report(
            REPORT_MD,
            caption="../report/markdown.rst",
            category="Report",
            labels={"file": "summary.md"},
        ),
        figures=[
            report(
                f"{REPORT_DIR}/figures/{name}.png",
                caption=f"../report/{name}.rst",
                category="Figures",
                labels={"figure": name.replace("_", " ")},
            )
            for name in FIGURES
        ],
    log:
        f"{LOGS}/report.log",
    conda:
        "../envs/ddtree-bench.yaml"
    params:
        # what the report shows, made from the settings (report.compose.ReportOptions.from_settings); its
        # fields, as plain values, are what Snakemake's rerun decisions compare
        options=REPORT_OPTIONS,
        fields=dataclasses.asdict(REPORT_OPTIONS),
        # every published machine, those with the step stages alone included (their files are inputs above)
        published=published_results_folders(),
        # the configured grid: the report refuses a summary that does not hold exactly it, and a change of
        # any of these lists reruns the report (as it reruns the aggregation, whose inputs are exactly
        # the configured jobs' files)
        grid=GRID,
    script:
        "../scripts/report.py"
