"""The settings object: built and checked once from a configuration, immutable, one name and one default per
setting (the schema's)."""

from __future__ import annotations

import dataclasses
import inspect
from types import MappingProxyType

import pytest
import yaml
from workflow_copy import ROOT

from ddtree_bench.config import _resolve, load_schema, schema_default
from ddtree_bench.settings import Settings, load_settings

CONFIGS = ("config.yaml", "smoke.yaml", "h200.yaml", "h200-sglang-regime.yaml")
MINIMAL = {"budgets": [8, 16], "batch_sizes": [1, 4], "depths": [4], "distributions": ["peaked"]}
#: Settings fields that are no schema key: the checked mapping itself, and ModelShape's layers (step.layers)
NOT_KEYS = {("_config",), ("step", "model", "shape", "layers")}


def schema_leaves(schema: dict, node: dict | None = None, path: tuple = ()):
    """(path, sub-schema) of every setting, nested sections walked (their own entry too)."""
    node = schema if node is None else node
    for key, sub in node.get("properties", {}).items():
        sub = _resolve(sub, schema)
        yield (*path, key), sub
        if sub.get("type") == "object" and "properties" in sub:
            yield from schema_leaves(schema, sub, (*path, key))


def settings_fields(obj, path: tuple = ()):
    """(path, dataclass field) of every field of the settings' dataclasses, nested ones walked."""
    for field in dataclasses.fields(obj):
        yield (*path, field.name), field
        value = getattr(obj, field.name)
        if dataclasses.is_dataclass(value):
            yield from settings_fields(value, (*path, field.name))


def attribute(settings, path):
    value = settings
    for key in path:
        value = getattr(value, key)
    return value


def thawed(value):
    """A settings value as the configuration mapping writes it (tuples as lists, shapes as mappings)."""
    if isinstance(value, tuple):
        return [thawed(v) for v in value]
    if isinstance(value, MappingProxyType | dict):
        return {k: thawed(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value):
        return {f.name: thawed(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


@pytest.mark.parametrize("name", CONFIGS)
def test_built_once_from_each_config_and_equal_to_the_checked_mapping(name):
    settings = load_settings(ROOT / "config" / name)
    config = settings.as_config()
    schema = load_schema()
    for path, sub in schema_leaves(schema):
        if sub.get("type") == "object" and "properties" in sub:
            continue  # a section: its keys are compared one by one
        value, expected = attribute(settings, path), config
        for key in path:
            expected = expected[key]
        assert thawed(value) == expected, path
    assert settings.step.model.shape.layers == config["step"]["layers"]
    assert settings.as_config() is not settings.as_config()  # a copy each time
    assert settings.trace_requests == max(config["batch_sizes"])


def test_the_settings_are_immutable():
    settings = load_settings(ROOT / "config" / "smoke.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.budgets = (1,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.timing.repeats = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.step.attention.timing.warmup = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.step.model.shape.hidden = 1
    assert isinstance(settings.budgets, tuple) and isinstance(settings.step.attention.heads, tuple)
    options = load_settings(ROOT / "config" / "config.yaml").step.attention.flexattention_kernel_options
    with pytest.raises(TypeError):
        options["BLOCK_M"] = 1
    # what it hands out is the caller's own
    step = settings.step_options()
    step["budgets"].append(99)
    assert 99 not in settings.step_options()["budgets"]


def test_the_input_mapping_is_left_as_it_was():
    config = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    before = yaml.safe_dump(config)
    Settings.from_config(config)
    assert yaml.safe_dump(config) == before


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"budgets": [0, 8]}, "budgets[0]"),
        ({"timing": {"repeats": 0}}, "timing.repeats"),
        ({"timing": {"min_repeats": 20, "repeats": 10}}, "timing"),
        ({"step": {"attention": {"heads": []}}}, "step.attention.heads"),
        ({"throughput": {"what_if": {"bandwidth_tbps": 0}}}, "throughput.what_if.bandwidth_tbps"),
        ({"step": {"model": {"shape": {"tp": 3}}}}, "step.model.shape"),
        ({"gpu": "sometimes"}, "gpu"),
        ({"colour": "blue"}, "(top level)"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(edit, field):
    with pytest.raises(ValueError) as error:
        Settings.from_config({**MINIMAL, **edit})
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"config: {field}: "), text


def test_not_a_mapping():
    with pytest.raises(ValueError, match=r"^config: must be a mapping, got list$"):
        Settings.from_config([1])


def test_one_name_per_setting():
    """Every schema key is a settings field of the same name at the same place, and back."""
    settings = load_settings(ROOT / "config" / "config.yaml")
    keys = {path for path, _ in schema_leaves(load_schema())}
    names = {path for path, _ in settings_fields(settings)}
    assert names - NOT_KEYS == keys


def test_one_default_per_setting_the_schemas():
    """The settings classes declare no default; every optional setting has the schema's, which is what a
    configuration that omits it gets."""
    settings = Settings.from_config(dict(MINIMAL))
    for path, field in settings_fields(settings):
        owner = attribute(settings, path[:-1])
        if type(owner).__module__ != "ddtree_bench.settings":
            continue  # k26.shapes' classes: checked against the schema below
        assert field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING, path
    schema = load_schema()
    required = set(schema["required"])
    for path, sub in schema_leaves(schema):
        if path[0] in required:
            continue  # every configuration names these
        assert "default" in sub, f"{'.'.join(path)} has no default in the schema"
        default = schema_default(".".join(path))
        if sub.get("type") == "object" and "properties" in sub:
            continue  # a section: its keys' defaults are checked one by one
        assert thawed(attribute(settings, path)) == default, path


def test_the_librarys_own_defaults_equal_the_schemas():
    """Where a library class or function keeps a default for callers without a configuration, it is the
    schema's (so no setting has two different defaults)."""
    from ddtree_bench import calibrate, throughput, traces  # noqa: PLC0415
    from ddtree_bench.k26.shapes import DrafterShape, ModelShape  # noqa: PLC0415
    from ddtree_bench.report.compose import ReportOptions  # noqa: PLC0415

    for field in dataclasses.fields(ModelShape):
        path = "step.layers" if field.name == "layers" else f"step.model.shape.{field.name}"
        assert field.default == schema_default(path), field.name
    for key, field in ((f.name, f) for f in dataclasses.fields(DrafterShape)):
        assert field.default == schema_default(f"step.draft.shape.{key}"), key
    for key, field in ((f.name, f) for f in dataclasses.fields(throughput.WhatIf)):
        assert field.default == schema_default(f"throughput.what_if.{key}"), key
    for field in dataclasses.fields(throughput.Comm):  # its world size: the target's tensor-parallel ranks
        path = "step.model.shape.tp" if field.name == "world_size" else f"throughput.allreduce.{field.name}"
        assert field.default == schema_default(path), field.name
    assert throughput.DEFAULT_DRAFT_MS == schema_default("throughput.draft_ms")
    round_model = {f.name: f.default for f in dataclasses.fields(throughput.RoundAssumptions)}
    assert round_model["topk"] == schema_default("topk")
    from_config = inspect.signature(throughput.RoundAssumptions.from_config)
    assert from_config.parameters["topk"].default == schema_default("topk")
    assert traces.DEFAULT_VOCAB_SIZE == schema_default("vocab_size")
    assert calibrate.Evaluator.__dataclass_fields__["vocab_size"].default == schema_default("vocab_size")
    assert ReportOptions.__dataclass_fields__["step_layers"].default == schema_default("step.layers")


def test_schema_default_names_a_setting_without_one():
    assert schema_default("timing.repeats") == 10
    assert schema_default("step.attention.timing.repeats") == 5
    with pytest.raises(KeyError):
        schema_default("budgets.nothing")


# ----------------------------------------------------------------------------------------- the shipped grids

GRID = ("budgets", "batch_sizes", "depths", "distributions")


def test_the_default_runs_the_published_h200_grid_on_the_same_traces():
    """config.yaml, sized for a CPU, times the published H200 run's tree-build grid on the very traces that
    run timed (equal sha256), so the report sets this machine's builders beside the H200's."""
    import pandas as pd  # noqa: PLC0415

    from ddtree_bench.traces import TraceSpec, arrays_sha256, generate  # noqa: PLC0415

    default = load_settings(ROOT / "config" / "config.yaml")
    h200 = load_settings(ROOT / "config" / "config.yaml", ROOT / "config" / "h200.yaml")
    assert [getattr(default, key) for key in GRID] == [getattr(h200, key) for key in GRID]
    assert default.trace_requests == h200.trace_requests and default.trace_columns == h200.trace_columns
    (distribution,), (depth,) = default.distributions, default.depths
    spec = TraceSpec(
        distribution,
        default.trace_requests,
        depth,
        default.trace_columns,
        vocab_size=default.vocab_size,
        seed=default.seed,
    )
    trace = generate(spec, device=default.trace_device, drafter=default.drafter.as_dict())
    published = pd.read_parquet(ROOT / "results" / "published" / "h200" / "summary.parquet")
    assert set(published["trace_sha256"].dropna()) == {
        arrays_sha256(trace.top_log_probs, trace.top_token_ids)
    }


def test_the_full_grid_is_a_fragment_over_the_default_and_the_h200_configs_set_their_own():
    default = load_settings(ROOT / "config" / "config.yaml")
    full = load_settings(ROOT / "config" / "config.yaml", ROOT / "config" / "full.yaml")
    assert full.budgets == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    assert (full.batch_sizes, full.depths) == ((1, 8, 64, 256), (16, 8))
    assert full.distributions == ("drafter", "peaked", "bf16")
    before, after = default.as_config(), full.as_config()
    assert {key for key in before if before[key] != after[key]} == set(GRID)  # everything else the default's
    # the published runs' configurations do not take their grid or sampling from the default
    for name in ("h200.yaml", "h200-sglang-regime.yaml"):
        alone = load_settings(ROOT / "config" / name)
        over = load_settings(ROOT / "config" / "config.yaml", ROOT / "config" / name)
        for key in (*GRID, "depth_follows_budget", "builders", "timing"):
            assert getattr(over, key) == getattr(alone, key), (name, key)
