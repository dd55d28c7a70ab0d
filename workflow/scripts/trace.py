from _job import logged

from ddtree_bench.traces import generate_trace, save_trace

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    params = snakemake.params
    distribution, depth = snakemake.wildcards.distribution, int(snakemake.wildcards.depth)
    lp, ids = generate_trace(
        distribution,
        params.requests,
        depth,
        params.topk,
        vocab_size=params.vocab_size,
        seed=params.seed,
        device=params.device,
        threads=snakemake.threads,
    )
    metadata = dict(distribution=distribution, seed=params.seed, vocab_size=params.vocab_size)
    save_trace(snakemake.output.trace, lp, ids, **metadata)
