from _job import logged

from ddtree_bench.traces import generate, save_trace

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    params = snakemake.params
    distribution, depth = snakemake.wildcards.distribution, int(snakemake.wildcards.depth)
    trace = generate(
        distribution,
        params.requests,
        depth,
        params.topk,
        vocab_size=params.vocab_size,
        seed=params.seed,
        device=params.device,
        threads=snakemake.threads,
        drafter=getattr(params, "drafter", None),
    )
    # the generator's metadata: distribution, seed, vocabulary and the device it actually ran on
    save_trace(snakemake.output.trace, trace.top_log_probs, trace.top_token_ids, **trace.metadata)
