rule bench:
    """Time one configuration (builder, budget, batch, depth, distribution) in one of its timing.jobs
    independent jobs ({rep}: none for the first, -r2, -r3, ...); never beside another job. The gpu builder:
    kernel (CUDA events), graph replay and host-inclusive, with the floor, on the GPU.
    """
    input:
        unpack(bench_inputs),
    output:
        bench=BENCH,
    log:
        log_of(BENCH),
    wildcard_constraints:
        builder=BENCH_BUILDERS,
        rep=r"(?:-r(?:[2-9]|[1-9]\d+))?",
    conda:
        "../envs/ddtree-bench.yaml"
    threads: TIMING_THREADS
    resources:
        timing_slot=1,
        gpu=builder_gpus,
    params:
        # the job travels to the script as an object; its fields, as plain values, are what Snakemake's
        # rerun decisions compare
        job=timing_job,
        fields=lambda wildcards: stages.job_fields(timing_job(wildcards)),
    script:
        "../scripts/bench.py"


rule unavailable:
    """One row saying why a builder left out here (SGLang absent, no GPU) has no timings."""
    output:
        bench=BENCH_UNAVAILABLE,
    log:
        log_of(BENCH_UNAVAILABLE),
    conda:
        "../envs/ddtree-bench.yaml"
    params:
        reason=lambda wildcards: UNAVAILABLE[wildcards.builder],
        machine=MACHINE,
    script:
        "../scripts/unavailable.py"
