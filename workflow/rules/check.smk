rule check:
    """A builder's trees equal reference's on every request of the trace; a mismatch fails the run (the gpu
    builder's check takes the GPU)."""
    input:
        unpack(check_inputs),
    output:
        check=CHECK,
    log:
        log_of(CHECK),
    wildcard_constraints:
        builder=CHECK_BUILDERS,
    conda:
        "../envs/ddtree-bench.yaml"
    resources:
        gpu=builder_gpus,
    params:
        options=lambda wildcards: builder_options(wildcards.builder),
    script:
        "../scripts/check.py"
