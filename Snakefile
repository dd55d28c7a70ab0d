"""ddtree-bench: how much faster is a GPU DDTree tree builder than SGLang's CPU builder, on identical inputs.

    snakemake --cores 1 report     # everything: traces, builds, checks, timings, summary, report/
    snakemake --cores 1 -n         # what would run

Stages (one rule file each, in workflow/rules/): build, traces, check, bench, step (verify attention, tree
accept, the GPU's peaks), aggregate, report.
"""

import sys
from pathlib import Path

from snakemake.utils import min_version, validate

from ddtree_bench.config import (
    check_layering,
    check_output_paths,
    coerce_numeric_strings,
    check_published_answer,
    read_config_file,
)
from ddtree_bench.settings import Settings
from ddtree_bench.summary.files import check_published

min_version("9.0")


include: "workflow/rules/bad_input.smk"
include: "workflow/rules/snakemake_fixes.smk"


# One layering rule (docs/configuration.md): config/config.yaml, then every --configfile in order, then
# --config. Snakemake keeps only the last of several --configfile options (`ddtree-bench workflow`, which make
# runs, gives them as one list): refused here, as is --replace-workflow-config. Every file is read here too:
# a YAML error, or a key given twice at any depth (YAML keeps the last silently), is one line naming the file
# and the line. (Snakemake reads the --configfile files before this file runs: a syntax error there is its own
# message, without file or line; `ddtree-bench workflow ARGS` reads them first and names both.)
try:
    if Path(sys.argv[0]).name in (
        "snakemake",
        "__main__.py",
    ):  # Snakemake's own command line
        check_layering(
            sys.argv[1:],
            workflow.config_settings.configfiles,
            workflow.config_settings.replace_workflow_config,
        )
    for path in ["config/config.yaml", *workflow.config_settings.configfiles]:
        read_config_file(path)
except ValueError as error:
    bad_input(error)


configfile: "config/config.yaml"


# Snakemake's own report (snakemake --report report.zip): this description, and the outputs the rules mark.
report: "workflow/report/workflow.rst"


# The settings, built and checked once (every rule reads them): one clear line for a bad configuration,
# before any job: the package's checks first (they name the problem), then Snakemake's own validation of the
# checked mapping (defaults filled) against the same schema.
SCHEMA = "workflow/schemas/config.schema.yaml"
try:
    # --config budgets=[8,16] arrives as strings: those numbers become numbers (a config file's strings stay)
    coerce_numeric_strings(
        config, workflow.config_settings.config, Path(workflow.basedir) / SCHEMA
    )
    SETTINGS = Settings.from_config(config, Path(workflow.basedir) / SCHEMA)
    # the results folder and the report's: a file written there and removed (read-only, a full disk)
    check_output_paths(SETTINGS)
    check_published_answer(SETTINGS)
    check_published()  # every published file the report reads opens, with the columns it needs
except ValueError as error:
    bad_input(error)
config.clear()
config.update(SETTINGS.as_config())
validate(config, SCHEMA)


include: "workflow/rules/common.smk"
include: "workflow/rules/build.smk"
include: "workflow/rules/traces.smk"
include: "workflow/rules/check.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/step.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/report.smk"


localrules:
    all,
    report,


rule all:
    input:
        summary=SUMMARY,
        environment=ENVIRONMENT,
        step_summary=STEP_TARGETS,
        html=REPORT_HTML,
        markdown=REPORT_MD,


rule report:
    input:
        html=REPORT_HTML,
        markdown=REPORT_MD,


# A run that made the report ends by saying where it is.
onsuccess:
    if Path(REPORT_HTML).is_file():
        print(f"ddtree-bench: report: {REPORT_HTML} (and {REPORT_MD})")
