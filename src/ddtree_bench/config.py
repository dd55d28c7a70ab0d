"""The workflow configuration: loading, defaults, schema validation and the checks a schema cannot say.

``check_config(config)`` is what ``settings.Settings.from_config`` runs (once; the Snakefile builds the
settings before anything else): it fills the schema's defaults, normalises YAML's ``on``/``off`` booleans
for ``gpu``, checks the configuration against the schema (``workflow/schemas/config.schema.yaml``, the
catalog's names merged into its enums) and then what a schema cannot say (values across fields, the input
files named, NaN and infinity), and raises ``ValueError`` with one line naming the first problem: the
schema's best match as ``config: <field path>: <problem>`` (``config: budgets[1]: 0 is less than the
minimum of 1``), so a bad configuration fails the run before any job starts."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from ddtree_bench import catalog
from ddtree_bench.catalog import ATTENTION_IMPLS, DISTRIBUTIONS, MOE_IMPLS, STREAM_IMPL  # noqa: F401 (re-exported)
from ddtree_bench.io import check_writable
from ddtree_bench.paths import layout

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The keys of a timing section: ``timing.policy.TimingPolicy``'s keyword arguments (a job's ``timing``).
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


class DuplicateKeyError(ValueError):
    """A key given twice in one YAML mapping: YAML keeps the last silently, so one of them would be lost."""

    def __init__(self, key, line: int, first: int):
        super().__init__(
            f"line {line}: key {key!r} is given twice (first at line {first}); YAML would keep only the last "
            "one, silently"
        )
        self.key, self.line, self.first = key, line, first


class StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping, at any depth, is refused
    (``DuplicateKeyError``); keys a merge (``<<: *anchor``) brings in may be overridden, as YAML says."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise DuplicateKeyError(key, line, seen[key])
                    seen[key] = line
                except TypeError:  # an unhashable key: the base loader says what is wrong with it
                    continue
        return super().construct_mapping(node, deep)


def strict_yaml(text: str, where: str):
    """``text`` as YAML (``StrictLoader``: a key given twice is refused). Raises ``ValueError``, one line
    starting with ``where`` (a file: ``config FILE``; an option: ``--set FIELD``), for a syntax error its line
    and column, for a repeated key its line and the key."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (StrictLoader is a SafeLoader)
    except DuplicateKeyError as error:
        raise ValueError(f"{where}: {error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        context = getattr(error, "context", None)
        detail = f"{context}: {problem}" if context else problem
        raise ValueError(f"{where}: not valid YAML{at}: {' '.join(str(detail).split())}") from None


def read_config_file(path: str | Path) -> dict:
    """A YAML config file's mapping (an empty file: ``{}``), unchecked. Raises ``ValueError``, one line naming
    the file: for a syntax error its line and column, for a key given twice (at any depth) its line and the
    key."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        why = getattr(error, "strerror", None) or "not a text file"
        raise ValueError(f"config {path}: cannot read it ({why})") from None
    data = strict_yaml(text, f"config {path}")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"config {path}: must be a mapping of keys to values, got {type(data).__name__}")
    return data


# ----------------------------------------------------------------------------------------- layering

#: The workflow's own configuration file: the first layer of every run (docs/configuration.md).
DEFAULT_CONFIG = REPO_ROOT / "config" / "config.yaml"


def merge_config(base: dict, over: dict) -> dict:
    """``over`` merged over ``base`` key by key, nested mappings merged, anything else replaced (a new
    mapping; neither is changed): how Snakemake merges its --configfile files and --config."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def layered_config(configfiles=(), overrides: dict | None = None, base: str | Path | None = DEFAULT_CONFIG):
    """The one layering rule of every command (docs/configuration.md): ``base`` (config/config.yaml), then
    every file of ``configfiles`` in order, then ``overrides`` (Snakemake's --config, a mapping), each merged
    over the ones before (``merge_config``). Unchecked; a file that cannot be read or is not valid YAML (a
    key given twice included) raises ``ValueError``, one line naming it."""
    config: dict = {}
    for path in ([base] if base is not None else []) + list(configfiles):
        config = merge_config(config, read_config_file(path))
    return merge_config(config, overrides or {})


def configfile_arguments(args: list[str]) -> list[str]:
    """The files a Snakemake command line gives with ``--configfile``/``--configfiles``, every occurrence in
    order (each takes one or more files, up to the next option; ``--configfile=FILE`` too)."""
    return [file for _, files in configfile_groups(args) for file in files]


def configfile_groups(args: list[str]) -> list[tuple[int, list[str]]]:
    """Each ``--configfile``/``--configfiles`` occurrence of a Snakemake command line: its index in ``args``
    and its files. Snakemake keeps only the last occurrence's files (its option is a list, given anew)."""
    groups, taking = [], False
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg in ("--configfile", "--configfiles"):
            groups.append((index, []))
            taking = True
        elif arg.startswith(("--configfile=", "--configfiles=")):
            groups.append((index, [arg.split("=", 1)[1]]))
            taking = False
        elif arg.startswith("-"):
            taking = False
        elif taking:
            groups[-1][1].append(arg)
    return groups


def one_configfile_list(args: list[str]) -> list[str]:
    """A Snakemake command line with every ``--configfile``/``--configfiles`` given as one list, in their
    order (Snakemake keeps only the last of several): before ``--`` where there is one, else at the end.
    Unchanged where there is at most one."""
    groups = configfile_groups(args)
    if len(groups) < 2:
        return list(args)
    taken = set()
    for index, files in groups:
        span = 1 if args[index].startswith("--configfile") and "=" in args[index] else 1 + len(files)
        taken |= set(range(index, index + span))
    rest = [arg for index, arg in enumerate(args) if index not in taken]
    merged = ["--configfiles", *(file for _, files in groups for file in files)]
    end = rest.index("--") if "--" in rest else len(rest)
    return rest[:end] + merged + rest[end:]


def check_layering(args: list[str], taken, replace_workflow_config: bool = False) -> None:
    """What Snakemake was given on its command line (``args``) against what it took (``taken``: its
    configfiles): ``--configfile`` given more than once keeps only the last one's files in Snakemake, and
    ``--replace-workflow-config`` drops config/config.yaml; either breaks the one layering rule, so the run
    stops (``ValueError``, one line) instead of running another configuration than the one asked for."""
    if replace_workflow_config:
        _fail(
            "--replace-workflow-config",
            "not supported: every run layers config/config.yaml, then each --configfile, then --config "
            "(docs/configuration.md)",
        )
    given = configfile_arguments(args)
    kept = {Path(path).absolute() for path in taken}
    dropped = [path for path in given if Path(path).absolute() not in kept]
    if dropped:
        _fail(
            "--configfile",
            f"given {len(configfile_groups(args))} times: Snakemake keeps only the last, so "
            f"{', '.join(dropped)} would be dropped; give them all after one --configfiles, or run "
            "through `ddtree-bench workflow` (make does), which does so",
        )


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


def field_path(path) -> str:
    """A schema error's place in the configuration, dotted, list items indexed: ``step.attention.heads[1]``
    (``(top level)`` for the configuration itself)."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "(top level)"


def _is_int(_checker, value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def schema_validator(schema: dict):
    """The schema's validator, its ``integer`` a Python int (JSON Schema's admits 8.0, which would name
    files and rows ``N8.0``)."""
    import jsonschema  # noqa: PLC0415

    cls = jsonschema.validators.validator_for(schema)
    checker = cls.TYPE_CHECKER.redefine("integer", _is_int)
    return jsonschema.validators.extend(cls, type_checker=checker)(schema)


def schema_error(config: dict, schema: dict) -> str | None:
    """The schema's best-match error as one line, ``<field path>: <problem>``, or ``None``."""
    import jsonschema  # noqa: PLC0415

    error = jsonschema.exceptions.best_match(schema_validator(schema).iter_errors(config))
    if error is None:
        return None
    problem = _branches_wording(error) if error.validator in ("oneOf", "anyOf") else error.message
    return f"{field_path(error.absolute_path)}: {' '.join(problem.split())}"


def _branches_wording(error) -> str:
    """A ``oneOf``/``anyOf`` error that ``best_match`` stopped at (every branch as wrong as the others) in
    its branches' words: ``'fast' is not of type 'null', 'number'``, not "is not valid under any of the
    given schemas". Where the value has a branch's type, that branch's problem."""
    kinds, problems = [], []
    for branch in sorted({e.relative_schema_path[0] for e in error.context}):
        errors = [e for e in error.context if e.relative_schema_path[0] == branch and not e.relative_path]
        types = [e.validator_value for e in errors if e.validator == "type"]
        kinds += [k for t in types for k in ([t] if isinstance(t, str) else t)]
        problems += [] if types else [e.message for e in errors]
    if problems or not kinds:
        return "; ".join(dict.fromkeys(problems)) or error.message
    return f"{error.instance!r} is not of type {', '.join(map(repr, dict.fromkeys(kinds)))}"


def check_config(config: dict, schema: dict | str | Path | None = None) -> dict:
    """Fill defaults into ``config`` (in place), check it against the schema (the catalog's names merged
    in), then what the schema cannot say (across fields, input files), and return it. Raises ``ValueError``
    with one line naming the first problem (the schema's: its best match)."""
    if not isinstance(config, dict):
        raise ValueError(f"config: must be a mapping, got {type(config).__name__}")
    schema = with_catalog_enums(schema) if isinstance(schema, dict) else load_schema(schema)
    # YAML 1.1 reads unquoted on/off as booleans.
    if isinstance(config.get("gpu"), bool):
        config["gpu"] = "on" if config["gpu"] else "off"
    _retired_values(config)
    apply_defaults(config, schema)
    problem = schema_error(config, schema)
    if problem is not None:
        raise ValueError(f"config: {problem}")
    _finite_numbers(config)
    _cross_field(config)
    _sort_keys(config)
    return config


def _cross_field(config: dict) -> None:
    """What the schema cannot say: values that depend on other values, and the input files named."""
    budgets, batch_sizes = config["budgets"], config["batch_sizes"]
    _depth_follows_budget(config)
    _timing_order(config["timing"], "timing")
    _step_fields(config)
    _throughput_fields(config)
    _sglang_triton_source(config["step"]["attention"])
    _round_shapes(config["step"], batch_sizes)
    columns = config["topk"]  # K, the traces' top-K columns
    if config["vocab_size"] < columns:
        _fail("vocab_size", f"{config['vocab_size']} is smaller than the {columns} top-K columns needed")
    _budgets_within_topk(budgets, columns)
    if "recorded" in config["distributions"] and not config.get("recorded_trace"):
        _fail("recorded_trace", "distribution 'recorded' needs recorded_trace, the path of a .npz trace")
    _sglang_source(config)
    _input_paths(config, columns)


def _depth_follows_budget(config: dict) -> None:
    """SGLang's regime: with ``depth_follows_budget`` every budget N runs on traces of L = N positions
    (SGLang's DDTree worker drafts a block of N + 1 tokens for budget N), so ``depths`` becomes the budgets
    and the grid pairs each budget with its own depth (``Settings.depth_budget_pairs``)."""
    if config["depth_follows_budget"]:
        config["depths"] = sorted(set(config["budgets"]))


def _finite_numbers(value, path: tuple = ()) -> None:
    """No NaN or infinity anywhere: the schema's ranges let NaN through (it compares false) and YAML
    spells both (``.nan``, ``.inf``)."""
    if isinstance(value, dict):
        for key, item in value.items():
            _finite_numbers(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _finite_numbers(item, (*path, index))
    elif isinstance(value, float) and not math.isfinite(value):
        _fail(field_path(path), f"must be a finite number, got {value!r}")


def _sort_keys(config: dict) -> None:
    """Every mapping's keys in sorted order (in place): settings derived from the configuration compare
    equal whatever order a YAML file wrote them in (Snakemake reruns a job whose params changed)."""
    for value in config.values():
        if isinstance(value, dict):
            _sort_keys(value)
    items = sorted(config.items())
    config.clear()
    config.update(items)


def _sglang_source(config: dict) -> None:
    """``sglang.source``, where the sglang builder is configured: the file is found, defines the function and
    torch is installed (the user asked for this builder explicitly: no quiet "unavailable")."""
    source = config["sglang"].get("source")
    if source is None or catalog.SGLANG not in config["builders"]:
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


def _timing_order(timing: dict, field: str) -> None:
    if timing["min_repeats"] > timing["repeats"]:
        _fail(field, f"min_repeats ({timing['min_repeats']}) > repeats ({timing['repeats']})")
    if timing["repeats"] > timing["max_repeats"]:
        _fail(field, f"repeats ({timing['repeats']}) > max_repeats ({timing['max_repeats']})")
    if timing["min_seconds"] > timing["max_seconds"]:
        _fail(field, f"min_seconds ({timing['min_seconds']}) > max_seconds ({timing['max_seconds']})")


def _step_fields(config: dict) -> None:
    """What the step section may name depends on the rest: traces, budgets, depths, distributions."""
    step = config["step"]
    budgets, depths, distributions = config["budgets"], config["depths"], config["distributions"]
    _timing_order(step["attention"]["timing"], "step.attention.timing")
    requests = max(config["batch_sizes"])
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
    if not source.strip():
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


def check_output_paths(settings, results: str | Path | None = None) -> None:
    """The folders a run writes (``settings.report_dir``, and ``results``: by default the run's own,
    ``results/<machine>``) can be created and written, checked when the workflow loads its settings: a file
    is made, written and removed where each would go (``io.check_writable``), so a read-only folder or a full
    disk is one line (``ValueError``) before any job, not a traceback mid-run. Leaves nothing behind."""
    results = layout(settings).results if results is None else results
    for field, path in (("results", results), ("report_dir", settings.report_dir)):
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


def published_results(root=PUBLISHED_ROOT, first: str | None = None) -> list[Path]:
    """``<root>/<label>/summary.parquet`` of every published machine, as the report loads them (the order of
    ``published_files``): those with a tree-build summary, and those holding the step stages' summary alone
    (a run of the round's stacks: its ``summary.parquet`` path does not exist, and the report knows it)."""
    folders = {p.parent for p in published_files("summary.parquet", root)}
    folders |= {p.parent for p in published_files("step_summary.parquet", root)}
    ordered = sorted(folders, key=lambda p: p.name)
    return [p / "summary.parquet" for p in sorted(ordered, key=lambda p: p.name != first)]


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
