"""Run the rest of the round's stage jobs of a configuration directly, one job per call of this tool, and
write each job's rows where the pipeline writes them (results/<machine>/step/<stage>/...): for a GPU machine
without Snakemake, or to run a few jobs by hand. The same stage functions as the rules, with the same
settings taken from the configuration; one process per job, so each job has the GPU's memory to itself.

    python tools/round_stages.py --config config/h200.yaml --sglang-source .sglang \\
        --sglang-files .peers/sglang_files round:1:4096 model:1:4096 draft:64:32768 allreduce:8

A job is ``stage:batch:prefix`` (``allreduce:batch``); stages: attention (every step budget and head
count at this batch and prefix: the verify-attention rule's jobs), model, draft, round, allreduce.
``--forward-impl`` and ``--moe-impls`` override step.model's (e.g. where a MoE kernel cannot be built in
the time at hand). The trace the model jobs build their trees from is generated as the pipeline's trace rule
generates it (the step's distribution and depth).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddtree_bench.io import write_frame
from ddtree_bench.settings import load_settings
from ddtree_bench.traces import TraceSpec, generate, save_trace

STAGES = ("attention", "model", "draft", "round", "allreduce")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        type=Path,
        action="append",
        required=True,
        help="a config file; repeat it to merge later ones over earlier (as Snakemake's --configfile)",
    )
    parser.add_argument("--results", type=Path, help="default: results/<machine>")
    parser.add_argument("--sglang-source", help="SGLang's DDTree file or checkout (the sglang round builder)")
    parser.add_argument("--sglang-files", help="the sglang wheel's extracted files (the MoE kernels)")
    parser.add_argument("--forward-impl")
    parser.add_argument("--moe-impls", help="comma-separated")
    parser.add_argument("--budgets", help="comma-separated: these of the configuration's budgets only")
    parser.add_argument(
        "--sglang-jit", help="a folder of SGLang JIT modules built ahead (tools/prebuild_sglang_jit.py)"
    )
    parser.add_argument("jobs", nargs="+")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(*args.config)
        jobs = [_job(text) for text in args.jobs]
    except ValueError as error:
        print(f"round_stages: {error}", file=sys.stderr)
        return 2
    if args.sglang_jit:
        import os  # noqa: PLC0415

        from ddtree_bench.k26.sglang_jit import PREBUILT_ENV  # noqa: PLC0415

        os.environ[PREBUILT_ENV] = str(Path(args.sglang_jit).resolve())
    step = settings.step_options()
    if args.budgets:
        step["budgets"] = [b for b in step["budgets"] if str(b) in args.budgets.split(",")]
    model, draft = step["model"], step["draft"]
    forward = args.forward_impl or model["forward_impl"]
    moe_impls = args.moe_impls.split(",") if args.moe_impls else model["moe_impls"]
    files = args.sglang_files or model["sglang_files"]
    results = args.results or Path("results") / (settings.machine or "local")
    timing = step["attention_timing"]
    topk = settings.trace_columns

    def write(stage, rows, name):
        for budget, frame in rows.items():
            write_frame(frame, results / "step" / stage / name.format(budget=budget))

    def step_trace() -> Path:
        trace = results / "traces" / f"{step['distribution']}-L{step['depth']}.npz"
        if not trace.is_file():
            spec = TraceSpec(
                step["distribution"],
                settings.trace_requests,
                step["depth"],
                topk,
                vocab_size=settings.vocab_size,
                seed=settings.seed,
            )
            t = generate(spec, device="cpu")
            trace.parent.mkdir(parents=True, exist_ok=True)
            save_trace(trace, t.top_log_probs, t.top_token_ids, **t.metadata)
        return trace

    for stage, batch, prefix in jobs:
        if stage == "attention":
            from ddtree_bench.cuda.loader import BENCH_UTIL_SOURCE, cached_fatbin, kernel_source  # noqa: PLC0415
            from ddtree_bench.stages.attention import run_attention_benchmark  # noqa: PLC0415

            trace = step_trace()
            fatbins = {
                "attention_fatbin": cached_fatbin(kernel_source("verify_attn"), tuple(settings.cuda_archs)),
                "util_fatbin": cached_fatbin(BENCH_UTIL_SOURCE),
            }
            for heads in step["heads"]:
                rows = {
                    budget: run_attention_benchmark(
                        trace,
                        budget,
                        batch,
                        heads=heads,
                        prefix=prefix,
                        impls=step["impls"],
                        flex_kernel_options=step["flex_kernel_options"],
                        sglang_source=step["sglang_triton_source"],
                        timing=timing,
                        machine=settings.machine,
                        distribution=step["distribution"],
                        **fatbins,
                    )
                    for budget in step["budgets"]
                }
                name = (
                    f"{step['distribution']}-L{step['depth']}-N{{budget}}-B{batch}-S{prefix}-H{heads}.parquet"
                )
                write("attention", rows, name)
        elif stage == "model":
            from ddtree_bench.stages.model import run_model_stage  # noqa: PLC0415

            trace = step_trace()
            rows = run_model_stage(
                trace,
                batch=batch,
                prefix=prefix,
                budgets=step["budgets"],
                shape=model["shape"],
                moe_impls=moe_impls,
                forward_impl=forward,
                parts=prefix == min(step["prefix_lengths"]),
                routing=model["routing"],
                skew=model["skew"],
                sglang_files=files,
                timing=timing,
                machine=settings.machine,
                distribution=step["distribution"],
            )
            write(
                "model",
                rows,
                f"{step['distribution']}-L{step['depth']}-N{{budget}}-B{batch}-S{prefix}.parquet",
            )
        elif stage == "draft":
            from ddtree_bench.stages.draft import run_draft_stage  # noqa: PLC0415

            rows = run_draft_stage(
                batch=batch,
                prefix=prefix,
                budgets=step["budgets"],
                shape=draft["shape"],
                vocab_shard=model["shape"].vocab_shard,
                block_size=draft["block_size"],
                follow_budget=draft["follow_budget"],
                topk=topk,
                timing=timing,
                machine=settings.machine,
            )
            write("draft", rows, f"N{{budget}}-B{batch}-S{prefix}.parquet")
        elif stage == "round":
            from ddtree_bench.stages.round import run_round_stage  # noqa: PLC0415

            options = {"sglang": {"module_paths": list(settings.sglang.module_paths)}}
            if args.sglang_source:
                options["sglang"]["source"] = args.sglang_source
            stacks = {
                "stacks": step["round"]["stacks"],
                "max_seconds": step["round"]["max_round_seconds"],
                "attention_files": args.sglang_files or step["sglang_triton_source"],
            }
            rows = run_round_stage(
                batch=batch,
                prefix=prefix,
                budgets=step["budgets"],
                builders=step["round"]["builders"],
                builder_options=options,
                shape=model["shape"],
                drafter_shape=draft["shape"],
                forward_impl=forward,
                block_size=draft["block_size"],
                follow_budget=draft["follow_budget"],
                topk=topk,
                routing=model["routing"],
                skew=model["skew"],
                sglang_files=files,
                timing=timing,
                machine=settings.machine,
                stacks=stacks,
            )
            write("round", rows, f"N{{budget}}-B{batch}-S{prefix}.parquet")
        else:
            from ddtree_bench.stages.allreduce import run_allreduce_stage  # noqa: PLC0415

            rows = run_allreduce_stage(
                batch=batch,
                budgets=step["budgets"],
                shape=model["shape"],
                world_size=model["shape"].tp,
                block_size=draft["block_size"],
                follow_budget=draft["follow_budget"],
                topk=topk,
                timing=timing,
                machine=settings.machine,
            )
            write("allreduce", rows, f"N{{budget}}-B{batch}.parquet")
        print(f"{stage}:{batch}:{prefix}: done", flush=True)
    return 0


def _job(text: str) -> tuple[str, int, int]:
    parts = text.split(":")
    if parts[0] not in STAGES or len(parts) != (2 if parts[0] == "allreduce" else 3):
        raise ValueError(
            f"job {text!r}: expected stage:batch:prefix (allreduce:batch), stage one of {STAGES}"
        )
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        raise ValueError(f"job {text!r}: batch and prefix must be integers") from None
    return parts[0], numbers[0], numbers[1] if len(numbers) > 1 else 0


if __name__ == "__main__":
    sys.exit(main())
