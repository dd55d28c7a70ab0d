import dataclasses
import json

from _job import logged

from ddtree_bench.io import write_frame
from ddtree_bench.stages.timing_job import run

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    correct = None  # the check job compared this builder's trees with reference's on the whole trace
    if "check" in snakemake.input.keys():
        with open(snakemake.input.check) as handle:
            correct = json.load(handle).get("status") == "ok"
    job = dataclasses.replace(snakemake.params.job, correct=correct)
    rows = run(job)
    timed = rows[rows["phase"] == "timed"]
    print(f"job {job.job}: {len(rows)} rows, {len(timed)} timed; status {sorted(set(rows['status']))}")
    print(timed.groupby(["timing", "cache"], dropna=False)["seconds"].describe().to_string())
    write_frame(rows, snakemake.output.bench)
