rule check:
    """A CPU builder's trees equal reference's on every request of the trace; a mismatch fails the run."""
    input:
        unpack(check_inputs),
    output:
        check=f"{RESULTS}/check/{{builder}}/{{distribution}}-L{{depth}}-N{{budget}}.json",
    log:
        f"{LOGS}/check/{{builder}}/{{distribution}}-L{{depth}}-N{{budget}}.log",
    wildcard_constraints:
        builder=r"sglang|native|native\-mt",
    conda:
        "../envs/ddtree-bench.yaml"
    params:
        options=lambda wildcards: builder_options(wildcards.builder),
    script:
        "../scripts/check.py"


rule check_gpu:
    """The GPU kernel's trees equal reference's on every request of the trace."""
    input:
        unpack(check_inputs),
    output:
        check=f"{RESULTS}/check/{{builder}}/{{distribution}}-L{{depth}}-N{{budget}}.json",
    log:
        f"{LOGS}/check/{{builder}}/{{distribution}}-L{{depth}}-N{{budget}}.log",
    wildcard_constraints:
        builder="gpu",
    conda:
        "../envs/ddtree-bench.yaml"
    resources:
        gpu=1,
    params:
        options=lambda wildcards: builder_options(wildcards.builder),
    script:
        "../scripts/check.py"
