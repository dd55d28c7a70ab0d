"""Each job's peak memory, estimated from its sizes when the settings load, against what this machine has.

A size no machine holds (a batch of 10^8 requests, a vocabulary of 10^11) would otherwise pass every check
and end a run in a ``MemoryError`` mid-way. ``check_memory(settings)`` refuses, before any job, a
configuration whose largest job needs more host memory than this machine's physical memory (or, where a GPU
runs the step stages, more GPU memory than the GPU has): one line naming the job, what it needs and what
the machine has.

The estimates are simple lower bounds of what a job certainly allocates, so only what clearly cannot fit is
refused (a job near the limit may still fail; one refused here cannot run):

- a trace of R requests, L positions and K columns: its arrays, R x L x K x (4 + 8) bytes (float32
  log-probs, int64 token ids); where its distribution draws full-vocabulary logits (uniform, peaked, bf16),
  one request's L x V float32 logits besides;
- a tree build's check or timing job: the trace it loads, and its batch's trees' visibility, a bool
  B x (N + 1)^2; a tree-shape job: the trace and the trees of every request, R x (N + 1)^2;
- verify attention on the GPU: the latent KV cache B x (S + N + 1) x 576 x 2 bytes (bf16), the queries and
  the output B x (N + 1) x H x (576 + 512) x 2, the mask B x (N + 1)^2; tree accept: the mask.

The rest of the round (the model, the drafter, whole rounds) checks its own fit on the GPU when it runs (a
shape that does not fit gets rows saying so)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ddtree_bench.consistency import extra_shape_points
from ddtree_bench.traces import DRAFTER_DISTRIBUTIONS

#: Bytes per trace cell: a float32 log-prob and an int64 token id.
TRACE_CELL_BYTES = 4 + 8
#: One latent KV row of Kimi K2.6's absorbed MLA (kv_lora_rank 512 + rope 64), and a value row (512).
LATENT_DIM, VALUE_DIM = 576, 512
BF16_BYTES = 2


@dataclass(frozen=True)
class Need:
    """One job's estimated peak: what it is (``what``), where (``host`` or ``gpu``), how many bytes, the
    sizes the estimate came from (``why``) and the settings that make them (``fields``)."""

    what: str
    where: str
    bytes: int
    why: str
    fields: str


def size(nbytes: float) -> str:
    """Bytes as a person reads them (binary units)."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


# ----------------------------------------------------------------------------------------- estimates


def trace_need(requests: int, depth: int, topk: int, vocab_size: int, distribution: str) -> Need:
    """A trace's generation (see the module docstring)."""
    nbytes = requests * depth * topk * TRACE_CELL_BYTES
    why = f"{requests} requests x {depth} positions x {topk} columns x {TRACE_CELL_BYTES} B"
    fields = "batch_sizes, depths, topk"
    if distribution not in DRAFTER_DISTRIBUTIONS and distribution != "recorded":
        nbytes += depth * vocab_size * 4
        why += f", plus one request's logits: {depth} positions x vocab_size {vocab_size} x 4 B"
        fields += ", vocab_size"
    return Need(f"the trace {distribution}-L{depth}", "host", nbytes, why, fields)


def trees_bytes(batch: int, budget: int) -> int:
    """The visibility masks of ``batch`` trees of ``budget`` nodes (bool, (N + 1) x (N + 1) each)."""
    return batch * (budget + 1) ** 2


def attention_need(batch: int, budget: int, prefix: int, heads: int) -> Need:
    """Verify attention's inputs and output on the GPU (see the module docstring)."""
    rows = budget + 1
    cache = batch * (prefix + rows) * LATENT_DIM * BF16_BYTES
    queries = batch * rows * heads * (LATENT_DIM + VALUE_DIM) * BF16_BYTES
    return Need(
        "a verify-attention job",
        "gpu",
        cache + queries + trees_bytes(batch, budget),
        f"batch {batch}, budget {budget}, prefix {prefix}, {heads} heads: its KV cache {batch} x "
        f"({prefix} + {budget} + 1) x {LATENT_DIM} x 2 B, queries and output, mask",
        "step.batch_sizes, step.budgets, step.attention.prefix_lengths, step.attention.heads",
    )


def host_needs(settings) -> list[Need]:
    """The host-memory needs of a configuration's largest jobs: each trace, the largest tree build, the
    largest tree-shape job."""
    config = settings.as_config()
    requests, topk, vocab = settings.trace_requests, settings.trace_columns, settings.vocab_size
    points = {
        (d, int(depth), int(n)) for d in settings.distributions for depth, n in settings.depth_budget_pairs
    }
    points |= {(str(d), int(depth), int(n)) for d, depth, n in extra_shape_points(config)}
    needs = []
    for distribution, depth in sorted({(d, depth) for d, depth, _ in points}):
        needs.append(trace_need(requests, depth, topk, vocab, distribution))
    deepest = max(depth for _, depth, _ in points)
    loaded = requests * deepest * topk * TRACE_CELL_BYTES
    budget = max(n for *_, n in points)
    batch = max(settings.batch_sizes)
    needs.append(
        Need(
            "a tree build (check or timing job)",
            "host",
            loaded + trees_bytes(batch, budget),
            f"its trace, {requests} x {deepest} x {topk} x {TRACE_CELL_BYTES} B, and batch {batch}'s trees "
            f"of budget {budget}: {batch} x ({budget} + 1)^2 B",
            "batch_sizes, budgets, depths, topk",
        )
    )
    needs.append(
        Need(
            "a tree-shape job",
            "host",
            loaded + trees_bytes(requests, budget),
            f"its trace and the trees of all {requests} requests at budget {budget}: {requests} x ({budget} "
            "+ 1)^2 B",
            "batch_sizes, budgets, depths, topk",
        )
    )
    return needs


def gpu_needs(settings) -> list[Need]:
    """The GPU-memory needs of the step stages' largest verify-attention and accept jobs (none where the
    step stages are off)."""
    step = settings.step_options()
    if not step["enabled"]:
        return []
    batch, budget = max(step["batch_sizes"]), max(step["budgets"])
    prefix, heads = max(step["prefix_lengths"]), max(step["heads"])
    return [attention_need(batch, budget, prefix, heads)]


# ----------------------------------------------------------------------------------------- the machine


def host_memory_bytes() -> int | None:
    """This machine's physical memory (None where the system does not say)."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * page if pages > 0 and page > 0 else None


def check_needs(needs, host: int | None, gpu: int | None, prefix: str = "config:") -> None:
    """Raise ``ValueError`` (one line starting with ``prefix``) for the need that most exceeds its memory:
    ``host`` bytes for the host's needs, ``gpu`` for the GPU's (None: not checked)."""
    have = {"host": host, "gpu": gpu}
    over = [need for need in needs if have[need.where] is not None and need.bytes > have[need.where]]
    if not over:
        return
    need = max(over, key=lambda n: n.bytes / have[n.where])
    memory = "host memory" if need.where == "host" else "GPU memory"
    machine = "this machine's physical memory" if need.where == "host" else "this GPU's memory"
    raise ValueError(
        f"{prefix} {need.fields}: {need.what} needs at least {size(need.bytes)} of {memory} ({need.why}), "
        f"more than {machine}, {size(have[need.where])}"
    )


def check_memory(settings, gpu: int | None = None, host: int | None = None) -> None:
    """A configuration this machine cannot hold is refused when its settings load (``ValueError``, one line):
    its largest jobs' host memory against ``host`` (default: this machine's physical memory), and where a GPU
    runs the step stages (``gpu``: its bytes; None: no GPU job runs here) their GPU memory against it."""
    host = host_memory_bytes() if host is None else host
    needs = host_needs(settings) + (gpu_needs(settings) if gpu is not None else [])
    check_needs(needs, host, gpu)
