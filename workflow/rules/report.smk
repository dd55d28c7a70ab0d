rule render_report:
    """report/index.html (self-contained, figures embedded) and report/summary.md, beside published results."""
    input:
        summary=SUMMARY,
        shapes=SHAPES,
        environment=ENVIRONMENT,
        published=published_summaries(),
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
        machine=MACHINE,
        depth=DEPTHS[0],
        distribution=DISTRIBUTIONS[0],
    script:
        "../scripts/report.py"
