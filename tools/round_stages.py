"""Run step-stage jobs of a configuration directly, where Snakemake is absent (a GPU machine without it), and
write each job's rows where the workflow writes them (results/<machine>/step/<stage>/...). The same entry as
``ddtree-bench stage`` (``stages.run_jobs``): each job made from the configuration as the workflow makes it,
its missing trace and fatbins made first.

    python tools/round_stages.py --config config/h200.yaml --config config/h200-sources.yaml \\
        round:batch=1,prefix=4096 allreduce:batch=8

A job selector is ``stage`` (every configured job of the stage) or ``stage:key=value,...`` (those with these
wildcards: ``catalog.STAGES``' paths name them). Where SGLang's code is (its DDTree file, the sglang wheel's
extracted files) is the configuration's (``sglang.source``, ``step.attention.sglang_triton_source``,
``step.model.sglang_files``: config/h200-sources.yaml). The flags override fields of the jobs that have them:
``--forward-impl`` and ``--moe-impls`` (step.model's), ``--budgets`` (these of the configuration's budgets,
and of its chain blocks' budgets, block - 1, only); ``--set field=value`` any other field (a YAML value; a
field no job picked has is refused).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ddtree_bench import stages
from ddtree_bench.paths import layout
from ddtree_bench.settings import layered_settings


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", type=Path, action="append", required=True, help="over config/config.yaml; repeat to merge"
    )
    parser.add_argument("--results", type=Path, help="default: results/<machine>")
    parser.add_argument("--forward-impl")
    parser.add_argument("--moe-impls", help="comma-separated")
    parser.add_argument("--budgets", help="comma-separated: these of the configuration's budgets only")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--sglang-jit", help="SGLang JIT modules built ahead (tools/prebuild_sglang_jit.py)")
    parser.add_argument("jobs", nargs="+")
    args = parser.parse_args(argv)
    try:
        settings = layered_settings(args.config)  # config/config.yaml, then each --config in order
        fields = overrides(args, settings)
        if args.sglang_jit:
            from ddtree_bench.integrations.sglang import PREBUILT_ENV  # noqa: PLC0415

            os.environ[PREBUILT_ENV] = str(Path(args.sglang_jit).resolve())
        stages.run_jobs(settings, args.jobs, layout(settings, args.results), fields)
    except ValueError as error:
        print(f"round_stages: {error}", file=sys.stderr)
        return 2
    return 0


def overrides(args, settings) -> dict:
    """The job fields the flags set."""
    fields = stages.parse_fields(args.set)
    if args.forward_impl:
        fields["forward_impl"] = args.forward_impl
    if args.moe_impls:
        fields["moe_impls"] = tuple(args.moe_impls.split(","))
    if args.budgets:
        wanted = {int(b) for b in args.budgets.split(",")}
        step = settings.step_options()
        chains = {int(b) - 1 for b in step["round"]["chain_blocks"]}  # the chain's budgets: block - 1
        fields["budgets"] = tuple(sorted(b for b in {*step["budgets"], *chains} if b in wanted))
    return fields


if __name__ == "__main__":
    sys.exit(main())
