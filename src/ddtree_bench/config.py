"""The workflow configuration: loading, defaults, schema validation and the checks a schema cannot say.

``check_config(config)`` is what the Snakefile runs before anything else: it fills the schema's defaults,
normalises YAML's ``on``/``off`` booleans for ``gpu``, and raises ``ValueError`` with one line naming the
first problem (``config: budgets: must hold integers >= 1, got 0``), so a bad configuration fails the run
before any job starts.
"""

from __future__ import annotations

import copy
import numbers
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"

BUILDERS = ("sglang", "reference", "native", "native-mt", "gpu")
DISTRIBUTIONS = ("uniform", "peaked", "bf16", "recorded")
TIMING_KEYS = ("warmup", "repeats", "min_repeats", "max_repeats", "min_seconds", "max_seconds")


def load_schema(path: str | Path | None = None) -> dict:
    with open(path or SCHEMA_PATH) as handle:
        return yaml.safe_load(handle)


def load_config(path: str | Path) -> dict:
    """Read a YAML config file (a mapping) and check it (see ``check_config``)."""
    path = Path(path)
    try:
        with open(path) as handle:
            data = yaml.safe_load(handle)
    except OSError as error:
        raise ValueError(f"config {path}: cannot read it ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise ValueError(f"config {path}: not valid YAML ({' '.join(str(error).split())})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"config {path}: must be a mapping of keys to values, got {type(data).__name__}")
    return check_config(data)


# ----------------------------------------------------------------------------------------- defaults


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref")
    if ref and ref.startswith("#/"):
        node = root
        for part in ref[2:].split("/"):
            node = node[part]
        merged = dict(node)
        merged.update({k: v for k, v in schema.items() if k != "$ref"})
        return merged
    return schema


def apply_defaults(config: dict, schema: dict | None = None) -> dict:
    """Fill (in place) every missing key that has a ``default`` in the schema, nested objects included."""
    schema = schema or load_schema()
    _fill(config, schema, schema)
    return config


def _fill(instance: dict, schema: dict, root: dict) -> None:
    for key, sub in schema.get("properties", {}).items():
        sub = _resolve(sub, root)
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if isinstance(instance.get(key), dict) and sub.get("type") == "object":
            _fill(instance[key], sub, root)


# ----------------------------------------------------------------------------------------- checks


def _fail(field: str, problem: str):
    raise ValueError(f"config: {field}: {problem}")


def _int_list(config: dict, key: str) -> list[int]:
    values = config.get(key)
    if not isinstance(values, list) or not values:
        _fail(key, f"must be a non-empty list, got {values!r}")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            _fail(key, f"must hold integers, got {value!r}")
        if value < 1:
            _fail(key, f"must hold integers >= 1, got {value}")
    duplicates = sorted({v for v in values if values.count(v) > 1})
    if duplicates:
        _fail(key, f"has duplicate values {duplicates}")
    return [int(v) for v in values]


def _name_list(config: dict, key: str, known: tuple[str, ...], what: str) -> list[str]:
    values = config.get(key)
    if not isinstance(values, list) or not values:
        _fail(key, f"must be a non-empty list, got {values!r}")
    for value in values:
        if value not in known:
            _fail(key, f"unknown {what} {value!r}; known: {', '.join(known)}")
    duplicates = sorted({v for v in values if values.count(v) > 1})
    if duplicates:
        _fail(key, f"has duplicate values {duplicates}")
    return list(values)


def _schema_check(config: dict, schema: dict) -> None:
    import jsonschema  # noqa: PLC0415 (only needed here)

    validator = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        _fail(where, " ".join(error.message.split()))


def check_config(config: dict, schema: dict | str | Path | None = None) -> dict:
    """Fill defaults into ``config`` (in place), check it, and return it. Raises ``ValueError`` with one line
    naming the first problem."""
    if not isinstance(config, dict):
        raise ValueError(f"config: must be a mapping, got {type(config).__name__}")
    if not isinstance(schema, dict):
        schema = load_schema(schema)
    # YAML 1.1 reads unquoted on/off as booleans.
    if isinstance(config.get("gpu"), bool):
        config["gpu"] = "on" if config["gpu"] else "off"
    apply_defaults(config, schema)

    budgets = _int_list(config, "budgets")
    batch_sizes = _int_list(config, "batch_sizes")
    depths = _int_list(config, "depths")
    distributions = _name_list(config, "distributions", DISTRIBUTIONS, "distribution")
    _name_list(config, "builders", BUILDERS, "builder")
    timing = config.get("timing")
    if isinstance(timing, dict):
        for key in ("warmup", "repeats", "min_repeats", "max_repeats"):
            value = timing.get(key)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                _fail(f"timing.{key}", f"must be an integer, got {value!r}")
    _schema_check(config, schema)

    timing = config["timing"]
    if timing["min_repeats"] > timing["repeats"]:
        _fail("timing", f"min_repeats ({timing['min_repeats']}) > repeats ({timing['repeats']})")
    if timing["repeats"] > timing["max_repeats"]:
        _fail("timing", f"repeats ({timing['repeats']}) > max_repeats ({timing['max_repeats']})")
    if timing["min_seconds"] > timing["max_seconds"]:
        _fail("timing", f"min_seconds ({timing['min_seconds']}) > max_seconds ({timing['max_seconds']})")
    columns = trace_columns(config)
    if config["vocab_size"] < columns:
        _fail("vocab_size", f"{config['vocab_size']} is smaller than the {columns} top-K columns needed")
    if "recorded" in distributions:
        recorded = config.get("recorded_trace")
        if not recorded:
            _fail("recorded_trace", "distribution 'recorded' needs recorded_trace, the path of a .npz trace")
    del budgets, batch_sizes, depths
    return config


# ----------------------------------------------------------------------------------------- derived values


def trace_columns(config: dict) -> int:
    """K, the top-K columns every trace holds: max(budgets) for ``topk: budget``, else the integer given."""
    topk = config.get("topk", "budget")
    if topk == "budget":
        return max(config["budgets"])
    return int(topk)


def trace_requests(config: dict) -> int:
    """R, the requests every trace holds: the largest batch size."""
    return max(config["batch_sizes"])


def timing_options(config: dict) -> dict:
    """The ``timing`` section as keyword arguments of ``bench.run_benchmark``."""
    return {key: config["timing"][key] for key in TIMING_KEYS}
