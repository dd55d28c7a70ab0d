"""The workflow's settings as one typed, immutable object, built and checked once from the configuration.

``Settings.from_config(mapping)`` (or ``load_settings(path)``) runs ``config.check_config`` once (the schema,
its defaults and the checks a schema cannot say: a bad setting is one ``ValueError`` line naming it) and
gives frozen dataclasses whose field names are the schema's keys, section by section
(``settings.timing.repeats``, ``settings.step.attention.heads``, ``settings.throughput.what_if``). Every
default lives in the schema (``workflow/schemas/config.schema.yaml``); these classes declare none
(``tests/test_settings.py`` proves both). Lists are tuples; what the stages, rules and report take as keyword
mappings (``timing.options()``, ``step_options()``, ``throughput_options()``, ``recorded()``) is derived here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType

from ddtree_bench.config import TIMING_KEYS, check_config, layered_config
from ddtree_bench.k26.shapes import DrafterShape, ModelShape


def _frozen(value):
    """A configuration value as an immutable one: lists as tuples, mappings as read-only mappings."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    if isinstance(value, dict):
        return MappingProxyType({key: _frozen(item) for key, item in value.items()})
    return value


def _section(cls, mapping: dict, **nested):
    """``cls`` from a checked section: each field its key's (frozen) value, or ``nested``'s object."""
    values = {f.name: nested[f.name] if f.name in nested else _frozen(mapping[f.name]) for f in fields(cls)}
    return cls(**values)


@dataclass(frozen=True)
class SamplingSettings:
    """How a timing job samples (``step.attention.timing``; the top-level ``timing`` adds ``jobs`` and
    ``in_situ``)."""

    warmup: int
    repeats: int
    min_repeats: int
    max_repeats: int
    min_seconds: float
    max_seconds: float

    def options(self) -> dict:
        """``TimingPolicy``'s keyword arguments (``TIMING_KEYS``): a job's ``timing``."""
        return {key: getattr(self, key) for key in TIMING_KEYS}


@dataclass(frozen=True)
class TimingSettings(SamplingSettings):
    """The top-level ``timing`` section."""

    jobs: int
    in_situ: bool


@dataclass(frozen=True)
class DrafterSettings:
    """The drafter distributions' parameters (``drafter``; fields in the checked mapping's sorted order)."""

    alt_mass: float
    alt_ranks: int
    alt_ratio: float
    confident_decay: float
    confident_fraction: float
    confident_top1: float
    top1_spread: float
    uncertain_decay: float
    uncertain_top1: float

    def as_dict(self) -> dict:
        """The parameters as ``drafter.generate``'s mapping (the trace rule's params)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class SglangSettings:
    """Where SGLang's tree builder is looked up (``sglang``)."""

    module_paths: tuple[str, ...]
    source: str | None


@dataclass(frozen=True)
class AttentionSettings:
    """``step.attention``."""

    heads: tuple[int, ...]
    prefix_lengths: tuple[int, ...]
    impls: tuple[str, ...]
    sglang_triton_source: str | None
    flexattention_kernel_options: MappingProxyType | None
    timing: SamplingSettings


@dataclass(frozen=True)
class ModelSettings:
    """``step.model``; ``shape`` is the ``k26.shapes.ModelShape`` (its layers: ``step.layers``)."""

    enabled: bool
    moe_impls: tuple[str, ...]
    forward_impl: str
    routing: str
    skew: float
    sglang_files: str | None
    shape: ModelShape


@dataclass(frozen=True)
class DraftSettings:
    """``step.draft``; ``shape`` is the ``k26.shapes.DrafterShape``."""

    enabled: bool
    block_size: int
    follow_budget: bool
    shape: DrafterShape


@dataclass(frozen=True)
class RoundSettings:
    """``step.round``."""

    enabled: bool
    builders: tuple[str, ...]
    batch_sizes: tuple[int, ...] | None
    stacks: tuple[str, ...]
    max_round_seconds: float
    chain_blocks: tuple[int, ...]
    warmup: int
    repeats: int
    repeat_budgets: tuple[int, ...]
    repeat_runs: int
    expert_sets: int | None


@dataclass(frozen=True)
class AllreduceSettings:
    """``step.allreduce``."""

    enabled: bool


@dataclass(frozen=True)
class StepSettings:
    """The step section as configured (nulls kept; ``Settings.step_options`` resolves them)."""

    enabled: bool
    layers: int
    batch_sizes: tuple[int, ...] | None
    budgets: tuple[int, ...] | None
    distribution: str | None
    depth: int | None
    attention: AttentionSettings
    model: ModelSettings
    draft: DraftSettings
    round: RoundSettings
    allreduce: AllreduceSettings


@dataclass(frozen=True)
class WhatIfSettings:
    """``throughput.what_if`` (fields in the checked mapping's sorted order)."""

    bandwidth_tbps: float | None
    dense_per_token_us: float
    dense_weights_gb: float
    draft_per_token_us: float
    draft_weights_gb: float
    expert_per_token_us: float
    expert_slice_mb: float


@dataclass(frozen=True)
class CommSettings:
    """``throughput.allreduce``: the communication estimate's numbers."""

    bus_bandwidth_gbps: float
    latency_us: float


@dataclass(frozen=True)
class ThroughputSettings:
    """``throughput``: the report's "Which budget?" model."""

    draft_ms: float | None
    forward_ms: float | None
    what_if: WhatIfSettings
    allreduce: CommSettings
    prefix_length: int | None


#: What ``Settings.recorded`` records of the configuration, by group (``aggregate``'s params, one per group,
#: so a change reruns it only where it changes a result, and its rerun reason names only that group). The
#: step group holds only what the report reads back from a published ``environment.json``.
RECORDED = {
    "grid": (
        "distributions",
        "depths",
        "depth_follows_budget",
        "budgets",
        "batch_sizes",
        "builders",
        "acceptance_profiles",
    ),
    "traces": ("vocab_size", "seed", "topk", "trace_device", "recorded_trace", "drafter"),
    "builds": ("machine", "gpu", "cuda_archs", "compile_without_gpu", "sglang"),
    "timing": ("timing",),
}
RECORDED_STEP = ("enabled", "layers", "depth", "distribution", "budgets", "round")
#: Not recorded: the report's own settings (the report rule takes them; they change no result).
NOT_RECORDED = ("report_dir", "published_answer", "throughput")


@dataclass(frozen=True)
class Settings:
    """Every setting of a run, checked: the grid and the sections (see the module's docstring)."""

    machine: str | None
    report_dir: str
    #: the published machine whose answer a report without its own shows (``results/published/<label>/``)
    published_answer: str
    budgets: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    depths: tuple[int, ...]
    depth_follows_budget: bool
    distributions: tuple[str, ...]
    acceptance_profiles: tuple[str, ...]
    vocab_size: int
    seed: int
    topk: int
    trace_device: str
    recorded_trace: str | None
    drafter: DrafterSettings
    builders: tuple[str, ...]
    gpu: str
    cuda_archs: tuple[str, ...]
    compile_without_gpu: bool
    sglang: SglangSettings
    timing: TimingSettings
    step: StepSettings
    throughput: ThroughputSettings
    #: the checked mapping it was built from (``as_config`` hands out copies)
    _config: MappingProxyType = field(repr=False, compare=False)

    # ------------------------------------------------------------------------------------------ building
    @classmethod
    def from_config(cls, config: dict, schema: dict | str | Path | None = None) -> Settings:
        """Check a configuration mapping (a copy: ``config`` is left as it is) and build the settings.
        Raises ``ValueError`` with one line naming the first bad setting."""
        if not isinstance(config, dict):
            raise ValueError(f"config: must be a mapping, got {type(config).__name__}")
        checked = check_config(copy.deepcopy(config), schema)
        return cls._from_checked(checked)

    @classmethod
    def _from_checked(cls, c: dict) -> Settings:
        step, throughput = c["step"], c["throughput"]
        attention, model, draft = step["attention"], step["model"], step["draft"]
        return _section(
            cls,
            c,
            drafter=_section(DrafterSettings, c["drafter"]),
            sglang=_section(SglangSettings, c["sglang"]),
            timing=_section(TimingSettings, c["timing"]),
            step=_section(
                StepSettings,
                step,
                attention=_section(
                    AttentionSettings, attention, timing=_section(SamplingSettings, attention["timing"])
                ),
                model=_section(
                    ModelSettings,
                    model,
                    shape=ModelShape.from_config({**model["shape"], "layers": int(step["layers"])}),
                ),
                draft=_section(DraftSettings, draft, shape=DrafterShape.from_config(draft["shape"])),
                round=_section(RoundSettings, step["round"]),
                allreduce=_section(AllreduceSettings, step["allreduce"]),
            ),
            throughput=_section(
                ThroughputSettings,
                throughput,
                what_if=_section(WhatIfSettings, throughput["what_if"]),
                allreduce=_section(CommSettings, throughput["allreduce"]),
            ),
            _config=MappingProxyType(copy.deepcopy(c)),
        )

    def __reduce__(self):
        """Pickled as its checked mapping (Snakemake hands the settings to a rule's script so)."""
        return (Settings._from_checked, (self.as_config(),))

    def as_config(self) -> dict:
        """The checked configuration mapping (defaults filled, keys sorted): a fresh copy."""
        return copy.deepcopy(dict(self._config))

    # ------------------------------------------------------------------------------------------ the grid
    @property
    def trace_columns(self) -> int:
        """K, the top-K columns every trace holds (``topk``; fixed, so adding a budget never regenerates
        the traces)."""
        return int(self.topk)

    @property
    def trace_requests(self) -> int:
        """R, the requests every trace holds: the largest batch size."""
        return max(self.batch_sizes)

    @property
    def builder_input_columns(self) -> str:
        """Which columns the timing jobs hand each builder (``stages.build.prepare_run``): the first
        min(N, K) ("topk"), as a drafter emitting top-N would give them."""
        return "topk"

    @property
    def depth_budget_pairs(self) -> list[tuple[int, int]]:
        """The (depth L, budget N) points of the grid: every depth with every budget, or in SGLang's regime
        (``depth_follows_budget``) each budget with L = N."""
        if self.depth_follows_budget:
            return [(int(n), int(n)) for n in self.budgets]
        return [(int(d), int(n)) for d in self.depths for n in self.budgets]

    def grid(self, keys) -> dict:
        """The grid's lists named by ``keys`` (e.g. ``consistency.GRID_KEYS``), as lists."""
        return {key: list(getattr(self, key)) for key in keys}

    # ------------------------------------------------------------------------------------------ the step
    @property
    def step_batch_sizes(self) -> list[int]:
        """The step jobs' batch sizes (``step.batch_sizes``; null: ``batch_sizes``)."""
        step = self.step
        return list(step.batch_sizes if step.batch_sizes is not None else self.batch_sizes)

    def step_options(self) -> dict:
        """The step section with its nulls resolved: ``enabled``, ``layers``, ``batch_sizes`` and ``budgets``
        (the configured ones for null), ``distribution`` and ``depth`` (the first configured for null),
        ``heads``, ``prefix_lengths``, ``impls``, ``flex_kernel_options`` (FlexAttention's kernel_options or
        None), ``sglang_triton_source`` (where sglang-triton finds SGLang's files; None: the installed
        sglang), the timing dicts ``timing`` (accept and peaks: the top-level section) and
        ``attention_timing``, and ``round_options``' ``model``, ``draft``, ``allreduce`` and ``round``."""
        step, attention = self.step, self.step.attention
        flex_options = attention.flexattention_kernel_options
        return {
            "enabled": bool(step.enabled),
            "layers": int(step.layers),
            "batch_sizes": self.step_batch_sizes,
            "budgets": list(step.budgets if step.budgets is not None else self.budgets),
            "distribution": step.distribution or self.distributions[0],
            "depth": int(step.depth if step.depth is not None else self.depths[0]),
            "heads": list(attention.heads),
            "prefix_lengths": list(attention.prefix_lengths),
            "impls": list(attention.impls),
            "flex_kernel_options": None if flex_options is None else dict(flex_options),
            "sglang_triton_source": attention.sglang_triton_source,
            "timing": self.timing.options(),
            "attention_timing": attention.timing.options(),
            **self.round_options(),
        }

    def round_options(self) -> dict:
        """The rest of the round's stages (step.model, step.draft, step.allreduce, step.round), resolved:
        dicts with ``enabled`` (and the step's switch) and their settings; ``model["shape"]`` and
        ``draft["shape"]`` the ``k26.shapes`` objects; the round's builders those configured."""
        step = self.step
        model, draft, round_ = step.model, step.draft, step.round
        return {
            "model": {
                "enabled": bool(step.enabled and model.enabled),
                "moe_impls": list(model.moe_impls),
                "forward_impl": model.forward_impl,
                "routing": model.routing,
                "skew": float(model.skew),
                "sglang_files": model.sglang_files,
                "shape": model.shape,
            },
            "draft": {
                "enabled": bool(step.enabled and draft.enabled),
                "block_size": int(draft.block_size),
                "follow_budget": bool(draft.follow_budget),
                "shape": draft.shape,
            },
            "allreduce": {"enabled": bool(step.enabled and step.allreduce.enabled)},
            "round": {
                "enabled": bool(step.enabled and round_.enabled),
                "builders": [b for b in round_.builders if b in self.builders],
                "batch_sizes": list(
                    round_.batch_sizes if round_.batch_sizes is not None else self.step_batch_sizes
                ),
                "stacks": list(round_.stacks),
                "max_round_seconds": float(round_.max_round_seconds),
                "chain_blocks": [int(b) for b in round_.chain_blocks],
                "warmup": int(round_.warmup),
                "repeats": int(round_.repeats),
                "repeat_budgets": [int(b) for b in round_.repeat_budgets],
                "repeat_runs": int(round_.repeat_runs),
                "expert_sets": None if round_.expert_sets is None else int(round_.expert_sets),
                "comm": {
                    "world_size": int(model.shape.tp),
                    "bus_bandwidth_gbps": float(self.throughput.allreduce.bus_bandwidth_gbps),
                    "latency_us": float(self.throughput.allreduce.latency_us),
                },
            },
        }

    # ------------------------------------------------------------------------------------------ the report
    def throughput_options(self) -> dict:
        """The throughput section as the report takes it
        (``throughput.RoundAssumptions.from_options``' input):
        ``draft_ms`` and ``forward_ms`` (None: not entered), ``what_if`` and ``allreduce`` (dicts of the
        schema's keys; the allreduce's ``world_size`` is step.model.shape.tp), ``prefix_length`` (None: the
        largest measured) and ``topk`` (the traces' K)."""
        section = self.throughput
        what_if = {f.name: getattr(section.what_if, f.name) for f in fields(WhatIfSettings)}
        return {
            "draft_ms": None if section.draft_ms is None else float(section.draft_ms),
            "forward_ms": None if section.forward_ms is None else float(section.forward_ms),
            "what_if": {key: (None if what_if[key] is None else float(what_if[key])) for key in what_if},
            "allreduce": {
                "world_size": int(self.step.model.shape.tp),
                "bus_bandwidth_gbps": float(section.allreduce.bus_bandwidth_gbps),
                "latency_us": float(section.allreduce.latency_us),
            },
            "prefix_length": None if section.prefix_length is None else int(section.prefix_length),
            "topk": self.trace_columns,
        }

    def recorded(self) -> dict:
        """The settings a run's ``environment.json`` records (its ``config``), grouped as ``RECORDED`` plus
        ``step`` (``RECORDED_STEP``): what the results depend on, and what the report reads back (the grid,
        the step's layers, depth and distribution). ``merge_recorded`` joins the groups again."""
        config = self.as_config()
        groups = {name: {key: config[key] for key in keys} for name, keys in RECORDED.items()}
        groups["step"] = {"step": {key: config["step"][key] for key in RECORDED_STEP}}
        return groups

    def drafter_params(self, distribution: str) -> dict | None:
        """The configured drafter parameters a trace of ``distribution`` is generated with: the ``drafter``
        mapping for the drafter distributions it configures, None for the others (an acceptance profile's
        own drafter takes the catalog's parameters)."""
        return self.drafter.as_dict() if distribution in ("drafter", "drafter-bf16") else None

    def builder_options(self, builder: str) -> dict:
        """The configured keyword options of ``builders.get_builder(builder)`` (SGLang's lookup), besides
        the libraries a workflow builds."""
        from ddtree_bench import catalog  # noqa: PLC0415

        if builder != catalog.SGLANG:
            return {}
        options = {"module_paths": list(self.sglang.module_paths)}
        if self.sglang.source is not None:
            options["source"] = str(self.sglang.source)
        return options


def merge_recorded(groups) -> dict:
    """``Settings.recorded``' groups as one configuration mapping (keys in the schema's order)."""
    merged = {}
    for group in groups.values() if isinstance(groups, dict) else groups:
        merged.update(group)
    return merged


def load_settings(*paths: str | Path) -> Settings:
    """The settings of exactly these YAML config files (``config.read_config_file``), each later one merged
    over the earlier ones key by key as Snakemake merges its ``--configfile`` files, then
    ``Settings.from_config``. (A command a person runs takes ``layered_settings``: config/config.yaml under
    its files.)"""
    return Settings.from_config(layered_config(paths, base=None))


def layered_settings(configfiles=(), overrides: dict | None = None) -> Settings:
    """The settings of the one layering rule every command follows, the workflow's (docs/configuration.md):
    config/config.yaml, then each of ``configfiles`` in order, then ``overrides`` (--config), checked once."""
    return Settings.from_config(layered_config(configfiles, overrides))
