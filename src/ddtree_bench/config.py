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

from ddtree_bench.builders.sglang import check_source
from ddtree_bench.drafter import check_params
from ddtree_bench.ops.attention_peers import find_sglang_kernel
from ddtree_bench.traces import peek_trace

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"

BUILDERS = ("sglang", "reference", "native", "native-mt", "gpu")
DISTRIBUTIONS = ("uniform", "peaked", "bf16", "recorded", "drafter", "drafter-bf16")
TIMING_KEYS = ("warmup", "repeats", "min_repeats", "max_repeats", "min_seconds", "max_seconds")
# "read-stream" is no attention: a kernel that reads as many bytes as the call moves (its measured bound)
STREAM_IMPL = "read-stream"
# "flashmla" and "sglang-triton" are optional extras (attention_peers): rows saying why where they do not load
ATTENTION_IMPLS = ("ours", "ours-mma", "flexattention", "sdpa", "flashmla", "sglang-triton", STREAM_IMPL)


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


def _int_list(config: dict, key: str, *, field: str | None = None) -> list[int]:
    """``config[key]`` as a non-empty list of distinct integers >= 1 (``field`` names it in messages)."""
    values, key = config.get(key), field or key
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


def _name_list(
    config: dict, key: str, known: tuple[str, ...], what: str, *, field: str | None = None
) -> list[str]:
    values, key = config.get(key), field or key
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
    import jsonschema  # noqa: PLC0415

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
    _retired_values(config)
    apply_defaults(config, schema)

    budgets = _int_list(config, "budgets")
    batch_sizes = _int_list(config, "batch_sizes")
    _depth_follows_budget(config, budgets)
    depths = _int_list(config, "depths")
    distributions = _name_list(config, "distributions", DISTRIBUTIONS, "distribution")
    _name_list(config, "builders", BUILDERS, "builder")
    _timing_counts(config.get("timing"), "timing")
    _step_lists(config.get("step"))
    _throughput_numbers(config.get("throughput"))
    _drafter_params(config)
    _schema_check(config, schema)

    _timing_order(config["timing"], "timing")
    _step_fields(config, budgets, batch_sizes, depths, distributions)
    _throughput_fields(config)
    _sglang_triton_source(config["step"]["attention"])
    columns = trace_columns(config)
    if config["vocab_size"] < columns:
        _fail("vocab_size", f"{config['vocab_size']} is smaller than the {columns} top-K columns needed")
    _budgets_within_topk(budgets, columns)
    if "recorded" in distributions:
        recorded = config.get("recorded_trace")
        if not recorded:
            _fail("recorded_trace", "distribution 'recorded' needs recorded_trace, the path of a .npz trace")
    _sglang_source(config)
    _input_paths(config, columns)
    return config


def _depth_follows_budget(config: dict, budgets: list[int]) -> None:
    """SGLang's regime: with ``depth_follows_budget`` every budget N runs on traces of L = N positions
    (SGLang's DDTree worker drafts a block of N + 1 tokens for budget N), so ``depths`` becomes the budgets
    and the grid pairs each budget with its own depth (``depth_budget_pairs``)."""
    follows = config.get("depth_follows_budget", False)
    if not isinstance(follows, bool):
        _fail("depth_follows_budget", f"must be true or false, got {follows!r}")
    if follows:
        config["depths"] = sorted(set(budgets))


def depth_budget_pairs(config: dict) -> list[tuple[int, int]]:
    """The (depth L, budget N) points of the grid: every depth with every budget, or in SGLang's regime
    (``depth_follows_budget``) each budget with L = N."""
    if config.get("depth_follows_budget", False):
        return [(int(n), int(n)) for n in config["budgets"]]
    return [(int(d), int(n)) for d in config["depths"] for n in config["budgets"]]


def _sglang_source(config: dict) -> None:
    """``sglang.source``, where the sglang builder is configured: the file is found, defines the function and
    torch is installed (the user asked for this builder explicitly: no quiet "unavailable")."""
    source = (config.get("sglang") or {}).get("source")
    if source is None or "sglang" not in config["builders"]:
        return

    try:
        check_source(source)
    except ValueError as error:
        _fail("sglang.source", str(error))


def _retired_values(config: dict) -> None:
    """Values older configurations used that would now change results silently: refused with what to use."""
    if config.get("topk") == "budget":
        _fail(
            "topk",
            "'budget' is no longer accepted (it regrew every trace when a budget was added); give the "
            "traces' K as an integer, e.g. topk: 1024 (the default); each job takes the first min(N, K) "
            "columns",
        )
    if config.get("trace_device") == "auto":
        _fail(
            "trace_device",
            "'auto' is no longer accepted (it gave other traces where a GPU is); use cpu (the default: the "
            "same traces on every machine) or cuda (CuPy's generator: other traces than cpu)",
        )


def _budgets_within_topk(budgets: list[int], columns: int) -> None:
    """A budget above the traces' K needs a larger ``topk`` (a budget never regrows the traces)."""
    above = [budget for budget in budgets if budget > columns]
    if above:
        _fail(
            "budgets",
            f"{above[0]} is above topk ({columns}), the traces' K: it needs a larger topk (at least "
            f"{max(above)}, which regenerates the traces)",
        )


def _input_paths(config: dict, columns: int) -> None:
    """Every input file the configuration names exists, is readable and holds what the jobs need."""
    recorded = config.get("recorded_trace")
    if not recorded:
        return

    try:
        shape = peek_trace(recorded)
    except ValueError as error:
        _fail("recorded_trace", str(error))
    needs = (
        ("requests", trace_requests(config), "the largest of batch_sizes"),
        ("positions", max(config["depths"]), "the largest of depths"),
        ("top-K columns", columns, "topk"),
    )
    for (name, need, why), have in zip(needs, shape, strict=True):
        if have < need:
            _fail("recorded_trace", f"{recorded} holds {have} {name}, fewer than the {need} of {why}")


def _drafter_params(config: dict) -> None:
    """The drafter mapping's values, checked by the generator's own rules (one line naming the key)."""
    drafter = config.get("drafter")
    if drafter is None or not isinstance(drafter, dict):
        _fail("drafter", f"must be a mapping of parameters, got {drafter!r}")
    try:
        check_params(drafter, where="drafter")
    except ValueError as error:
        raise ValueError(f"config: {error}") from None


def _timing_counts(timing, field: str) -> None:
    """The counts of a timing section are integers (YAML's 1.5 or true would pass as numbers otherwise)."""
    if not isinstance(timing, dict):
        return
    for key in ("warmup", "repeats", "min_repeats", "max_repeats"):
        if key in timing:
            value = timing[key]
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                _fail(f"{field}.{key}", f"must be an integer, got {value!r}")


def _timing_order(timing: dict, field: str) -> None:
    if timing["min_repeats"] > timing["repeats"]:
        _fail(field, f"min_repeats ({timing['min_repeats']}) > repeats ({timing['repeats']})")
    if timing["repeats"] > timing["max_repeats"]:
        _fail(field, f"repeats ({timing['repeats']}) > max_repeats ({timing['max_repeats']})")
    if timing["min_seconds"] > timing["max_seconds"]:
        _fail(field, f"min_seconds ({timing['min_seconds']}) > max_seconds ({timing['max_seconds']})")


def _step_lists(step) -> None:
    """The step section's lists, checked like the top-level ones (before the schema: clearer messages)."""
    if not isinstance(step, dict):
        return  # the schema names the problem
    if not isinstance(step.get("enabled", True), bool):
        _fail("step.enabled", f"must be true or false, got {step['enabled']!r}")
    layers = step.get("layers", 1)
    if isinstance(layers, bool) or not isinstance(layers, numbers.Integral) or layers < 1:
        _fail("step.layers", f"must be an integer >= 1, got {layers!r}")
    if step.get("batch_sizes") is not None:
        _int_list(step, "batch_sizes", field="step.batch_sizes")
    if step.get("budgets") is not None:
        _int_list(step, "budgets", field="step.budgets")
    depth = step.get("depth")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, numbers.Integral)):
        _fail("step.depth", f"must be an integer or null, got {depth!r}")
    attention = step.get("attention")
    if not isinstance(attention, dict):
        return
    _int_list(attention, "heads", field="step.attention.heads")
    _int_list(attention, "prefix_lengths", field="step.attention.prefix_lengths")
    _name_list(attention, "impls", ATTENTION_IMPLS, "attention impl", field="step.attention.impls")
    _timing_counts(attention.get("timing"), "step.attention.timing")


def _step_fields(config: dict, budgets, batch_sizes, depths, distributions) -> None:
    """What the step section may name depends on the rest: traces, budgets, depths, distributions."""
    step = config["step"]
    _timing_order(step["attention"]["timing"], "step.attention.timing")
    requests = max(batch_sizes)
    for batch in step["batch_sizes"] or ():
        if batch > requests:
            _fail(
                "step.batch_sizes",
                f"{batch} is more than the {requests} requests the traces hold (the largest of batch_sizes); "
                "null takes the configured batch_sizes",
            )
    for budget in step["budgets"] or ():
        if budget not in budgets:
            _fail(
                "step.budgets",
                f"{budget} is not one of the configured budgets {budgets} (null takes them all)",
            )
    if step["distribution"] is not None and step["distribution"] not in distributions:
        _fail(
            "step.distribution",
            f"{step['distribution']!r} is not one of the configured distributions {distributions}",
        )
    if step["depth"] is not None and step["depth"] not in depths:
        _fail("step.depth", f"{step['depth']} is not one of the configured depths {depths}")


def _throughput_numbers(section) -> None:
    """The throughput model's times are finite numbers >= 0 (before the schema: one clear line each)."""
    if not isinstance(section, dict):
        return  # the schema names the problem
    rest = section.get("rest")
    fields = [("throughput.draft_ms", section, "draft_ms")]
    if isinstance(rest, dict):
        fields += [
            ("throughput.rest.fixed_ms", rest, "fixed_ms"),
            ("throughput.rest.per_token_us", rest, "per_token_us"),
        ]
    for field, where, key in fields:
        if key not in where:
            continue
        value = where[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or value != value  # NaN
            or value in (float("inf"), float("-inf"))
            or value < 0
        ):
            _fail(field, f"must be a finite number >= 0, got {value!r}")
    prefix = section.get("prefix_length")
    if prefix is not None and (
        isinstance(prefix, bool) or not isinstance(prefix, numbers.Integral) or prefix < 1
    ):
        _fail("throughput.prefix_length", f"must be an integer >= 1 or null, got {prefix!r}")


def _throughput_fields(config: dict) -> None:
    """The model's prefix length must be one the step stages measure."""
    prefix = config["throughput"]["prefix_length"]
    measured = config["step"]["attention"]["prefix_lengths"]
    if prefix is not None and prefix not in measured:
        _fail(
            "throughput.prefix_length",
            f"{prefix} is not one of step.attention.prefix_lengths {measured} (null takes the largest)",
        )


def _sglang_triton_source(attention: dict) -> None:
    """A given ``sglang_triton_source`` must hold SGLang's Triton extend-attention file; it is made absolute
    (from the working directory) so that every job finds the same files."""
    source = attention.get("sglang_triton_source")
    if source is None:
        return
    if not isinstance(source, str) or not source.strip():
        _fail("step.attention.sglang_triton_source", f"must be a directory path or null, got {source!r}")

    path = Path(source).expanduser()
    if not path.is_dir():
        _fail("step.attention.sglang_triton_source", f"{source} is not a directory")
    try:
        find_sglang_kernel(path)
    except ValueError as error:
        _fail("step.attention.sglang_triton_source", str(error).split(": ", 1)[-1])
    attention["sglang_triton_source"] = str(path.resolve())


# ----------------------------------------------------------------------------------------- derived values


DEFAULT_TOPK = 1024


def trace_columns(config: dict) -> int:
    """K, the top-K columns every trace holds: the configured ``topk`` (an integer, default 1024); fixed, so
    adding a budget never regenerates the traces."""
    return int(config.get("topk", DEFAULT_TOPK))


def builder_input_columns(config: dict) -> str:
    """Which columns the timing jobs hand each builder (``stages.build.prepare_run``): the first min(N, K)
    ("topk"), as a drafter emitting top-N would give them."""
    return "topk"


def trace_requests(config: dict) -> int:
    """R, the requests every trace holds: the largest batch size."""
    return max(config["batch_sizes"])


def timing_options(config: dict, section: dict | None = None) -> dict:
    """The ``timing`` section (or another section with the same keys) as keyword arguments of
    ``stages.build.run_benchmark``."""
    section = config["timing"] if section is None else section
    return {key: section[key] for key in TIMING_KEYS}


def step_options(config: dict) -> dict:
    """The step section with its nulls resolved: ``enabled``, ``layers``, ``batch_sizes`` and ``budgets`` (the
    configured ones for null), ``distribution`` and ``depth`` (the first configured for null), ``heads``,
    ``prefix_lengths``, ``impls``, ``flex_kernel_options`` (FlexAttention's kernel_options or None),
    ``sglang_triton_source`` (where sglang-triton finds SGLang's files; None: the installed sglang), and the
    timing dicts ``timing`` (accept and peaks: the top-level section)
    and ``attention_timing``."""
    step = config["step"]
    attention = step["attention"]
    flex_options = attention["flexattention_kernel_options"]
    return {
        "enabled": bool(step["enabled"]),
        "layers": int(step["layers"]),
        "batch_sizes": list(
            step["batch_sizes"] if step["batch_sizes"] is not None else config["batch_sizes"]
        ),
        "budgets": list(step["budgets"] if step["budgets"] is not None else config["budgets"]),
        "distribution": step["distribution"] or config["distributions"][0],
        "depth": int(step["depth"] if step["depth"] is not None else config["depths"][0]),
        "heads": list(attention["heads"]),
        "prefix_lengths": list(attention["prefix_lengths"]),
        "impls": list(attention["impls"]),
        "flex_kernel_options": None if flex_options is None else dict(flex_options),
        "sglang_triton_source": attention.get("sglang_triton_source"),
        "timing": timing_options(config),
        "attention_timing": timing_options(config, attention["timing"]),
    }


def throughput_options(config: dict) -> dict:
    """The throughput section as the report takes it: ``draft_ms``, ``fixed_ms``, ``per_token_us`` (floats)
    and ``prefix_length`` (None: the largest measured)."""
    section = config["throughput"]
    return {
        "draft_ms": float(section["draft_ms"]),
        "fixed_ms": float(section["rest"]["fixed_ms"]),
        "per_token_us": float(section["rest"]["per_token_us"]),
        "prefix_length": None if section["prefix_length"] is None else int(section["prefix_length"]),
    }
