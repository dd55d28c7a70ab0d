"""The workflow configuration: defaults, the schema, and bad values failing with one clear line before any job
(in the library and through Snakemake)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import yaml
from workflow_copy import ROOT, ddtree_bench_workflow, error_lines, snakemake, workdir_copy

from ddtree_bench.builders import BUILDER_NAMES
from ddtree_bench.config import (
    ATTENTION_IMPLS,
    BUILDERS,
    DISTRIBUTIONS,
    check_builders_run_here,
    check_config,
    check_layering,
    check_output_paths,
    coerce_numeric_strings,
    layered_config,
    load_config,
    load_schema,
    merge_config,
    read_config_file,
)
from ddtree_bench.cuda.loader import gpu_unavailable_reason
from ddtree_bench.io import check_writable
from ddtree_bench.settings import NOT_RECORDED, RECORDED, Settings, merge_recorded
from ddtree_bench.traces import DISTRIBUTIONS as TRACE_DISTRIBUTIONS
from ddtree_bench.traces import save_trace


def default_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def test_default_config_is_valid_and_has_the_issue_defaults():
    config = load_config(ROOT / "config" / "config.yaml")
    # CPU-sized: the published H200 run's grid (the full grid is config/full.yaml)
    assert config["budgets"] == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert config["acceptance_profiles"] == ["paper", "k2.6-reported"]
    assert config["batch_sizes"] == [1, 64]
    assert config["depths"] == [16]
    assert config["distributions"] == ["drafter"]
    assert config["vocab_size"] == 163840
    assert config["builders"] == ["sglang", "reference", "native", "native-mt", "gpu"]
    assert config["gpu"] == "auto"
    assert config["topk"] == 1024
    assert config["trace_device"] == "cpu"  # the same traces on every machine
    settings = Settings.from_config(config)
    assert settings.trace_columns == 1024  # a fixed K: adding a budget never regrows the traces
    assert settings.builder_input_columns == "topk"  # ... and each builder is handed its first min(N, K)
    assert settings.trace_requests == 64
    assert set(settings.timing.options()) == {
        "warmup",
        "repeats",
        "min_repeats",
        "max_repeats",
        "min_seconds",
        "max_seconds",
    }


def test_default_step_section_is_the_issues_grid():
    config = load_config(ROOT / "config" / "config.yaml")
    settings = Settings.from_config(config)
    step = settings.step_options()
    assert step["enabled"] is True and step["layers"] == 61
    assert step["batch_sizes"] == [1, 8, 64]
    assert step["budgets"] == config["budgets"]  # null: every configured budget
    assert step["distribution"] == "drafter" and step["depth"] == 16  # null: the first configured
    assert step["heads"] == [8] and step["prefix_lengths"] == [4096, 32768]
    assert step["impls"] == list(ATTENTION_IMPLS)
    assert step["timing"] == settings.timing.options()  # accept and peaks sample like the tree build
    assert step["attention_timing"]["max_seconds"] <= 1.0  # the largest attention calls take up to 1 s


def test_step_defaults_are_filled_in_without_a_step_section():
    config = check_config(
        {
            "budgets": [8, 16],
            "batch_sizes": [1],
            "depths": [4],
            "distributions": ["bf16"],
            "builders": ["reference"],
        }
    )
    step = Settings.from_config(config).step_options()
    assert step["budgets"] == [8, 16] and step["distribution"] == "bf16" and step["depth"] == 4
    with pytest.raises(ValueError, match=r"config: step.batch_sizes: 8 is more than the 1 requests"):
        check_config(
            {
                "budgets": [8],
                "batch_sizes": [1],
                "depths": [4],
                "distributions": ["bf16"],
                "builders": ["reference"],
                "step": {"batch_sizes": [8]},
            }
        )


@pytest.mark.parametrize("name", ["smoke", "h200"])
def test_step_sections_of_the_other_configs(name):
    config = load_config(ROOT / "config" / f"{name}.yaml")
    step = Settings.from_config(config).step_options()
    assert set(step["budgets"]) <= set(config["budgets"])
    if name == "h200":
        assert step["batch_sizes"] == [1, 8, 64] and step["prefix_lengths"] == [4096, 32768]
        # the step batches need not have tree-build timings (the breakdown shows none there) but must fit
        # the traces, which hold max(batch_sizes) requests
        assert step["heads"] == [8] and max(step["batch_sizes"]) <= max(config["batch_sizes"])
    else:
        assert max(step["prefix_lengths"]) <= 1024 and max(step["batch_sizes"]) <= 4


def test_smoke_config_is_valid_and_small():
    config = load_config(ROOT / "config" / "smoke.yaml")
    assert max(config["budgets"]) <= 16 and max(config["batch_sizes"]) <= 4
    assert config["vocab_size"] <= 4096


def test_the_schema_describes_every_field():
    schema = load_schema()
    missing = []

    def walk(node, path):
        for key, sub in node.get("properties", {}).items():
            if "description" not in sub:
                missing.append(".".join(path + [key]))
            walk(sub, path + [key])

    walk(schema, [])
    assert not missing, f"fields without a description: {missing}"
    assert set(schema["properties"]["builders"]["items"]["enum"]) == set(BUILDERS)
    assert set(schema["properties"]["distributions"]["items"]["enum"]) == set(DISTRIBUTIONS)


def test_schema_names_match_the_package():
    assert set(BUILDERS) == set(BUILDER_NAMES)
    assert set(DISTRIBUTIONS) == set(TRACE_DISTRIBUTIONS)


def test_defaults_are_filled_in():
    config = check_config(
        {
            "budgets": [8],
            "batch_sizes": [1],
            "depths": [4],
            "distributions": ["uniform"],
            "builders": ["reference"],
        }
    )
    assert config["timing"]["repeats"] >= 1
    assert config["timing"]["jobs"] == 3  # independent timing jobs per CPU builder configuration
    assert config["sglang"]["module_paths"]
    assert config["machine"] is None
    assert config["topk"] == 1024
    assert config["trace_device"] == "cpu"


@pytest.mark.parametrize(("value", "expected"), [(True, "on"), (False, "off"), ("auto", "auto")])
def test_yaml_on_off_for_gpu(value, expected):
    config = default_config()
    config["gpu"] = value  # YAML 1.1 reads an unquoted on/off as a boolean
    assert check_config(config)["gpu"] == expected


def test_fixed_topk():
    config = default_config()
    config["topk"] = 2048
    settings = Settings.from_config(config)
    assert settings.trace_columns == 2048
    assert settings.builder_input_columns == "topk"  # every builder gets its first min(N, K)


BAD = [
    ("budgets", [8, 0], "config: budgets[1]: 0 is less than the minimum of 1"),
    ("budgets", [8, -4], "config: budgets[1]: -4 is less than the minimum of 1"),
    ("budgets", [8, 1.5], "config: budgets[1]: 1.5 is not of type 'integer'"),
    ("budgets", [8, "sixteen"], "config: budgets[1]: 'sixteen' is not of type 'integer'"),
    ("budgets", [8, "16.5"], "config: budgets[1]: '16.5' is not of type 'integer'"),
    ("budgets", [True], "config: budgets[0]: True is not of type 'integer'"),
    ("budgets", [], "config: budgets: [] should be non-empty"),
    ("budgets", 8, "config: budgets: 8 is not of type 'array'"),
    ("budgets", [8, 16, 8], "config: budgets: [8, 16, 8] has non-unique elements"),
    ("batch_sizes", [], "config: batch_sizes: [] should be non-empty"),
    ("batch_sizes", [1, 1], "config: batch_sizes: [1, 1] has non-unique elements"),
    ("depths", [16, 0], "config: depths[1]: 0 is less than the minimum of 1"),
    ("distributions", ["peaked", "zipf"], "config: distributions[1]: 'zipf' is not one of"),
    ("distributions", [], "config: distributions: [] should be non-empty"),
    ("distributions", ["bf16", "bf16"], "config: distributions: ['bf16', 'bf16'] has non-unique elements"),
    ("builders", ["reference", "triton"], "config: builders[1]: 'triton' is not one of"),
    ("builders", [], "config: builders: [] should be non-empty"),
    ("builders", ["native", "native"], "config: builders: ['native', 'native'] has non-unique elements"),
    ("gpu", "maybe", "config: gpu: 'maybe' is not one of"),
    ("vocab_size", 100, "config: vocab_size: 100 is smaller than the 1024 top-K columns needed"),
    ("machine", "a/b", "config: machine: 'a/b' does not match"),
    ("cuda_archs", ["ampere"], "config: cuda_archs[0]: 'ampere' does not match"),
    ("timing", {"repeats": 0}, "config: timing.repeats: 0 is less than the minimum of 1"),
    (
        "timing",
        {"min_seconds": 3.0, "max_seconds": 1.0},
        "config: timing: min_seconds (3.0) > max_seconds (1.0)",
    ),
    ("timing", {"warmup": 1.5}, "config: timing.warmup: 1.5 is not of type 'integer'"),
    ("timing", {"jobs": 0}, "config: timing.jobs: 0 is less than the minimum of 1"),
    ("timing", {"jobs": 2.5}, "config: timing.jobs: 2.5 is not of type 'integer'"),
    ("timing", {"jobs": True}, "config: timing.jobs: True is not of type 'integer'"),
    ("distributions", ["recorded"], "config: recorded_trace: distribution 'recorded' needs recorded_trace"),
    ("budget", [8], "config: (top level): Additional properties are not allowed ('budget' was unexpected)"),
    ("topk", "budget", "config: topk: 'budget' is no longer accepted"),
    ("topk", 0, "config: topk: 0 is less than the minimum of 1"),
    ("trace_device", "auto", "config: trace_device: 'auto' is no longer accepted"),
    ("budgets", [8, 2048], "config: budgets: 2048 is above topk (1024), the traces' K"),
    ("recorded_trace", "no/such/trace.npz", "config: recorded_trace: no/such/trace.npz: file not found"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_bad_config_is_one_clear_line(key, value, message):
    config = default_config()
    if key == "timing":
        config["timing"] = {**config["timing"], **value}
    else:
        config[key] = copy.deepcopy(value)
    with pytest.raises(ValueError) as error:
        check_config(config)
    text = str(error.value)
    assert "\n" not in text
    assert text.startswith(message), text


STEP_BAD = [
    ({"enabled": "yes"}, "config: step.enabled: 'yes' is not of type 'boolean'"),
    ({"layers": 0}, "config: step.layers: 0 is less than the minimum of 1"),
    ({"layers": 61.5}, "config: step.layers: 61.5 is not of type 'integer'"),
    ({"batch_sizes": []}, "config: step.batch_sizes: [] should be non-empty"),
    ({"batch_sizes": [1, 0]}, "config: step.batch_sizes[1]: 0 is less than the minimum of 1"),
    (
        {"batch_sizes": [1, 512]},
        "config: step.batch_sizes: 512 is more than the 64 requests the traces hold",
    ),
    ({"budgets": [8, 8]}, "config: step.budgets: [8, 8] has non-unique elements"),
    ({"budgets": [8, 2048]}, "config: step.budgets: 2048 is not one of the configured budgets"),
    ({"distribution": "recorded"}, "config: step.distribution: 'recorded' is not one of the configured"),
    (
        {"distribution": "zipf"},
        "config: step.distribution: 'zipf' is not one of "
        "['peaked', 'uniform', 'bf16', 'recorded', 'drafter', 'drafter-bf16', 'drafter-k2.6']",
    ),
    ({"depth": 12}, "config: step.depth: 12 is not one of the configured depths [16]"),
    ({"depth": "sixteen"}, "config: step.depth: 'sixteen' is not of type 'null', 'integer'"),
    ({"attention": {"heads": [8, 0]}}, "config: step.attention.heads[1]: 0 is less than the minimum of 1"),
    (
        {"attention": {"prefix_lengths": [4096, 4096]}},
        "config: step.attention.prefix_lengths: [4096, 4096] has non-unique elements",
    ),
    (
        {"attention": {"impls": ["ours", "flashinfer"]}},
        "config: step.attention.impls[1]: 'flashinfer' is not one of",
    ),
    ({"attention": {"impls": []}}, "config: step.attention.impls: [] should be non-empty"),
    (
        {"attention": {"timing": {"repeats": 1.5}}},
        "config: step.attention.timing.repeats: 1.5 is not of type 'integer'",
    ),
    (
        {"attention": {"timing": {"min_repeats": 9, "repeats": 3}}},
        "config: step.attention.timing: min_repeats (9) > repeats (3)",
    ),
    (
        {"attention": {"timing": {"max_seconds": 0}}},
        "config: step.attention.timing.max_seconds: 0 is less than",
    ),
    ({"attention": {"window": 5}}, "config: step.attention: Additional properties are not allowed ('window'"),
    ({"drafter": True}, "config: step: Additional properties are not allowed ('drafter' was unexpected)"),
]


@pytest.mark.parametrize(("override", "message"), STEP_BAD, ids=[str(o) for o, _ in STEP_BAD])
def test_bad_step_config_is_one_clear_line(override, message):
    config = default_config()
    step = copy.deepcopy(config["step"])
    for key, value in override.items():
        step[key] = {**step[key], **value} if isinstance(value, dict) and key == "attention" else value
        if key == "attention" and "timing" in value:
            step["attention"]["timing"] = {**config["step"]["attention"]["timing"], **value["timing"]}
    config["step"] = step
    with pytest.raises(ValueError) as error:
        check_config(config)
    text = str(error.value)
    assert "\n" not in text
    assert text.startswith(message), text


ROUND_BAD = [
    (
        {"model": {"moe_impls": ["triton-w4a16"] * 2}},
        "config: step.model.moe_impls: ['triton-w4a16', 'triton-w4a16'] has non-unique",
    ),
    ({"model": {"forward_impl": "cutlass"}}, "config: step.model.forward_impl: 'cutlass' is not one of"),
    ({"model": {"routing": "zipf"}}, "config: step.model.routing: 'zipf' is not one of"),
    ({"model": {"skew": -1}}, "config: step.model.skew: -1 is less than the minimum of 0"),
    ({"model": {"shape": {"heads": 60}}}, "config: step.model.shape: heads (60) must divide by tp (8)"),
    ({"model": {"shape": {"dense_layers": 99}}}, "config: step.model.shape: dense_layers (99) must be <="),
    ({"model": {"shape": {"layers": 3}}}, "config: step.model.shape: Additional properties are not allowed"),
    ({"model": {"sglang_files": "no/such"}}, "config: step.model.sglang_files: 'no/such' is not a folder"),
    ({"draft": {"block_size": 1}}, "config: step.draft.block_size: 1 is less than the minimum of 2"),
    ({"draft": {"shape": {"kv_heads": 6}}}, "config: step.draft.shape: kv_heads (6) must divide by tp (8)"),
    ({"allreduce": {"world_size": 8}}, "config: step.allreduce: Additional properties are not allowed"),
    ({"round": {"builders": ["cuda"]}}, "config: step.round.builders[0]: 'cuda' is not one of"),
    ({"round": {"batch_sizes": [8, 2]}}, "config: step.round.batch_sizes: 2 is not one of the step's"),
    ({"round": {"stacks": ["sglang-cuda"]}}, "config: step.round.stacks[0]: 'sglang-cuda' is not one of"),
    ({"round": {"max_round_seconds": 0}}, "config: step.round.max_round_seconds: 0 is less than or equal"),
]


@pytest.mark.parametrize(("override", "message"), ROUND_BAD, ids=[str(o) for o, _ in ROUND_BAD])
def test_bad_round_stage_config_is_one_clear_line(override, message):
    config = default_config()
    config["step"] = {**copy.deepcopy(config["step"]), **override}
    with pytest.raises(ValueError) as error:
        check_config(config)
    text = str(error.value)
    assert "\n" not in text
    assert text.startswith(message), text


def _ref(node: dict, schema: dict) -> dict:
    if "$ref" in node:
        target = schema
        for part in node["$ref"][2:].split("/"):
            target = target[part]
        return {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _bad_values(node: dict) -> list:
    """Values one (non-object) schema node refuses: a wrong type, and one breaking each of its rules."""
    types = node.get("type", [])
    types = [types] if isinstance(types, str) else types
    bad = [["wrong", "type"] if "object" in types else {"wrong": "type"}]
    if "minimum" in node:
        bad.append(node["minimum"] - (1 if "integer" in types else 0.5))
    if "exclusiveMinimum" in node:
        bad.append(node["exclusiveMinimum"])
    if "maximum" in node:
        bad.append(node["maximum"] + 1)
    if "enum" in node:
        bad.append("no-such-name")
    if "pattern" in node:
        bad.append("!no")
    if node.get("minLength"):
        bad.append("")
    if node.get("minItems"):
        bad.append([])
    return bad


def _schema_cases(node: dict, schema: dict, path: tuple = ()) -> list[tuple[tuple, object, str, str]]:
    """Every field of the schema broken once per rule: (the keys to set, the value, the field path the error
    must name, a text it must hold: the bad value or key)."""
    node = _ref(node, schema)
    dotted = ".".join(path)
    cases = []
    for branch in [_ref(option, schema) for option in node.get("oneOf", ())] or [node]:
        if branch.get("type") == "null":
            continue
        if "properties" in branch:
            for key, sub in branch["properties"].items():
                cases += _schema_cases(sub, schema, (*path, key))
            if branch.get("additionalProperties") is False:  # an unknown key: named by its mapping's path
                cases.append(
                    ((*path, "no_such_key"), 1, dotted or "(top level)", "'no_such_key' was unexpected")
                )
            continue
        cases += [(path, value, dotted, repr(value)) for value in _bad_values(branch)]
        items = _ref(branch.get("items", {}), schema)
        cases += [
            (path, [value], f"{dotted}[0]", repr(value)) for value in (_bad_values(items) if items else ())
        ]
    return cases


SCHEMA = load_schema()
SCHEMA_CASES = _schema_cases(SCHEMA, SCHEMA)


@pytest.mark.parametrize(
    ("path", "value", "field", "needle"), SCHEMA_CASES, ids=[f"{f}={v!r}" for _, v, f, _ in SCHEMA_CASES]
)
def test_every_schema_error_is_one_line_naming_its_field_path(path, value, field, needle):
    """Each field of the schema broken once per rule (a wrong type, below a minimum, an unknown name, a list
    item, an unknown key): one line, ``config: <field path>: <problem>``, naming the field (dotted, list
    items indexed: ``step.attention.heads[0]``) and the bad value or key."""
    config = default_config()
    where = config
    for key in path[:-1]:
        where = where.setdefault(key, {})
    where[path[-1]] = copy.deepcopy(value)
    with pytest.raises(ValueError) as error:
        check_config(config, SCHEMA)
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"config: {field}: "), text
    assert needle in text, text


def test_the_schema_sweep_breaks_each_kind_of_rule():
    """The sweep above reaches top-level and deep fields, list items and unknown keys."""
    fields = {field for _, _, field, _ in SCHEMA_CASES}
    assert {"budgets[0]", "step.attention.heads[0]", "step.round.stacks[0]", "step.model.shape.tp"} <= fields
    assert {"gpu", "throughput.draft_ms", "drafter.alt_ranks", "step.depth", "cuda_archs[0]"} <= fields
    unknown = {field for _, _, field, needle in SCHEMA_CASES if "was unexpected" in needle}
    assert {"(top level)", "step.attention", "throughput.what_if"} <= unknown


def test_round_stage_options_resolve_the_shapes():
    config = default_config()
    config["step"] = {**copy.deepcopy(config["step"]), "layers": 5, "draft": {"follow_budget": True}}
    options = Settings.from_config(config).step_options()
    assert options["model"]["shape"].layers == 5  # the target's layers are step.layers
    assert options["model"]["forward_impl"] == "marlin-w4a16" and options["model"]["routing"] == "uniform"
    assert options["draft"]["follow_budget"] is True and options["draft"]["block_size"] == 16
    assert options["allreduce"] == {"enabled": True}
    assert options["round"] == {
        "enabled": True,
        "builders": ["gpu", "native-mt", "sglang"],
        "batch_sizes": [1, 8, 64],
        "stacks": [],
        "max_round_seconds": 2.0,
        "chain_blocks": [],
        "warmup": 3,
        "repeats": 10,
        "repeat_budgets": [],
        "repeat_runs": 3,
        "expert_sets": None,
        "comm": {"world_size": 8, "bus_bandwidth_gbps": 370.0, "latency_us": 15.0},
    }


def _recorded(path, requests=256, depth=16, topk=1024):
    lp = np.zeros((requests, depth, topk), np.float32)
    ids = np.broadcast_to(np.arange(topk, dtype=np.int64), lp.shape).copy()
    save_trace(path, lp, ids)
    return str(path)


def test_a_recorded_trace_is_checked_when_the_config_is_loaded(tmp_path):
    config = default_config()
    config["recorded_trace"] = _recorded(tmp_path / "ok.npz")
    check_config(config)  # enough requests, positions and columns: accepted
    cases = [
        (_recorded(tmp_path / "few.npz", requests=8), "holds 8 requests, fewer than the 64 of the largest"),
        (_recorded(tmp_path / "short.npz", depth=4), "holds 4 positions, fewer than the 16 of the largest"),
        (_recorded(tmp_path / "narrow.npz", topk=64), "holds 64 top-K columns, fewer than the 1024 of topk"),
        (str(tmp_path), "not a file"),
    ]
    (tmp_path / "text.npz").write_text("not a trace")
    cases.append((str(tmp_path / "text.npz"), "not an .npz trace (not a zip archive"))
    np.savez(tmp_path / "other.npz", logits=np.zeros(3))
    cases.append((str(tmp_path / "other.npz"), "not a trace: missing array(s) top_log_probs, top_token_ids"))
    for path, message in cases:
        config = default_config()
        config["recorded_trace"] = path
        with pytest.raises(ValueError) as error:
            check_config(config)
        text = str(error.value)
        assert "\n" not in text and text.startswith("config: recorded_trace: "), text
        assert message in text, text


@pytest.mark.parametrize("name", ["notes.txt", "notes.npz"])
def test_a_text_file_as_the_recorded_trace_is_one_line_before_any_job(tmp_path, name):
    """Before: numpy's "This file contains pickled (object) data ..." (allow_pickle=False meets a file that is
    no zip archive). Now one line naming the file, by loading the config and by ``ddtree-bench workflow``."""
    work = workdir_copy(tmp_path)
    (work / name).write_text("top_log_probs, top_token_ids\n-0.1, 42\n")
    config = default_config()
    config.update(distributions=["recorded"], recorded_trace=name)
    (work / "text.yaml").write_text(yaml.safe_dump(config))
    message = (
        f"config: recorded_trace: {name}: not an .npz trace (not a zip archive; a trace is an .npz of "
        "top_log_probs and top_token_ids, as `ddtree-bench trace` writes)"
    )
    with pytest.raises(ValueError) as error:
        check_config({**config, "recorded_trace": str(work / name)})
    assert str(error.value) == message.replace(f" {name}:", f" {work / name}:")
    result = ddtree_bench_workflow(work, "--cores", "1", "--configfile", "text.yaml", "--", "report")
    assert result.returncode == 2, result.stderr[-3000:]
    assert error_lines(result.stderr) == [message]
    assert "pickle" not in result.stdout + result.stderr
    assert not (work / "results").exists() and not (work / "report").exists()


SNAKEMAKE_BAD = [
    ("budgets", [8, 0], "config: budgets[1]: 0 is less than the minimum of 1"),
    ("budgets", [8, 2.5], "config: budgets[1]: 2.5 is not of type 'integer'"),
    ("batch_sizes", [1, 8, 1], "config: batch_sizes: [1, 8, 1] has non-unique elements"),
    ("depths", [0], "config: depths[0]: 0 is less than the minimum of 1"),
    ("distributions", ["uniform", "cauchy"], "config: distributions[1]: 'cauchy' is not one of"),
    ("builders", ["reference", "cublas"], "config: builders[1]: 'cublas' is not one of"),
    (
        "step",
        {"batch_sizes": [1, 8, 64], "budgets": [3]},
        "config: step.budgets: 3 is not one of the configured",
    ),
    (
        "sglang",
        {"source": "no/such/sglang-checkout"},
        "config: sglang.source: sglang source no/such/sglang-checkout: no such file or folder",
    ),
    ("recorded_trace", "missing.npz", "config: recorded_trace: missing.npz: file not found"),
    ("budgets", [8, 4096], "config: budgets: 4096 is above topk (1024), the traces' K"),
    ("step", {"layers": 0}, "config: step.layers: 0 is less than the minimum of 1"),
    ("step", {"draft": {"block_size": 0}}, "config: step.draft.block_size: 0 is less than the minimum of 2"),
    (
        "step",
        {"model": {"moe_impls": ["cutlass"]}},
        "config: step.model.moe_impls[0]: 'cutlass' is not one of",
    ),
]


@pytest.mark.parametrize(("key", "value", "message"), SNAKEMAKE_BAD, ids=[k for k, _, _ in SNAKEMAKE_BAD])
def test_snakemake_stops_before_any_job_on_bad_config(tmp_path, key, value, message):
    work = workdir_copy(tmp_path)
    config = default_config()
    config[key] = value
    (work / "bad.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(work, "--cores", "1", "--configfile", "bad.yaml", "--", "report")
    assert result.returncode == 2
    assert message in result.stderr + result.stdout
    assert not (work / "results").exists()
    assert not (work / "report").exists()
    result = snakemake(work, "-n", "--cores", "1", "--configfile", "bad.yaml", "--", "report")
    assert result.returncode == 2
    assert message in result.stderr + result.stdout


def test_gpu_on_without_a_gpu_fails_before_any_job(tmp_path):
    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present here: gpu: on is satisfiable")
    work = workdir_copy(tmp_path)
    config = default_config()
    config["gpu"] = "on"
    (work / "gpu.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(work, "-n", "--cores", "1", "--configfile", "gpu.yaml", "--", "report")
    assert result.returncode == 2
    assert "config: gpu: on, but no usable GPU here" in result.stderr + result.stdout
    assert not (work / "results").exists()


def test_no_builder_that_can_run_here_is_refused_with_the_fix():
    cpu = "Add a CPU builder (reference, native, native-mt)"
    no_gpu = {"gpu": "no CUDA device"}
    with pytest.raises(ValueError) as error:
        check_builders_run_here(["gpu"], no_gpu)
    assert str(error.value) == (
        f"config: builders: none can run here: gpu (no CUDA device). {cpu} or run on a machine with a "
        "usable GPU"
    )
    with pytest.raises(ValueError, match=r"gpu \(gpu: off in the configuration\)\. .* or set gpu: auto$"):
        check_builders_run_here(["gpu"], {"gpu": "gpu: off in the configuration"}, gpu="off")
    with pytest.raises(ValueError, match=r"sglang \(no torch\), gpu \(no CUDA device\)\. Add a CPU builder"):
        check_builders_run_here(["sglang", "gpu"], {**no_gpu, "sglang": "no torch"})
    check_builders_run_here(["gpu", "native"], no_gpu)  # native runs: gpu gets its "unavailable" row
    check_builders_run_here(["gpu"], {})


def _builders_config(work: Path, name: str, builders: list[str], gpu: str) -> str:
    config = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    config.update(builders=builders, gpu=gpu)
    (work / name).write_text(yaml.safe_dump(config))
    return name


@pytest.mark.parametrize("gpu", ["auto", "off"])
def test_builders_none_of_which_can_run_here_stop_before_any_job(tmp_path, gpu):
    """Before: ``builders: [gpu]`` with ``gpu: auto`` on a machine without a GPU ran 25 jobs and exited 0
    with a report that measured nothing. Now: one line on stderr saying why and what to change, exit 2,
    nothing written (``gpu: off``: on any machine)."""
    if gpu == "auto" and gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present here: the gpu builder can run")
    work = workdir_copy(tmp_path)
    configfile = _builders_config(work, "gpu-only.yaml", ["gpu"], gpu)
    result = ddtree_bench_workflow(work, "--cores", "1", "--configfile", configfile, "--", "report")
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = error_lines(result.stderr)
    assert line.startswith("config: builders: none can run here: gpu ("), line
    fix = "or set gpu: auto" if gpu == "off" else "or run on a machine with a usable GPU"
    assert line.endswith(f"Add a CPU builder (reference, native, native-mt) {fix}"), line
    assert "rule " not in result.stdout
    assert not (work / "results").exists() and not (work / "report").exists()


def test_a_gpu_builder_beside_one_that_runs_here_leaves_only_its_own_jobs_out(tmp_path):
    """``[gpu, native]`` without a GPU (``gpu: off`` here, so on any machine): native's jobs run, gpu gets
    its one "unavailable" row (the report says why)."""
    work = workdir_copy(tmp_path)
    configfile = _builders_config(work, "mixed.yaml", ["gpu", "native"], "off")
    result = ddtree_bench_workflow(work, "-n", "--cores", "1", "--configfile", configfile, "--", "report")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "results/smoke/bench/native/" in result.stdout
    assert "results/smoke/bench/gpu/unavailable.parquet" in result.stdout
    assert "results/smoke/bench/gpu/drafter" not in result.stdout
    assert not (work / "results").exists()


def test_flexattention_kernel_options_reach_the_attention_jobs():
    config = default_config()
    assert Settings.from_config(config).step_options()["flex_kernel_options"] == {
        "BLOCK_M": 64,
        "BLOCK_N": 32,
        "num_stages": 1,
        "num_warps": 4,
    }
    config["step"]["attention"]["flexattention_kernel_options"] = None
    assert Settings.from_config(config).step_options()["flex_kernel_options"] is None
    config["step"]["attention"]["flexattention_kernel_options"] = [64, 32]
    with pytest.raises(ValueError, match=r"^config: step.attention.flexattention_kernel_options: "):
        check_config(config)
    config["step"]["attention"]["flexattention_kernel_options"] = {"BLOCK_M": [64]}
    with pytest.raises(ValueError, match=r"^config: step.attention.flexattention_kernel_options"):
        check_config(config)


# ----------------------------------------------------------------------------------------- what a user types


def _edited_recorded(tmp_path, name, edit) -> str:
    lp = np.zeros((256, 16, 1024), np.float32)
    lp[..., 1:] = -1.0
    ids = np.broadcast_to(np.arange(1024, dtype=np.int64), lp.shape).copy()
    edit(lp, ids)
    path = tmp_path / f"{name}.npz"
    np.savez(path, top_log_probs=lp, top_token_ids=ids)  # as a user's recorder writes it: not save_trace
    return str(path)


def _setter(which: int, index, value):
    """An edit of a recorded trace's arrays: ``which`` 0 the log-probs, 1 the token ids."""

    def edit(lp, ids):
        (lp, ids)[which][index] = value

    return edit


RECORDED_BAD = {
    "nan": (_setter(0, (200, 3, 7), np.nan), "non-finite value (NaN or inf) at (200, 3, 7)"),
    "unsorted": (_setter(0, (9, 0, 5), 0.0), "rows must be sorted descending; row (9, 0)"),
    "vocab": (_setter(1, (1, 1, 1), 163840), "token id 163840 at (1, 1, 1), not below"),
    "negative": (_setter(1, (0, 0, 0), -1), "negative token id at (0, 0, 0)"),
}


@pytest.mark.parametrize("case", sorted(RECORDED_BAD))
def test_a_recorded_traces_contents_are_checked_when_the_config_is_loaded(tmp_path, case):
    edit, problem = RECORDED_BAD[case]
    config = default_config()
    config["distributions"] = ["recorded"]
    config["recorded_trace"] = _edited_recorded(tmp_path, case, edit)
    with pytest.raises(ValueError) as error:
        check_config(config)
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"config: recorded_trace: {config['recorded_trace']}: "), text
    assert problem in text, text


def test_a_recorded_trace_with_a_nan_stops_snakemake_before_any_job(tmp_path):
    work = workdir_copy(tmp_path)
    _edited_recorded(work, "mine", RECORDED_BAD["nan"][0])
    config = default_config()
    config.update(distributions=["recorded"], recorded_trace="mine.npz")
    (work / "nan.yaml").write_text(yaml.safe_dump(config))
    for dry in ([], ["-n"]):
        result = snakemake(work, *dry, "--cores", "1", "--configfile", "nan.yaml", "--", "report")
        assert result.returncode == 2
        output = result.stderr + result.stdout
        assert "config: recorded_trace: mine.npz: top_log_probs has a non-finite value" in output
        assert "CalledProcessError" not in output and "Traceback" not in output
        assert not (work / "results").exists() and not (work / "report").exists()


def test_numeric_strings_from_the_command_line_are_numbers_where_the_schema_wants_them():
    given = {  # Snakemake's --config budgets=[8,16] ...: every value a string
        "budgets": ["8", "16"],
        "batch_sizes": ["1", "8"],
        "timing": {"warmup": "1", "max_seconds": "0.5"},
        "step": {"batch_sizes": ["1"], "depth": "16"},
        "throughput": {"draft_ms": "2.5"},
        "machine": "123",
    }
    config = default_config()
    for key, value in given.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    config["seed"] = "7"  # a config file's string, not the command line's: stays a string
    coerce_numeric_strings(config, given)
    assert config["budgets"] == [8, 16] and config["batch_sizes"] == [1, 8]
    assert config["timing"]["warmup"] == 1 and config["timing"]["max_seconds"] == 0.5
    assert config["step"]["batch_sizes"] == [1] and config["step"]["depth"] == 16
    assert config["throughput"]["draft_ms"] == 2.5
    assert config["machine"] == "123"  # a string setting keeps its string
    assert config["seed"] == "7" and config["timing"]["repeats"] == default_config()["timing"]["repeats"]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("budgets", ["16"], "config: budgets[0]: '16' is not of type 'integer'"),
        ("batch_sizes", [1, "8"], "config: batch_sizes[1]: '8' is not of type 'integer'"),
        ("seed", "7", "config: seed: '7' is not of type 'integer'"),
    ],
)
def test_a_config_files_string_where_a_number_belongs_is_refused(tmp_path, key, value, message):
    """Before: ``budgets: ["16"]`` in a config file was read as 16. A config file's quoted number is a
    mistake (only Snakemake's --config hands numbers over as strings), refused by loading the file and by
    ``ddtree-bench workflow`` before any job: one line on stderr, exit 2, nothing written."""
    path = tmp_path / "strings.yaml"
    path.write_text(yaml.safe_dump({key: value}))
    with pytest.raises(ValueError) as error:
        load_config(path)
    assert str(error.value).startswith(message), error.value
    work = workdir_copy(tmp_path)
    (work / "strings.yaml").write_text(path.read_text())
    result = ddtree_bench_workflow(work, "--cores", "1", "--configfile", "strings.yaml", "--", "report")
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = error_lines(result.stderr)
    assert line.startswith(message), result.stderr
    assert not (work / "results").exists() and not (work / "report").exists()


def test_snakemake_config_option_lists_are_accepted(tmp_path):
    work = workdir_copy(tmp_path)
    args = ("-n", "--cores", "1", "--configfile", "config/smoke.yaml")
    result = snakemake(work, *args, "--config", "budgets=[4,16]", "batch_sizes=[1, 4]", "--", "report")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "N4-B4" in result.stdout + result.stderr
    result = snakemake(work, *args, "--config", "budgets=[4,x]", "--", "report")
    assert result.returncode == 2
    assert "config: budgets[1]: 'x' is not of type 'integer'" in result.stderr + result.stdout


def test_an_unwritable_report_dir_is_refused_when_the_config_is_loaded(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file")
    config = check_config({**default_config(), "report_dir": str(blocker / "report")})
    with pytest.raises(ValueError) as error:
        check_output_paths(Settings.from_config(config))
    assert str(error.value) == f"config: report_dir: {blocker}/report: {blocker} is not a folder"
    new = str(tmp_path / "new" / "report")
    check_output_paths(Settings.from_config({**default_config(), "report_dir": new}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]  # the check creates nothing
    (tmp_path / "w").mkdir()
    work = workdir_copy(tmp_path / "w")
    target = "/proc/ddtree-bench-report" if Path("/proc/self").is_dir() else f"{blocker}/report"
    result = snakemake(
        work, "--cores", "1", "--configfile", "config/smoke.yaml", "--config", f"report_dir={target}"
    )
    assert result.returncode == 2
    assert f"config: report_dir: {target}: " in result.stderr + result.stdout
    assert not (work / "results").exists()


def test_a_yaml_error_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("budgets: [8, 16\nseed: 1\n")
    with pytest.raises(ValueError) as error:
        load_config(bad)
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"config {bad}: not valid YAML at line 2, column 5: "), text
    # the workflow's default config file: one line naming it (files given with --configfile are read by
    # Snakemake itself, before the workflow runs)
    (tmp_path / "w").mkdir()
    work = workdir_copy(tmp_path / "w")
    (work / "config" / "config.yaml").write_text("budgets: [8, 16\nseed: 1\n")
    result = snakemake(work, "-n", "--cores", "1")
    assert result.returncode == 2
    assert "config config/config.yaml: not valid YAML at line 2, column 5" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_environment_json_records_the_results_settings_not_the_reports():
    config = check_config(default_config())
    groups = Settings.from_config(config).recorded()
    assert set(groups) == {*RECORDED, "step"}
    merged = merge_recorded(groups)
    schema_keys = set(load_schema()["properties"])
    assert set(merged) | set(NOT_RECORDED) == schema_keys  # every setting: recorded or the report's own
    assert not set(merged) & set(NOT_RECORDED)
    # what the report reads back from a published environment.json
    grid = ("distributions", "depths", "budgets", "batch_sizes", "builders")
    assert {key: merged[key] for key in grid} == {key: config[key] for key in grid}
    # the step's budgets and rounds too: the stacks' budgets name tree shapes (consistency.extra_shape_points)
    step = ("enabled", "layers", "depth", "distribution", "budgets", "round")
    assert merged["step"] == {key: config["step"][key] for key in step}
    changed = copy.deepcopy(config)
    changed["report_dir"] = "elsewhere"
    changed["throughput"]["draft_ms"] = 3.0
    changed["step"]["attention"]["heads"] = [64]
    assert Settings.from_config(changed).recorded() == groups  # nothing the aggregation records: no rerun


def test_depth_follows_budget_pairs_each_budget_with_its_own_depth():
    from ddtree_bench.config import check_config  # noqa: PLC0415
    from ddtree_bench.consistency import check_shapes, configured_grid  # noqa: PLC0415

    config = check_config({"budgets": [8, 64], "batch_sizes": [1], "depth_follows_budget": True})
    assert config["depths"] == [8, 64]
    assert Settings.from_config(config).depth_budget_pairs == [(8, 8), (64, 64)]
    plain = check_config({"budgets": [8, 64], "batch_sizes": [1], "depths": [16]})
    assert Settings.from_config(plain).depth_budget_pairs == [(16, 8), (16, 64)]
    import pandas as pd  # noqa: PLC0415

    shapes = pd.DataFrame({"distribution": ["peaked"] * 2, "depth": [8, 64], "budget": [8, 64]})
    grid = configured_grid({**config, "distributions": ["peaked"], "acceptance_profiles": ["paper"]})
    check_shapes(shapes, grid)  # exactly the regime's points
    k26 = configured_grid({**config, "distributions": ["peaked"]})  # the k2.6 profile's trees, L = N too
    assert ("drafter-k2.6", 64, 64) in k26["extra_shapes"] and ("drafter-k2.6", 16, 64) not in k26[
        "extra_shapes"
    ]
    with pytest.raises(ValueError, match="L=8 N=64"):
        check_shapes(pd.concat([shapes, shapes.assign(depth=8, budget=64).iloc[:1]]), grid)


def test_depth_follows_budget_must_be_a_boolean():
    from ddtree_bench.config import check_config  # noqa: PLC0415

    with pytest.raises(ValueError, match="depth_follows_budget"):
        check_config({"budgets": [8], "depth_follows_budget": "yes"})


def test_h200_sglang_regime_config_loads():
    import yaml  # noqa: PLC0415

    from ddtree_bench.config import check_config  # noqa: PLC0415

    config = check_config(yaml.safe_load(open(ROOT / "config/h200-sglang-regime.yaml")))
    assert config["batch_sizes"] == [1]
    assert all(depth == budget for depth, budget in Settings.from_config(config).depth_budget_pairs)


def test_stack_rounds_add_the_tree_shapes_their_tau_needs():
    import pandas as pd  # noqa: PLC0415

    from ddtree_bench.consistency import check_shapes, configured_grid, extra_shape_points  # noqa: PLC0415

    config = {**default_config(), "distributions": ["drafter"], "depths": [16], "budgets": [8, 16]}
    config["acceptance_profiles"] = ["paper"]
    assert extra_shape_points(config) == []
    config["step"] = {**copy.deepcopy(config["step"]), "budgets": [2, 8], "round": {"stacks": ["ours"]}}
    assert extra_shape_points(config) == [("drafter", 16, 2)]  # N = 8 and 16 are the grid's own
    shapes = pd.DataFrame({"distribution": "drafter", "depth": 16, "budget": [2, 8, 16]})
    check_shapes(shapes, configured_grid(config))  # the stacks' budget 2 is named
    k26 = {**config, "acceptance_profiles": ["paper", "k2.6-reported"]}
    assert ("drafter-k2.6", 16, 2) in extra_shape_points(k26) and (
        "drafter-k2.6",
        16,
        16,
    ) in extra_shape_points(k26)
    with pytest.raises(ValueError, match="N=2, which the configuration does not name"):
        check_shapes(shapes, configured_grid({**config, "step": {}}))
    with pytest.raises(ValueError, match="lacks the configured drafter L=16 N=2"):
        check_shapes(shapes[shapes["budget"] != 2], configured_grid(config))


def test_published_answer_names_a_published_folder_or_the_run_stops(tmp_path):
    from ddtree_bench.config import check_published_answer, published_files, schema_default  # noqa: PLC0415

    assert schema_default("published_answer") == "h200"
    root = tmp_path / "published"
    for label in ("h200-sglang-regime", "h200-sglang", "h200"):
        (root / label).mkdir(parents=True)
        (root / label / "summary.parquet").write_bytes(b"")
    # the answer's folder first, then the others by name (not by path, where "-" sorts before "/")
    names = [p.parent.name for p in published_files(root=root, first="h200-sglang")]
    assert names == ["h200-sglang", "h200", "h200-sglang-regime"]
    check_published_answer(Settings.from_config(default_config()), root)
    typo = Settings.from_config({**default_config(), "published_answer": "h100"})
    with pytest.raises(ValueError) as error:
        check_published_answer(typo, root)
    assert str(error.value) == (
        f"config: published_answer: h100: no {root}/h100/summary.parquet (published machines there: h200, "
        "h200-sglang, h200-sglang-regime)"
    )
    check_published_answer(typo, tmp_path / "none")  # no published folder at all: nothing to name


# ----------------------------------------------------------------------------------------- YAML and layering


@pytest.mark.parametrize(
    ("text", "line", "key", "first"),
    [
        ("budgets: [8]\nseed: 1\nbudgets: [16]\n", 3, "budgets", 1),
        ("timing:\n  repeats: 3\n  warmup: 1\n  repeats: 5\n", 4, "repeats", 2),
        ("step:\n  attention:\n    heads: [8]\n    heads: [64]\n", 4, "heads", 3),
        ("step: {layers: 3, layers: 4}\n", 1, "layers", 1),
    ],
)
def test_a_key_given_twice_at_any_depth_is_one_line_naming_file_line_and_key(
    tmp_path, text, line, key, first
):
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        load_config(path)
    assert str(error.value) == (
        f"config {path}: line {line}: key {key!r} is given twice (first at line {first}); YAML would keep "
        "only the last one, silently"
    )


def test_a_merge_key_may_be_overridden_and_the_committed_configs_hold_no_key_twice(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("base: &t {repeats: 3, warmup: 1}\ntiming:\n  <<: *t\n  repeats: 5\n")
    assert read_config_file(path)["timing"] == {"repeats": 5, "warmup": 1}  # YAML's own override
    for name in sorted((ROOT / "config").glob("*.yaml")):
        read_config_file(name)


def test_the_layers_are_the_default_then_each_file_in_order_then_the_overrides(tmp_path):
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("budgets: [4, 8]\ntiming: {repeats: 7, warmup: 5}\nmachine: one\n")
    second.write_text("timing: {repeats: 9}\nmachine: two\n")
    config = layered_config([first, second], {"machine": "three", "seed": 4})
    default = read_config_file(ROOT / "config" / "config.yaml")
    assert config["budgets"] == [4, 8]  # the first file over the default
    assert config["timing"] == {**default["timing"], "repeats": 9, "warmup": 5}  # merged key by key
    assert (config["machine"], config["seed"]) == ("three", 4)  # the overrides last
    assert config["batch_sizes"] == default["batch_sizes"]  # what no layer gives: the default's
    assert merge_config({"a": {"b": 1}}, {"a": 2}) == {"a": 2}  # a mapping replaced by a value


def test_snakemakes_dropped_configfiles_and_replaced_default_are_refused():
    check_layering(["--configfiles", "a.yaml", "b.yaml"], [Path("a.yaml"), Path("b.yaml")])
    with pytest.raises(ValueError, match="--configfile: given 2 times: .* so a.yaml would be dropped"):
        check_layering(["--configfile", "a.yaml", "--configfile", "b.yaml"], [Path("b.yaml")])
    with pytest.raises(ValueError, match="--replace-workflow-config: not supported"):
        check_layering([], [], replace_workflow_config=True)


def test_the_stage_and_report_commands_layer_over_the_default_as_the_workflow_does(tmp_path, monkeypatch):
    """``stage --configfile F`` and ``report --config F`` take config/config.yaml under F, as a run does: a
    setting F does not give is the default file's, not the schema's."""
    from ddtree_bench import cli, stages  # noqa: PLC0415

    seen = {}
    monkeypatch.setattr(stages, "run_jobs", lambda settings, *args: seen.setdefault("stage", settings) and [])
    fragment = tmp_path / "fragment.yaml"
    fragment.write_text("machine: mine\nbudgets: [8, 16]\n")
    assert cli.main(["stage", "peaks", "--configfile", str(fragment)]) == 0
    settings = seen["stage"]
    default = read_config_file(ROOT / "config" / "config.yaml")
    assert settings.machine == "mine" and settings.budgets == (8, 16)
    assert list(settings.step.attention.prefix_lengths) == default["step"]["attention"]["prefix_lengths"]
    assert list(settings.sglang.module_paths) == default["sglang"]["module_paths"]
    args = cli.build_parser().parse_args(
        ["report", "--results", str(tmp_path), "--config", str(fragment), "-o", "r"]
    )
    config, source = cli._report_config(args)  # what the summary is checked against
    assert (config["machine"], config["budgets"], source) == ("mine", [8, 16], str(fragment))
    assert config["batch_sizes"] == default["batch_sizes"] and config["depths"] == default["depths"]


def test_an_unwritable_results_folder_is_refused_when_the_config_is_loaded(tmp_path):
    """The run's own results folder (results/<machine>), not only results/: a read-only one is one line in
    the dry run, before any job (before: a traceback mid-run)."""
    readonly = Path("/sys/kernel")
    try:
        check_writable(readonly, "probe", folder=True)
    except ValueError:
        pass
    else:
        pytest.skip(f"{readonly} is writable here")
    work = workdir_copy(tmp_path)
    (work / "results").mkdir()
    (work / "results" / "smoke").symlink_to(readonly)
    result = snakemake(work, "-n", "--cores", "1", "--configfile", "config/smoke.yaml", "--", "report")
    assert result.returncode == 2
    (line,) = error_lines(result.stderr)
    assert line.startswith("config: results: results/smoke: not writable ("), line


def test_the_report_loads_every_published_machine_those_with_step_stages_alone_included(tmp_path):
    from ddtree_bench.config import published_results  # noqa: PLC0415

    for folder, name in (("h200", "summary.parquet"), ("h100", "step_summary.parquet"), ("x", "notes.txt")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text("")
    found = published_results(tmp_path, first="h200")
    assert found == [tmp_path / "h200" / "summary.parquet", tmp_path / "h100" / "summary.parquet"]
    assert published_results(tmp_path)[0].parent.name == "h100"  # by name without a first
