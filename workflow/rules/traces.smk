rule trace:
    """One generated trace per (distribution, depth): R = max batch size requests, K = the trace columns."""
    output:
        trace=TRACE,
    log:
        log_of(TRACE),
    wildcard_constraints:
        distribution="uniform|peaked|bf16|drafter|drafter-bf16|drafter-k2.6",
    conda:
        "../envs/ddtree-bench.yaml"
    threads: TIMING_THREADS
    params:
        requests=TRACE_REQUESTS,
        topk=TRACE_COLUMNS,
        vocab_size=SETTINGS.vocab_size,
        seed=SETTINGS.seed,
        device=SETTINGS.trace_device,
        # the configured drafter's parameters (None for the others, and for an acceptance profile's own
        # drafter, whose parameters are the catalog's: changing them reruns only these)
        drafter=lambda wildcards: SETTINGS.drafter_params(wildcards.distribution),
    script:
        "../scripts/trace.py"


rule trace_recorded:
    """The user's recorded trace, validated and cut to R requests, the depth and K columns."""
    input:
        recorded=SETTINGS.recorded_trace or [],
    output:
        trace=TRACE.replace("{distribution}", "recorded"),
    log:
        log_of(TRACE.replace("{distribution}", "recorded")),
    conda:
        "../envs/ddtree-bench.yaml"
    params:
        requests=TRACE_REQUESTS,
        topk=TRACE_COLUMNS,
    script:
        "../scripts/trace_recorded.py"


rule tree_shape:
    """Nodes per tree depth of reference's trees on every request of a trace (the report's tree shape)."""
    input:
        trace=TRACE,
    output:
        shape=SHAPE,
    log:
        log_of(SHAPE),
    conda:
        "../envs/ddtree-bench.yaml"
    script:
        "../scripts/tree_shape.py"
