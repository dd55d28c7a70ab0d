from _job import logged

from ddtree_bench.traces import TraceSpec, generate, save_trace

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    params = snakemake.params
    distribution, depth = snakemake.wildcards.distribution, int(snakemake.wildcards.depth)
    trace = generate(
        TraceSpec(distribution, params.requests, depth, params.topk, params.vocab_size, params.seed),
        device=params.device,
        threads=snakemake.threads,
        drafter=getattr(params, "drafter", None),
    )
    # the generator's metadata: distribution, seed, vocabulary and the device it actually ran on
    save_trace(snakemake.output.trace, trace.top_log_probs, trace.top_token_ids, **trace.metadata)
