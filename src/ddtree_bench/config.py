"""The workflow configuration: loading, defaults, schema validation and the checks a schema cannot say.

``check_config(config)`` is what ``settings.Settings.from_config`` runs (once; the Snakefile builds the
settings before anything else): it fills the schema's defaults,
normalises YAML's ``on``/``off`` booleans for ``gpu``, and raises ``ValueError`` with one line naming the
first problem (``config: budgets: must hold integers >= 1, got 0``), so a bad configuration fails the run
before any job starts.
"""

from __future__ import annotations

import copy
import numbers
import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from ddtree_bench import catalog
from ddtree_bench.catalog import ATTENTION_IMPLS, DISTRIBUTIONS, MOE_IMPLS, STREAM_IMPL  # noqa: F401 (re-exported)
from ddtree_bench.io import check_writable

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The keys of a timing section that ``timing.policy.TimingPolicy`` (and ``stages.build.run_benchmark``) take.
TIMING_KEYS = ("warmup", "repeats", "min_repeats", "max_repeats", "min_seconds", "max_seconds")
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"

#: The schema's enums that name catalog entries (a test checks the file's against the catalog; the checks
#: take the catalog's): a path of keys to the ``enum``, and the names.
CATALOG_ENUMS = (
    (("properties", "builders", "items"), catalog.builder_names),
    (("properties", "step", "properties", "round", "properties", "builders", "items"), catalog.builder_names),
    (("properties", "step", "properties", "round", "properties", "stacks", "items"), catalog.stack_names),
    (("properties", "distributions", "items"), lambda: DISTRIBUTIONS),
    (("properties", "acceptance_profiles", "items"), catalog.profile_names),
    (("properties", "step", "properties", "distribution", "oneOf", 1), lambda: DISTRIBUTIONS),
    (
        ("properties", "step", "properties", "attention", "properties", "impls", "items"),
        lambda: ATTENTION_IMPLS,
    ),
    (("properties", "step", "properties", "model", "properties", "moe_impls", "items"), lambda: MOE_IMPLS),
    (("properties", "step", "properties", "model", "properties", "forward_impl"), lambda: MOE_IMPLS),
)


def __getattr__(name: str):
    if name == "BUILDERS":  # read at each use: the catalog's builders
        return catalog.builder_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def schema_enum(schema: dict, path: tuple) -> dict:
    """The (sub)schema at ``path`` (keys and list indices), the one holding an ``enum``."""
    node = schema
    for key in path:
        node = node[key]
    return node


def load_schema(path: str | Path | None = None) -> dict:
    """The configuration schema, its catalog enums (``CATALOG_ENUMS``) set from the catalog."""
    with open(path or SCHEMA_PATH) as handle:
        schema = yaml.safe_load(handle)
    return with_catalog_enums(schema)


def with_catalog_enums(schema: dict) -> dict:
    """``schema`` (in place) with each of ``CATALOG_ENUMS`` holding the catalog's names: the file's names the
    catalog has, in the file's order, then the catalog's others. The builders' nodes have no enum in the
    file (a builder is one catalog entry); the others' file enums are checked against the catalog by a
    test."""
    for path, names in CATALOG_ENUMS:
        try:
            node = schema_enum(schema, path)
        except (KeyError, IndexError, TypeError):
            continue
        names, known = names(), node.get("enum", [])
        node["enum"] = [n for n in known if n in names] + [n for n in names if n not in known]
    return schema


def load_config(path: str | Path) -> dict:
    """Read a YAML config file (a mapping) and check it (see ``check_config``)."""
    return check_config(read_config_file(path))


def read_config_file(path: str | Path) -> dict:
    """A YAML config file's mapping (an empty file: ``{}``), unchecked. Raises ``ValueError``, one line naming
    the file, and for a syntax error its line and column."""
    path = Path(path)
    try:
        with open(path) as handle:
            data = yaml.safe_load(handle)
    except OSError as error:
        raise ValueError(f"config {path}: cannot read it ({error.strerror})") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        context = getattr(error, "context", None)
        detail = f"{context}: {problem}" if context else problem
        raise ValueError(f"config {path}: not valid YAML{where}: {' '.join(str(detail).split())}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"config {path}: must be a mapping of keys to values, got {type(data).__name__}")
    return data


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


def schema_default(path: str, schema: dict | None = None):
    """The schema's default of one setting, by its dotted path (``"step.layers"``): the one place a
    default is declared. Raises ``KeyError`` for a setting without one."""
    schema = schema or load_schema()
    node = schema
    for key in path.split("."):
        node = _resolve(node["properties"][key], schema)
    return copy.deepcopy(node["default"])


# ----------------------------------------------------------------------------------------- numeric strings

_INTEGER = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _types(schema: dict, root: dict) -> set[str]:
    """The JSON types a (sub)schema admits, through ``$ref`` and ``oneOf``/``anyOf``."""
    schema = _resolve(schema, root)
    kinds = schema.get("type", [])
    kinds = {kinds} if isinstance(kinds, str) else set(kinds)
    for key in ("oneOf", "anyOf"):
        for option in schema.get(key, ()):
            kinds |= _types(option, root)
    return kinds


def _branches(schema: dict, root: dict) -> list[dict]:
    schema = _resolve(schema, root)
    return [schema] + [_resolve(option, root) for key in ("oneOf", "anyOf") for option in schema.get(key, ())]


def _number_of(value, kinds: set[str]):
    """``value`` as an int or float where it is a string spelling one and the schema admits that type."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if "integer" in kinds and _INTEGER.fullmatch(text):
        return int(text)
    if "number" in kinds and _NUMBER.fullmatch(text):
        return float(text)
    return value


def coerce_numeric_strings(config: dict, given, schema: dict | str | Path | None = None) -> dict:
    """The values ``given`` on Snakemake's command line (``--config``), numbers as strings, become numbers in
    ``config`` (in place) wherever the schema wants an integer or a number, lists of them included:
    Snakemake hands ``--config budgets=[8,16]`` over as ``['8', '16']``. Only those: a string a config file
    gives (``budgets: ["16"]``) stays a string, and the checks refuse it. Other strings stay as they are
    (the checks then name them)."""
    if not isinstance(schema, dict):
        schema = load_schema(schema)
    _coerce(config, schema, schema, given)
    return config


def _coerce(instance: dict, schema: dict, root: dict, given) -> None:
    for key, sub in _resolve(schema, root).get("properties", {}).items():
        if key not in instance or not isinstance(given, Mapping) or key not in given:
            continue
        kinds = _types(sub, root)
        value = instance[key]
        if isinstance(value, str):
            instance[key] = _number_of(value, kinds)
        elif isinstance(value, list):
            items = set()
            for branch in _branches(sub, root):
                if "items" in branch:
                    items |= _types(branch["items"], root)
            instance[key] = [_number_of(item, items) for item in value]
        elif isinstance(value, dict):
            for branch in _branches(sub, root):
                if "properties" in branch:
                    _coerce(value, branch, root, given[key])


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
    _name_list(config, "builders", catalog.builder_names(), "builder")
    _timing_counts(config.get("timing"), "timing")
    _step_lists(config.get("step"))
    _throughput_numbers(config.get("throughput"))
    _drafter_params(config)
    _schema_check(config, schema)

    _timing_order(config["timing"], "timing")
    _step_fields(config, budgets, batch_sizes, depths, distributions)
    _throughput_fields(config)
    _sglang_triton_source(config["step"]["attention"])
    _round_shapes(config["step"], batch_sizes)
    columns = int(config["topk"])  # K, the traces' top-K columns
    if config["vocab_size"] < columns:
        _fail("vocab_size", f"{config['vocab_size']} is smaller than the {columns} top-K columns needed")
    _budgets_within_topk(budgets, columns)
    if "recorded" in distributions:
        recorded = config.get("recorded_trace")
        if not recorded:
            _fail("recorded_trace", "distribution 'recorded' needs recorded_trace, the path of a .npz trace")
    _sglang_source(config)
    _input_paths(config, columns)
    _sort_keys(config)
    return config


def _sort_keys(config: dict) -> None:
    """Every mapping's keys in sorted order (in place): settings derived from the configuration compare
    equal whatever order a YAML file wrote them in (Snakemake reruns a job whose params changed)."""
    for value in config.values():
        if isinstance(value, dict):
            _sort_keys(value)
    items = sorted(config.items())
    config.clear()
    config.update(items)


def _depth_follows_budget(config: dict, budgets: list[int]) -> None:
    """SGLang's regime: with ``depth_follows_budget`` every budget N runs on traces of L = N positions
    (SGLang's DDTree worker drafts a block of N + 1 tokens for budget N), so ``depths`` becomes the budgets
    and the grid pairs each budget with its own depth (``Settings.depth_budget_pairs``)."""
    follows = config.get("depth_follows_budget", False)
    if not isinstance(follows, bool):
        _fail("depth_follows_budget", f"must be true or false, got {follows!r}")
    if follows:
        config["depths"] = sorted(set(budgets))


def _sglang_source(config: dict) -> None:
    """``sglang.source``, where the sglang builder is configured: the file is found, defines the function and
    torch is installed (the user asked for this builder explicitly: no quiet "unavailable")."""
    source = (config.get("sglang") or {}).get("source")
    if source is None or "sglang" not in config["builders"]:
        return

    from ddtree_bench.builders.sglang import check_source  # noqa: PLC0415

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

    from ddtree_bench.traces import check_trace_file  # noqa: PLC0415

    try:
        shape = check_trace_file(recorded, config["vocab_size"])
    except ValueError as error:
        _fail("recorded_trace", str(error))
    needs = (
        ("requests", max(config["batch_sizes"]), "the largest of batch_sizes"),
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
    from ddtree_bench.drafter import check_params  # noqa: PLC0415

    try:
        check_params(drafter, where="drafter")
    except ValueError as error:
        raise ValueError(f"config: {error}") from None


def _timing_counts(timing, field: str) -> None:
    """The counts of a timing section are integers (YAML's 1.5 or true would pass as numbers otherwise)."""
    if not isinstance(timing, dict):
        return
    for key in ("warmup", "repeats", "min_repeats", "max_repeats", "jobs"):
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
    model = step.get("model")
    if isinstance(model, dict) and "moe_impls" in model:
        _name_list(model, "moe_impls", MOE_IMPLS, "MoE impl", field="step.model.moe_impls")
    if isinstance(model, dict) and "forward_impl" in model and model["forward_impl"] not in MOE_IMPLS:
        known = ", ".join(MOE_IMPLS)
        _fail("step.model.forward_impl", f"unknown MoE impl {model['forward_impl']!r}; known: {known}")


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


def _round_shapes(step: dict, batch_sizes: list) -> None:
    """The model and drafter shapes the schema cannot check (divisibility by tp, dense layers <= layers),
    and the MoE kernels' files where a path is given."""
    from ddtree_bench.k26.shapes import DrafterShape, ModelShape  # noqa: PLC0415

    try:
        ModelShape.from_config({**step["model"]["shape"], "layers": step["layers"]})
    except ValueError as error:
        _fail("step.model.shape", str(error).removeprefix("model: "))
    try:
        DrafterShape.from_config(step["draft"]["shape"])
    except ValueError as error:
        _fail("step.draft.shape", str(error).removeprefix("draft: "))
    round_ = step["round"]
    allowed = step["batch_sizes"] if step["batch_sizes"] is not None else batch_sizes
    for batch in round_["batch_sizes"] or ():
        if batch not in allowed:
            _fail("step.round.batch_sizes", f"{batch} is not one of the step's batch sizes {allowed}")
    files = step["model"]["sglang_files"]
    if files is not None and not Path(files).is_dir():
        _fail("step.model.sglang_files", f"{files!r} is not a folder (one holding sglang/ from its wheel)")


#: The throughput section's numbers: (path, key, what it must be); "ge0": finite >= 0, "gt0": finite > 0,
#: "int1": an integer >= 1; a trailing "?" allows null.
THROUGHPUT_NUMBERS = (
    ((), "draft_ms", "ge0?"),
    ((), "forward_ms", "ge0?"),
    (("what_if",), "dense_weights_gb", "ge0"),
    (("what_if",), "expert_slice_mb", "ge0"),
    (("what_if",), "dense_per_token_us", "ge0"),
    (("what_if",), "expert_per_token_us", "ge0"),
    (("what_if",), "draft_weights_gb", "ge0"),
    (("what_if",), "draft_per_token_us", "ge0"),
    (("what_if",), "bandwidth_tbps", "gt0?"),
    (("allreduce",), "bus_bandwidth_gbps", "gt0"),
    (("allreduce",), "latency_us", "ge0"),
    ((), "prefix_length", "int1?"),
)
_THROUGHPUT_RULES = {
    "ge0": "a finite number >= 0",
    "gt0": "a finite number > 0",
    "int1": "an integer >= 1",
}


def _throughput_numbers(section) -> None:
    """The throughput model's numbers (before the schema: one clear line each)."""
    if not isinstance(section, dict):
        return  # the schema names the problem
    for path, key, rule in THROUGHPUT_NUMBERS:
        where = section
        for part in path:
            where = where.get(part) if isinstance(where, dict) else None
        if not isinstance(where, dict) or key not in where:
            continue
        value = where[key]
        nullable = rule.endswith("?")
        rule = rule.rstrip("?")
        if value is None and nullable:
            continue
        if rule == "int1":
            bad = isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
        else:
            bad = (
                isinstance(value, bool)
                or not isinstance(value, numbers.Real)
                or value != value  # NaN
                or value in (float("inf"), float("-inf"))
                or value < 0
                or (rule == "gt0" and value == 0)
            )
        if bad:
            field = ".".join(("throughput", *path, key))
            _fail(field, f"must be {_THROUGHPUT_RULES[rule]}{' or null' if nullable else ''}, got {value!r}")


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
    from ddtree_bench.ops.attention_peers import find_sglang_kernel  # noqa: PLC0415

    try:
        find_sglang_kernel(path)
    except ValueError as error:
        _fail("step.attention.sglang_triton_source", str(error).split(": ", 1)[-1])
    attention["sglang_triton_source"] = str(path.resolve())


def check_output_paths(settings, results: str | Path = "results") -> None:
    """The folders a run writes (``settings.report_dir``, and ``results`` under the working directory) can
    be created and written, checked when the workflow loads its settings: an unwritable one is one line
    (``ValueError``) before any job, not a failure of the last job. Creates nothing."""
    for field, path in (("report_dir", settings.report_dir), ("results", results)):
        check_writable(path, f"config: {field}:", folder=True)


def check_builders_run_here(builders, unavailable: dict[str, str], gpu: str = "auto") -> None:
    """At least one configured builder can run on this machine (``unavailable``: each builder that cannot,
    with why: the gpu builder without a usable GPU or under ``gpu: off``, SGLang's without torch). Where
    none can, the run would time nothing and report it: refused (``ValueError``, one line), before any job.
    Where one can, the others get their "unavailable" rows, as ``gpu: auto`` promises."""
    if any(builder not in unavailable for builder in builders):
        return
    reasons = ", ".join(f"{builder} ({' '.join(str(unavailable[builder]).split())})" for builder in builders)
    cpu = [
        b for b in catalog.builders_where(runner=catalog.CPU) if b not in unavailable and b != catalog.SGLANG
    ]
    fix = f"Add a CPU builder ({', '.join(cpu)})"
    if all(catalog.BUILDERS[builder].runner == catalog.GPU for builder in builders):
        fix += " or set gpu: auto" if gpu == "off" else " or run on a machine with a usable GPU"
    _fail("builders", f"none can run here: {reasons}. {fix}")


#: The committed results of other machines, one folder per machine label (``<root>/<label>/``).
PUBLISHED_ROOT = Path("results/published")


def published_files(
    name: str = "summary.parquet", root=PUBLISHED_ROOT, first: str | None = None
) -> list[Path]:
    """``<root>/<label>/<name>`` of every published machine that has it: ``first``'s (the published answer)
    first, then the others by folder name (by name, not by path: ``h200`` before ``h200-sglang``)."""
    paths = sorted(Path(root).glob(f"*/{name}"), key=lambda p: p.parent.name)
    return sorted(paths, key=lambda p: p.parent.name != first)


def check_published_answer(settings, root: str | Path = PUBLISHED_ROOT) -> None:
    """``published_answer`` names a folder of ``root`` with a ``summary.parquet`` (checked when the workflow
    loads its settings): a name that matches none of the published folders there is one line
    (``ValueError``) naming them. Without any published folder there is nothing to name (a copy of the
    workflow alone): the report then says that no published answer is here."""
    root = Path(root)
    folders = [p.parent.name for p in published_files(root=root)]
    if folders and settings.published_answer not in folders:
        _fail(
            "published_answer",
            f"{settings.published_answer}: no {root}/{settings.published_answer}/summary.parquet "
            f"(published machines there: {', '.join(folders)})",
        )
