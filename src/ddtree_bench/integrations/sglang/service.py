"""From a live SGLang DDTree service to this benchmark: record its tree-build inputs as a trace, and turn its
per-stage profile log into a ``throughput`` config fragment.

**record.** SGLang's DDTree worker (``python/sglang/srt/speculative/dflash_ddtree_worker.py``) imports
``build_ddtree_tree_from_topk`` *by name* from ``sglang.srt.speculative.dflash_ddtree_utils`` (or
``ddtree_utils``) and calls it once per request with ``top_log_probs`` [L, K] (float32, rows sorted
descending) and ``top_token_ids`` [L, K] (int64) and the budget. Its module therefore holds its own reference
to the function: ``record`` replaces that name *in the module you give it* (the worker's module, not the utils
module, whose name the worker no longer reads) with a wrapper that copies each call's inputs to the host and
then calls the original with the same arguments, returning its result unchanged. ``close()`` puts the
original back and writes a trace file (``traces.save_trace``: ``top_log_probs`` [R, L, K], ``top_token_ids``
[R, L, K], one row per call) that the ``recorded_trace`` configuration key takes as it is.

Shape rule: a trace has one L and one K. The first call fixes L, K and the budget; a later call with another
L or K (e.g. the worker's ``DDTREE_FORCE_STAR`` calls with one row) or another budget is *skipped*, never
padded or trimmed. A call whose values a trace cannot hold (a non-finite or positive log-prob, rows not sorted
descending, a negative id) is skipped too. Once ``max_rounds`` rows or ``max_bytes`` of arrays are kept, later
calls are skipped ("cap"), and the file is written at that moment (so a service stopped without ``close``
still leaves it), and again at ``close``. Every call is counted: ``kept + sum(skipped.values()) == calls``;
``summary()`` says it, and the file's metadata holds the same counts.

**profile.** With ``DFLASH_PROFILE_VERIFY=1``, the worker's base class (``DFlashWorkerV2._profile_finish`` in
``python/sglang/srt/speculative/dflash_worker_v2.py``) sums the per-stage times of ``_ddtree_decode_round``
and, every ``DFLASH_PROFILE_VERIFY_EVERY`` (default 32) rounds on TP rank 0, logs one line, through the
logging prefix of the process::

    DDTREE profile avg over 32 verify steps, last_commit_lens=[3]: draft_forward=1.234ms, draft_kv_append=...

(``"%s: %s"`` of that prefix and ``key=value.3fms`` parts joined by ``", "``, keys sorted; the keys are the
marks ``draft_prepare``, ``draft_forward``, ``draft_topk``, ``tree_build_cpu``, ``tree_tensors``,
``verify_prepare``, ``target_verify``, ``tree_accept``, ``mamba_update``, ``draft_kv_append`` and ``total``).
Each value is already the mean over the window's rounds; ``parse_profile_log`` returns, per stage, the
median over the windows of those means. ``budget_fragment`` maps them onto the throughput model's keys.
"""

from __future__ import annotations

import functools
import importlib
import numbers
import os
import re
import statistics
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ddtree_bench.integrations.sglang.source import FUNCTION_NAME
from ddtree_bench.io import check_writable
from ddtree_bench.traces import save_trace
from ddtree_bench.validation import check_topk_arrays

WORKER_MODULE = "sglang.srt.speculative.dflash_ddtree_worker"
DEFAULT_MAX_BYTES = 256 << 20
SKIP_REASONS = ("shape", "budget", "invalid", "cap")
_MARK = "__ddtree_bench_recording__"


# ----------------------------------------------------------------------------------------------- record


def _host_array(value, dtype) -> np.ndarray:
    """A host copy of a torch tensor (any device; converted as SGLang's function converts it), a numpy
    array, or anything with ``.numpy()``."""
    if isinstance(value, np.ndarray):
        array = value
    elif type(value).__module__.split(".")[0] == "torch":
        import torch  # noqa: PLC0415 (only where the service hands us torch tensors)

        torch_dtype = torch.float32 if dtype == np.float32 else torch.int64
        array = value.detach().to(device="cpu", dtype=torch_dtype).numpy()
    elif hasattr(value, "numpy"):
        array = np.asarray(value.numpy())
    else:
        array = np.asarray(value)
    return np.array(array, dtype=dtype, copy=True)


def _shape(value) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    try:
        return tuple(int(n) for n in shape)
    except TypeError:
        return None


@dataclass
class Recording:
    """A live recording (``record``'s handle): counts, the kept rows, and ``close()`` / a context manager."""

    module: types.ModuleType
    path: Path
    max_rounds: int | None
    max_bytes: int | None
    original: object
    calls: int = 0
    kept: int = 0
    skipped: dict = field(default_factory=lambda: dict.fromkeys(SKIP_REASONS, 0))
    depth: int | None = None
    topk: int | None = None
    budget: int | None = None
    closed: bool = False
    written: bool = False
    _rows: list = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def capacity(self) -> int | None:
        """Rows the caps allow (known from the first call's L and K)."""
        if self.depth is None:
            return None
        row_bytes = self.depth * self.topk * (4 + 8)
        by_bytes = None if self.max_bytes is None else self.max_bytes // row_bytes
        return min(n for n in (self.max_rounds, by_bytes) if n is not None)

    def _observe(self, top_log_probs, top_token_ids, budget) -> None:
        """Count one call and keep its rows where the rules allow (never raises into the service)."""
        lp_shape, ids_shape = _shape(top_log_probs), _shape(top_token_ids)
        with self._lock:
            if self.closed:
                return
            self.calls += 1
            if (
                lp_shape is None
                or len(lp_shape) != 2
                or lp_shape != ids_shape
                or isinstance(budget, bool)
                or not isinstance(budget, numbers.Integral)
            ):
                self.skipped["invalid"] += 1
                return
            if self.depth is None:
                self.depth, self.topk, self.budget = lp_shape[0], lp_shape[1], int(budget)
            if lp_shape != (self.depth, self.topk):
                self.skipped["shape"] += 1
                return
            if int(budget) != self.budget:
                self.skipped["budget"] += 1
                return
            if self.kept >= self.capacity:
                self.skipped["cap"] += 1
                return
            try:
                lp = _host_array(top_log_probs, np.float32)[None]
                ids = _host_array(top_token_ids, np.int64)[None]
                check_topk_arrays(lp, ids, where="call")
            except Exception:  # noqa: BLE001 (counted: the service's call goes on regardless)
                self.skipped["invalid"] += 1
                return
            self._rows.append((lp, ids))
            self.kept += 1
            if self.kept == self.capacity:
                try:
                    self._write()
                except ValueError:
                    pass  # close() writes again and raises there

    def metadata(self) -> dict:
        """What the file records besides the arrays."""
        return {
            "distribution": "recorded",
            "source": f"sglang:{self.module.__name__}.{FUNCTION_NAME}",
            "recorder": __name__,
            "budget": self.budget,
            "calls": self.calls,
            "kept": self.kept,
            **{f"skipped_{reason}": count for reason, count in self.skipped.items()},
            "max_rounds": self.max_rounds,
            "max_bytes": self.max_bytes,
            "summary": self.summary(),
        }

    def summary(self) -> str:
        """One line: calls seen, rows kept, and every skipped call by reason."""
        shape = "" if self.depth is None else f" of L = {self.depth}, K = {self.topk}, budget {self.budget}"
        skipped = sum(self.skipped.values())
        reasons = ", ".join(f"{count} {reason}" for reason, count in self.skipped.items() if count)
        caps = ", ".join(
            f"{name} {value}"
            for name, value in (("max_rounds", self.max_rounds), ("max_bytes", self.max_bytes))
            if value is not None
        )
        return (
            f"{self.calls} calls to {self.module.__name__}.{FUNCTION_NAME}: kept {self.kept}{shape}, skipped "
            f"{skipped}{f' ({reasons})' if reasons else ''}; caps: {caps}"
        )

    def _write(self) -> None:
        if not self._rows:
            raise ValueError(f"record: nothing written to {self.path}: {self.summary()}")
        lp = np.concatenate([row[0] for row in self._rows])
        ids = np.concatenate([row[1] for row in self._rows])
        try:
            save_trace(self.path, lp, ids, **self.metadata())
        except (OSError, ValueError) as error:
            raise ValueError(f"record: cannot write {self.path}: {' '.join(str(error).split())}") from None
        self.written = True

    def close(self) -> Path:
        """Put the original function back in the module and write the trace (again, with the final counts,
        where the cap already wrote it); returns the path. ``ValueError`` where no call was kept (no file is
        written: the summary says why) or the file cannot be written. A second ``close`` does nothing."""
        with self._lock:
            if self.closed:
                return self.path
            self.closed = True
            if getattr(getattr(self.module, FUNCTION_NAME, None), _MARK, None) is self:
                setattr(self.module, FUNCTION_NAME, self.original)
            self._write()
        return self.path

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _resolve_module(module_or_name) -> types.ModuleType:
    if isinstance(module_or_name, types.ModuleType):
        return module_or_name
    if isinstance(module_or_name, str) and module_or_name:
        try:
            return importlib.import_module(module_or_name)
        except Exception as error:  # ImportError, or the module failing while it is imported
            message = " ".join(str(error).split()) or type(error).__name__
            raise ValueError(f"cannot import module {module_or_name!r}: {message}") from None
    raise ValueError(f"record needs a module or a dotted module name, got {module_or_name!r}")


def _cap(value, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
    return int(value)


def record(
    module_or_name, path, *, max_rounds: int | None = None, max_bytes: int | None = DEFAULT_MAX_BYTES
) -> Recording:
    """Wrap ``build_ddtree_tree_from_topk`` in ``module_or_name`` (the module object or its dotted name:
    SGLang's worker module, ``WORKER_MODULE``, which imported the function by name) so that every call also
    records its top-K rows, bounded by ``max_rounds`` rows and/or ``max_bytes`` of arrays (12 bytes per
    value; at least one cap). Returns the ``Recording``; ``close()`` (or leaving its ``with`` block) restores
    the function and writes the trace ``path`` (see the module docstring for the rules).

    ``ValueError`` (one line): a module that cannot be imported or has no callable
    ``build_ddtree_tree_from_topk``, a function already wrapped by a recording, a ``path`` that cannot be
    written, a bad cap."""
    max_rounds, max_bytes = _cap(max_rounds, "max_rounds"), _cap(max_bytes, "max_bytes")
    if max_rounds is None and max_bytes is None:
        raise ValueError("record needs a cap: max_rounds and/or max_bytes")
    module = _resolve_module(module_or_name)
    original = getattr(module, FUNCTION_NAME, None)
    if not callable(original):
        raise ValueError(f"module {module.__name__!r} has no function {FUNCTION_NAME}")
    active = getattr(original, _MARK, None)
    if active is not None:
        raise ValueError(
            f"{module.__name__}.{FUNCTION_NAME} is already wrapped by a recording to {active.path}; "
            "close it first"
        )
    path = check_writable(path, "record: path")
    recording = Recording(module, path, max_rounds, max_bytes, original)

    @functools.wraps(original)  # keeps __name__, __doc__ and the signature (``workspace=`` is looked up)
    def wrapper(top_log_probs, top_token_ids, budget, *args, **kwargs):
        recording._observe(top_log_probs, top_token_ids, budget)
        return original(top_log_probs, top_token_ids, budget, *args, **kwargs)

    setattr(wrapper, _MARK, recording)
    setattr(module, FUNCTION_NAME, wrapper)
    return recording


# ----------------------------------------------------------------------------------------------- profile

#: One profile line of ``DFlashWorkerV2._profile_finish`` (anywhere in a log line: the logging prefix first).
PROFILE_LINE = re.compile(
    r"\b(?P<label>\w+) profile avg over (?P<every>\d+) verify steps"
    r"(?:, last_commit_lens=\[(?P<commits>[^\]]*)\])?: (?P<parts>.*?)\s*$"
)
_PART = re.compile(r"(?P<key>[A-Za-z_]\w*)=(?P<value>-?\d+(?:\.\d+)?)ms")

#: The throughput model's terms from the profile's stages.
DRAFT_STAGES = ("draft_prepare", "draft_forward", "draft_topk")
FORWARD_STAGES = ("target_verify",)
#: Stages the model takes from its own measurements (the builder's tree build, the GPU tree accept).
MODELLED_ELSEWHERE = {"tree_build_cpu": "build", "tree_accept": "accept"}


@dataclass(frozen=True)
class Profile:
    """Parsed profile lines of one label: per stage, the median over the windows of their mean ms."""

    label: str
    windows: int
    rounds: int
    medians: dict
    values: dict = field(repr=False)
    commit_lens: tuple = field(repr=False, default=())
    source: str = ""


def _read_log(text_or_path) -> tuple[str, str]:
    """(text, where): a ``Path`` (or any path-like) is read; a ``str`` holding a newline or a profile line is
    the log's text, any other ``str`` a path."""
    if isinstance(text_or_path, str) and ("\n" in text_or_path or " profile avg over " in text_or_path):
        return text_or_path, "log text"
    if not isinstance(text_or_path, str | os.PathLike):
        raise ValueError(f"a profile log must be a path or the log's text, got {type(text_or_path).__name__}")
    path = Path(text_or_path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found" if not path.exists() else f"{path}: not a file")
    try:
        return path.read_text(errors="replace"), str(path)
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error.strerror})") from None


def parse_profile_log(text_or_path, *, label: str = "DDTREE") -> Profile:
    """The ``label`` profile lines of a log (SGLang's ``DFlashWorkerV2._profile_finish`` format: see the
    module docstring): per stage, the median over the lines (windows) of each window's mean ms. Lines of
    other labels are ignored. ``ValueError``: no such line, or a line whose parts are not ``key=<ms>ms``."""
    text, where = _read_log(text_or_path)
    values: dict[str, list[float]] = {}
    commits: list[tuple[int, ...]] = []
    windows = rounds = 0
    for number, line in enumerate(text.splitlines(), 1):
        match = PROFILE_LINE.search(line)
        if match is None or match["label"] != label:
            continue
        parts = match["parts"].split(", ")
        parsed = [_PART.fullmatch(part) for part in parts]
        if not parts or any(p is None for p in parsed):
            bad = next(part for part, p in zip(parts, parsed, strict=True) if p is None)
            raise ValueError(f"{where}: line {number}: a {label} profile part is not key=<ms>ms: {bad!r}")
        for p in parsed:
            values.setdefault(p["key"], []).append(float(p["value"]))
        if match["commits"] is not None:
            commits.append(tuple(int(n) for n in re.findall(r"-?\d+", match["commits"])))
        windows += 1
        rounds += int(match["every"])
    if windows == 0:
        raise ValueError(
            f"{where}: no {label} profile lines ('{label} profile avg over N verify steps...: stage=X.XXXms, "
            "...'); start the service with DFLASH_PROFILE_VERIFY=1"
        )
    medians = {key: statistics.median(vals) for key, vals in sorted(values.items())}
    return Profile(label, windows, rounds, medians, values, tuple(commits), where)


def _stage_sum(profile: Profile, stages) -> float:
    missing = [stage for stage in stages if stage not in profile.medians]
    if missing:
        raise ValueError(f"{profile.source}: the {profile.label} profile has no {', '.join(missing)} stage")
    return round(sum(profile.medians[stage] for stage in stages), 3)


def budget_fragment(profile: Profile) -> dict:
    """The ``throughput`` config fragment of a parsed profile: ``draft_ms`` = the medians of draft_prepare +
    draft_forward + draft_topk (the drafter's block, forward, LM head and top-K with its all-gathers),
    ``forward_ms`` = target_verify's (the target's tree-verify forward, its tensor-parallel all-reduces
    included). Both are "entered" terms for the model, at the service's own budget and batch size; rounded
    to the log's 0.001 ms."""
    return {
        "throughput": {
            "draft_ms": _stage_sum(profile, DRAFT_STAGES),
            "forward_ms": _stage_sum(profile, FORWARD_STAGES),
        }
    }


def fragment_yaml(profile: Profile) -> str:
    """``budget_fragment`` as YAML, with every stage's median as comments (what is used, what is not)."""
    import yaml  # noqa: PLC0415

    used = {stage: "draft_ms" for stage in DRAFT_STAGES} | {stage: "forward_ms" for stage in FORWARD_STAGES}
    lines = [
        "# throughput terms measured by SGLang's DDTree worker (DFLASH_PROFILE_VERIFY=1)",
        f"# from {profile.source}",
        f"# {profile.windows} windows, {profile.rounds} rounds; per stage the median over windows of the "
        "window's mean ms",
        "# use with: ddtree-bench budget RESULTS --configfile THIS_FILE (or snakemake --configfile)",
        "# the values hold at the service's own budget and batch size",
    ]
    for stage, value in profile.medians.items():
        role = used.get(stage) or (
            f"the model's own {MODELLED_ELSEWHERE[stage]} term" if stage in MODELLED_ELSEWHERE else None
        )
        role = role or ("the whole round" if stage == "total" else "not in the model")
        lines.append(f"#   {stage:<16} {value:>10.3f} ms  {role}")
    samples = [n for window in profile.commit_lens for n in window]
    if samples:
        mean = sum(samples) / len(samples)
        lines.append(
            f"# last_commit_lens: {len(samples)} samples (one round per window), mean {mean:.2f} tokens"
        )
    return "\n".join(lines) + "\n" + yaml.safe_dump(budget_fragment(profile), sort_keys=False)


__all__ = [
    "DEFAULT_MAX_BYTES",
    "WORKER_MODULE",
    "Profile",
    "Recording",
    "budget_fragment",
    "fragment_yaml",
    "parse_profile_log",
    "record",
]
