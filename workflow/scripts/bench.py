import json

from _job import logged

from ddtree_bench.io import write_frame
from ddtree_bench.stages.timing_job import TimingJob, run

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    wildcards, params = snakemake.wildcards, snakemake.params
    correct = None  # the check job compared this builder's trees with reference's on the whole trace
    if "check" in snakemake.input.keys():
        with open(snakemake.input.check) as handle:
            correct = json.load(handle).get("status") == "ok"
    job = TimingJob(
        builder=wildcards.builder,
        trace_path=snakemake.input.trace,
        budget=int(wildcards.budget),
        batch=int(wildcards.batch),
        timing=dict(params.timing),
        machine=params.machine,
        distribution=wildcards.distribution,
        builder_options=dict(params.options),
        input_columns=params.input_columns,
        correct=correct,
        depth=int(wildcards.depth),
        job=int(params.job),
        in_situ=bool(params.in_situ),
        in_situ_reason=params.in_situ_reason,
    )
    rows = run(job)
    timed = rows[rows["phase"] == "timed"]
    print(f"job {job.job}: {len(rows)} rows, {len(timed)} timed; status {sorted(set(rows['status']))}")
    print(timed.groupby(["timing", "cache"], dropna=False)["seconds"].describe().to_string())
    write_frame(rows, snakemake.output.bench)
