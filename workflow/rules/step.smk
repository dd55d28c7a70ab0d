# One rule per step stage, generated from the catalog (catalog.STAGES): its files are the stage's pattern
# (paths.Layout.step), its inputs and params the job its module makes (stages/<name>.py Job.from_settings).
# The job travels to the script as an object; its fields, as plain values, are the params Snakemake's rerun
# decisions compare.


for _stage in catalog.STAGES.values():

    rule:
        name:
            _stage.rule
        input:
            unpack(stage_rule_inputs(_stage.name)),
        output:
            rows=step_files(_stage.name),
        log:
            LAYOUT.step_log(_stage.name),
        wildcard_constraints:
            prefix=r"\d+",
            heads=r"\d+",
        conda:
            "../envs/ddtree-bench.yaml"
        threads: TIMING_THREADS
        resources:
            timing_slot=1,
            gpu=1 if _stage.gpu else 0,
        params:
            job=stage_rule_job(_stage.name),
            fields=stage_rule_fields(_stage.name),
        script:
            "../scripts/stage.py"


rule step_unavailable:
    """Rows saying why a step stage has no timings here (no usable GPU, gpu: off): one per impl."""
    output:
        rows=STEP_UNAVAILABLE,
    log:
        f"{LOGS}/step/{{stage}}-unavailable.log",
    wildcard_constraints:
        stage="|".join(STEP_STAGES) or "^$",
    conda:
        "../envs/ddtree-bench.yaml"
    params:
        reason=GPU_REASON,
        impls=lambda wildcards: stages.configured_impls(wildcards.stage, SETTINGS),
        machine=MACHINE,
    script:
        "../scripts/step_unavailable.py"


rule aggregate_step:
    """Median, p10, p90 and n of every step configuration, its TFLOP/s and TB/s as % of the measured peaks."""
    input:
        rows=step_outputs(),
    output:
        summary=report(
            STEP_SUMMARY,
            caption="../report/step_summary.rst",
            category="Results",
            labels={"file": "step_summary.parquet"},
        ),
    log:
        f"{LOGS}/aggregate_step.log",
    conda:
        "../envs/ddtree-bench.yaml"
    script:
        "../scripts/aggregate_step.py"
