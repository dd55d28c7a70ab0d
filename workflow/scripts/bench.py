import inspect
import json

from _job import logged

from ddtree_bench.io import write_frame
from ddtree_bench.stages.build import run_benchmark

snakemake = snakemake  # noqa: F821 (the job object Snakemake's script preamble defines)

with logged(snakemake):
    wildcards, params, timing = snakemake.wildcards, snakemake.params, snakemake.params.timing
    if wildcards.builder == "gpu":
        from ddtree_bench.stages.build_gpu import run_gpu_benchmark as run
    else:
        run = run_benchmark
    correct = None  # the check job compared this builder's trees with reference's on the whole trace
    if "check" in snakemake.input.keys():
        with open(snakemake.input.check) as handle:
            correct = json.load(handle).get("status") == "ok"
    extra = dict(
        max_seconds=timing["max_seconds"],
        min_repeats=timing["min_repeats"],
        max_repeats=timing["max_repeats"],
        correct=correct,
        input_columns=params.input_columns,
        in_situ=bool(params.in_situ),
    )
    accepted = inspect.signature(run).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        extra = {key: value for key, value in extra.items() if key in accepted}
    rows = run(
        wildcards.builder,
        snakemake.input.trace,
        int(wildcards.budget),
        int(wildcards.batch),
        warmup=timing["warmup"],
        repeats=timing["repeats"],
        min_seconds=timing["min_seconds"],
        machine=params.machine,
        distribution=wildcards.distribution,
        builder_options=dict(params.options),
        **extra,
    )
    if params.in_situ and params.in_situ_reason and (rows["status"] == "ok").all():
        import pandas as pd

        from ddtree_bench.stages.insitu import unavailable_like

        reason = f"in-situ timing needs a CUDA GPU: {params.in_situ_reason}"
        rows = pd.concat([rows, unavailable_like(rows, reason)], ignore_index=True)
    elif params.in_situ and wildcards.builder != "gpu" and (rows["status"] == "ok").all():
        import pandas as pd

        from ddtree_bench.stages.insitu import run_insitu_benchmark

        extra.pop("in_situ", None)
        in_situ = run_insitu_benchmark(
            wildcards.builder,
            snakemake.input.trace,
            int(wildcards.budget),
            int(wildcards.batch),
            warmup=timing["warmup"],
            repeats=timing["repeats"],
            min_seconds=timing["min_seconds"],
            machine=params.machine,
            distribution=wildcards.distribution,
            builder_options=dict(params.options),
            **extra,
        )
        rows = pd.concat([rows, in_situ], ignore_index=True)
    # which of the configuration's independent timing jobs this is (summary.spread: the spread across them)
    rows["job"] = int(params.job)
    timed = rows[rows["phase"] == "timed"]
    print(f"job {params.job}: {len(rows)} rows, {len(timed)} timed; status {sorted(set(rows['status']))}")
    print(timed.groupby(["timing", "cache"], dropna=False)["seconds"].describe().to_string())
    write_frame(rows, snakemake.output.bench)
