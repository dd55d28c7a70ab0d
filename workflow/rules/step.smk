rule step_attention:
    """Time the tree-verify attention of one (budget, batch, prefix length, heads): every impl, same inputs."""
    input:
        trace=TRACE,
        attention=ATTENTION_FATBIN,
        util=UTIL_FATBIN,
    output:
        rows=STEP_ATTENTION,
    log:
        log_of(STEP_ATTENTION),
    wildcard_constraints:
        prefix=r"\d+",
        heads=r"\d+",
    conda:
        "../envs/ddtree-bench.yaml"
    threads: TIMING_THREADS
    resources:
        timing_slot=1,
        gpu=1,
    params:
        impls=STEP["impls"],
        flex_kernel_options=STEP["flex_kernel_options"],
        sglang_triton_source=STEP["sglang_triton_source"],
        timing=STEP["attention_timing"],
        machine=MACHINE,
    script:
        "../scripts/step_attention.py"


rule step_accept:
    """Time the tree accept of one (budget, batch): GPU kernel, host-inclusive, CPU walk, empty-kernel floor."""
    input:
        trace=TRACE,
        accept=ACCEPT_FATBIN,
        util=UTIL_FATBIN,
    output:
        rows=STEP_ACCEPT,
    log:
        log_of(STEP_ACCEPT),
    conda:
        "../envs/ddtree-bench.yaml"
    threads: TIMING_THREADS
    resources:
        timing_slot=1,
        gpu=1,
    params:
        timing=STEP["timing"],
        machine=MACHINE,
    script:
        "../scripts/step_accept.py"


rule step_peaks:
    """The GPU's measured peaks, once per machine: bf16 GEMM, device copy, the empty-kernel floor."""
    input:
        util=UTIL_FATBIN,
    output:
        rows=PEAKS,
    log:
        f"{LOGS}/step/peaks.log",
    conda:
        "../envs/ddtree-bench.yaml"
    threads: TIMING_THREADS
    resources:
        timing_slot=1,
        gpu=1,
    params:
        timing=STEP["timing"],
        machine=MACHINE,
    script:
        "../scripts/step_peaks.py"


rule step_model:
    """The target's verify forward on one GPU's share of Kimi K2.6 and (smallest prefix) its parts: every budget."""
    input:
        trace=TRACE,
        attention=ATTENTION_FATBIN,
        util=UTIL_FATBIN,
    output:
        rows=round_outputs(STEP_MODEL),
    log:
        f"{LOGS}/step/model/{{distribution}}-L{{depth}}-B{{batch}}-S{{prefix}}.log",
    wildcard_constraints:
        prefix=r"\d+",
    conda:
        "../envs/ddtree-bench.yaml"
    threads: TIMING_THREADS
    resources:
        timing_slot=1,
        gpu=1,
    params:
        budgets=STEP["budgets"],
        model=ROUND["model"] | {"shape": ROUND["model"]["shape"].as_dict()},
        parts=lambda wildcards: int(wildcards.prefix) == min(STEP["prefix_lengths"]),
        timing=STEP["attention_timing"],
        machine=MACHINE,
    script:
        "../scripts/step_model.py"


rule step_draft:
    """The drafter's forward, LM-head shard, normaliser and top-K at one (batch, prefix): every budget."""
    input:
        util=UTIL_FATBIN,
    output:
        rows=round_outputs(STEP_DRAFT),
    log:
        f"{LOGS}/step/draft/B{{batch}}-S{{prefix}}.log",
    wildcard_constraints:
        prefix=r"\d+",
    conda:
        "../envs/ddtree-bench.yaml"
    threads: TIMING_THREADS
    resources:
        timing_slot=1,
        gpu=1,
    params:
        budgets=STEP["budgets"],
        draft=ROUND["draft"] | {"shape": ROUND["draft"]["shape"].as_dict()},
        vocab_shard=ROUND["model"]["shape"].vocab_shard,
        topk=TRACE_COLUMNS,
        timing=STEP["attention_timing"],
        machine=MACHINE,
    script:
        "../scripts/step_draft.py"


rule step_allreduce:
    """The round's tensor-parallel collectives with NCCL on this host's GPUs at one batch: every budget."""
    output:
        rows=round_outputs(STEP_ALLREDUCE),
    log:
        f"{LOGS}/step/allreduce/B{{batch}}.log",
    conda:
        "../envs/ddtree-bench.yaml"
    threads: TIMING_THREADS
    resources:
        timing_slot=1,
        gpu=1,
    params:
        budgets=STEP["budgets"],
        allreduce=ROUND["allreduce"],
        draft=ROUND["draft"] | {"shape": ROUND["draft"]["shape"].as_dict()},
        model_shape=ROUND["model"]["shape"].as_dict(),
        topk=TRACE_COLUMNS,
        timing=STEP["attention_timing"],
        machine=MACHINE,
    script:
        "../scripts/step_allreduce.py"


rule step_round:
    """Whole rounds per builder at one (batch, prefix): gpu as one graph, CPU builders split; every budget."""
    input:
        unpack(lambda wildcards: round_inputs()),
    output:
        rows=round_outputs(STEP_ROUND),
    log:
        f"{LOGS}/step/round/B{{batch}}-S{{prefix}}.log",
    wildcard_constraints:
        prefix=r"\d+",
    conda:
        "../envs/ddtree-bench.yaml"
    threads: TIMING_THREADS
    resources:
        timing_slot=1,
        gpu=1,
    params:
        budgets=STEP["budgets"],
        builders=ROUND["round"]["builders"],
        builder_options={
            b: builder_options(b)
            for b in sorted({*ROUND["round"]["builders"], catalog.SGLANG})
            if b in catalog.BUILDERS
        },
        stacks={
            "stacks": ROUND["round"]["stacks"],
            "max_seconds": ROUND["round"]["max_round_seconds"],
            "attention_files": STEP["sglang_triton_source"],
        },
        model=ROUND["model"] | {"shape": ROUND["model"]["shape"].as_dict()},
        draft=ROUND["draft"] | {"shape": ROUND["draft"]["shape"].as_dict()},
        topk=TRACE_COLUMNS,
        timing=STEP["attention_timing"],
        machine=MACHINE,
    script:
        "../scripts/step_round.py"


rule step_unavailable:
    """Rows saying why a step stage has no timings here (no usable GPU, gpu: off): one per impl."""
    output:
        rows=STEP_UNAVAILABLE,
    log:
        f"{LOGS}/step/{{stage}}-unavailable.log",
    wildcard_constraints:
        stage="|".join(STEP_STAGES),
    conda:
        "../envs/ddtree-bench.yaml"
    params:
        reason=GPU_REASON,
        impls=STEP["impls"],
        moe_impls=ROUND["model"]["moe_impls"],
        forward_impl=ROUND["model"]["forward_impl"],
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
