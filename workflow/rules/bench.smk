rule bench:
    """Time one CPU configuration (builder, budget, batch, depth, distribution); never beside another job."""
    input:
        unpack(bench_inputs),
    output:
        bench=f"{RESULTS}/bench/{{builder}}/{{distribution}}-L{{depth}}-N{{budget}}-B{{batch}}.parquet",
    log:
        f"{LOGS}/bench/{{builder}}/{{distribution}}-L{{depth}}-N{{budget}}-B{{batch}}.log",
    wildcard_constraints:
        builder=r"sglang|reference|native|native\-mt",
    conda:
        "../envs/ddtree-bench.yaml"
    threads: TIMING_THREADS
    resources:
        timing_slot=1,
    params:
        options=lambda wildcards: builder_options(wildcards.builder),
        timing=TIMING,
        machine=MACHINE,
        input_columns=INPUT_COLUMNS,
        in_situ=IN_SITU,
        in_situ_reason=IN_SITU_REASON,
    script:
        "../scripts/bench.py"


rule bench_gpu:
    """Time one GPU configuration: kernel (CUDA events), graph replay and host-inclusive, with the floor."""
    input:
        unpack(bench_inputs),
    output:
        bench=f"{RESULTS}/bench/{{builder}}/{{distribution}}-L{{depth}}-N{{budget}}-B{{batch}}.parquet",
    log:
        f"{LOGS}/bench/{{builder}}/{{distribution}}-L{{depth}}-N{{budget}}-B{{batch}}.log",
    wildcard_constraints:
        builder="gpu",
    conda:
        "../envs/ddtree-bench.yaml"
    threads: TIMING_THREADS
    resources:
        timing_slot=1,
        gpu=1,
    params:
        options=lambda wildcards: builder_options(wildcards.builder),
        timing=TIMING,
        machine=MACHINE,
        input_columns=INPUT_COLUMNS,
        in_situ=IN_SITU,
        in_situ_reason=IN_SITU_REASON,
    script:
        "../scripts/bench.py"


rule unavailable:
    """One row saying why a builder left out here (SGLang absent, no GPU) has no timings."""
    output:
        bench=f"{RESULTS}/bench/{{builder}}/unavailable.parquet",
    log:
        f"{LOGS}/bench/{{builder}}/unavailable.log",
    conda:
        "../envs/ddtree-bench.yaml"
    params:
        reason=lambda wildcards: UNAVAILABLE[wildcards.builder],
        machine=MACHINE,
    script:
        "../scripts/unavailable.py"
