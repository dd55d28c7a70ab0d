rule aggregate:
    """Median, p10, p90 and n of every configuration's timed calls; the trees' shape; this machine's setup."""
    input:
        unpack(build_outputs),
        bench=bench_outputs(),
        shapes=shape_outputs(),
    output:
        summary=report(
            SUMMARY,
            caption="../report/summary.rst",
            category="Results",
            labels={"file": "summary.parquet"},
        ),
        shapes=SHAPES,
        environment=report(
            ENVIRONMENT,
            caption="../report/environment.rst",
            category="Results",
            labels={"file": "environment.json"},
        ),
    log:
        f"{LOGS}/aggregate.log",
    conda:
        "../envs/ddtree-bench.yaml"
    params:
        # the settings environment.json records, one param per group (settings.RECORDED): a change of the
        # report's own settings (report_dir, throughput) reruns nothing here
        **SETTINGS.recorded(),
        machine=MACHINE,
        unavailable=UNAVAILABLE,
        nvcc=nvcc_path(),
    script:
        "../scripts/aggregate.py"
