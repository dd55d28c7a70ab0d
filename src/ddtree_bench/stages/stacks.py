"""The round job's stack rounds (``k26.stack``: SGLang's DDTree round as its fork's worker runs it, ours, the
one-kernel swaps) and linear chain rounds (``k26.chain``: upstream SGLang's DFlash), timed on the job's
weights (``stages.round``).

Per tree budget, every configured stack is prepared on the same weights, drafter output and trees, then the
stacks take turns round by round (``warmup`` untimed rounds, then ``repeats`` timed ones), so drift hits
them alike. Each turn times the whole round (``timing = "wall"``: host-inclusive, ``time.perf_counter_ns``,
one synchronisation at the end) and then the same round part by part (``"part-<name>"``, each waited for,
and their ``"sum-of-parts"``). A chain block's rounds are timed the same way, plus ``"model-one-graph"``:
its whole round replayed as one CUDA graph, the overlap model (``k26.chain``).

Every stack and chain row also gets the terms a one-GPU round cannot run, the same for every stack of a
budget: ``"estimate-allreduce"`` (the forward's 2 x 61 all-reduces of T x 7168 bf16 under tensor parallel)
and ``"estimate-gather"`` (the drafter's top-K all-gathers), from ``k26.estimates`` with the configured bus
bandwidth and latency; their note says they are estimates. ``launches`` is the stack's verify attention's
launches per layer (kernels, copies, fills: the profiler's count); ``correct`` whether the last round's
accepted paths equal the CPU walk.

SGLang's own round also times its build three more ways in the same turns (``build_probes``: the collector
off, the in-situ path after the draft and back to back), to show where the build part's time goes.

``repeat_budgets`` are run again, ``repeat_runs - 1`` more times, each in a fresh round (buffers, graphs and
captures made anew on the same weights); their timings carry ``run<k>:`` (``run2:wall``, ...).
"""

from __future__ import annotations

import sys
import time

from ddtree_bench import catalog
from ddtree_bench.k26 import estimates
from ddtree_bench.k26.draft import draft_block
from ddtree_bench.stages.gpu_runner import HEADROOM, describe_error
from ddtree_bench.timing.records import unavailable_row

CLOCK = time.perf_counter_ns


def stack_need(job, budget: int) -> float:
    """What a stack round of ``job`` at ``budget`` allocates beside the weights: the round's state, the
    drafter's, SGLang's mask (q x (S + q) bools a request) and FA3's scratch."""
    from ddtree_bench.k26.draft import draft_bytes  # noqa: PLC0415
    from ddtree_bench.k26.target import state_bytes  # noqa: PLC0415

    shape, batch, prefix = job.shape, job.batch, job.prefix
    block = budget + 1 if job.follow_budget else job.block_size
    return (
        state_bytes(shape, batch, budget, prefix, job.drafter_shape.target_layers)
        + draft_bytes(job.drafter_shape, batch, max(block, budget + 1), prefix, shape.vocab_shard)
        + batch * (budget + 1) * (prefix + budget + 1)
        + 4 * batch * (budget + 1) * shape.local_heads * 512 * 4
    )


def chain_need(job, block: int) -> float:
    """What a chain round of ``block`` allocates beside the weights: its state and its drafter's."""
    from ddtree_bench.k26.draft import draft_bytes  # noqa: PLC0415
    from ddtree_bench.k26.target import state_bytes  # noqa: PLC0415

    shape = job.shape
    return state_bytes(
        shape, job.batch, block - 1, job.prefix, job.drafter_shape.target_layers
    ) + draft_bytes(job.drafter_shape, job.batch, block, job.prefix, shape.vocab_shard)


def _fits(torch, job, budget: int, need: float, chain: bool = False) -> str | None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free = float(torch.cuda.mem_get_info()[0])
    needed = chain_need(job, budget + 1) if chain else stack_need(job, budget)
    if needed > free * (1 - HEADROOM):
        return f"does not fit: needs about {(needed + need) / 1e9:.1f} GB, {(free + need) / 1e9:.1f} GB free"
    return None


def estimate_rows(job, budget: int, base, *, chain: bool) -> list[dict]:
    """The two estimated terms (module docstring) of a round at ``budget`` (a chain's: block = budget + 1)."""
    comm = job.stacks["comm"]
    world, busbw, latency = comm["world_size"], comm["bus_bandwidth_gbps"], comm["latency_us"]
    tokens = job.batch * (budget + 1)
    if chain:
        positions, k = budget, 1
    else:
        block, k = draft_block(budget, job.block_size, job.topk, job.follow_budget)
        positions = block - 1
    allreduce = estimates.allreduce_s(tokens, world, busbw, latency, job.shape)
    gather = estimates.topk_allgather_s(job.batch, positions, k, world, busbw, latency)
    what = (
        f"estimate, not measured: tensor parallel {world}, {busbw:g} GB/s bus bandwidth, {latency:g} µs each"
    )
    return [
        {
            **base("estimate-allreduce"),
            "phase": "timed",
            "repetition": 0,
            "seconds": allreduce,
            "status": "ok",
            "note": f"{what}; 2 x 61 all-reduces of {tokens} x 7168 bf16",
        },
        {
            **base("estimate-gather"),
            "phase": "timed",
            "repetition": 0,
            "seconds": gather,
            "status": "ok",
            "note": f"{what}; the drafter's all-gathers of {job.batch} x {positions} rows of top-{k}",
        },
    ]


def _progress(name: str, budget: int, samples: dict, spent: float) -> None:
    walls = sorted(v for phase, _, v in samples.get("wall", []) if phase == "timed")
    what = f"round {walls[len(walls) // 2] * 1e3:.2f} ms" if walls else "no timed round"
    print(f"stack {name} N={budget}: {what} ({spent:.1f} s)", file=sys.stderr, flush=True)


def _turns(torch, entries, warmup: int, repeats: int) -> dict:
    """The entries take turns round by round: ``warmup`` untimed turns, then ``repeats`` timed ones. An
    entry is ``(name, whole, parts, extra)``: ``whole()`` one round (returns when done), ``parts`` the
    round's parts by name, ``extra`` more timings by name (a call's seconds: what it returns where it times
    itself, else its wall). ``{name: {timing: [(phase, rep, seconds)]}}``."""
    samples = {name: {} for name, *_ in entries}
    for turn in range(warmup + repeats):
        phase, rep = ("warmup", turn) if turn < warmup else ("timed", turn - warmup)
        for name, whole, parts, extra in entries:
            mine = samples[name]
            for timing, fn in (("wall", whole), *extra.items()):
                t0 = CLOCK()
                own = fn()
                seconds = own if isinstance(own, float) else (CLOCK() - t0) / 1e9
                mine.setdefault(timing, []).append((phase, rep, seconds))
            total = 0.0
            for part, fn in parts.items():
                t0 = CLOCK()
                fn()
                torch.cuda.current_stream().synchronize()
                seconds = (CLOCK() - t0) / 1e9
                mine.setdefault(f"part-{part}", []).append((phase, rep, seconds))
                total += seconds
            mine.setdefault("sum-of-parts", []).append((phase, rep, total))
    return samples


def build_probes(runner, stack) -> dict:
    """For SGLang's own round (``catalog.SGLANG_ROUND``), its build timed three more ways in the same turns,
    to show where the part's time goes against the tree-build stage's in-situ timing of SGLang's function
    (``stages.insitu``). Each times itself (its float):

    - ``build-gc-off``: the build part as the part runs (after SGLang's draft part, waited for), Python's
      collector off;
    - ``build-in-situ``: the in-situ path on this round's top-K (the whole batch copied to pageable host
      memory, the function and its pad per request, one copy to the device per field, one synchronisation),
      also after the draft part;
    - ``build-in-situ-back-to-back``: the same path right after another call of it, as the tree-build stage
      times its calls (the host already awake, nothing waited for before it).

    No probes for the other stacks."""
    if stack.name != catalog.SGLANG_ROUND or getattr(runner, "sglang_builder", None) is None:
        return {}
    import gc  # noqa: PLC0415

    from ddtree_bench.stages.insitu import torch_measure  # noqa: PLC0415

    torch = runner.torch
    lp = runner.drafter.top_log_probs.float().cpu().numpy()
    ids = runner.drafter.top_token_ids.cpu().numpy()
    measure, _fetch, _bytes = torch_measure(runner.sglang_builder, catalog.SGLANG, lp, ids, runner.budget, [])
    draft = runner.parts_of(stack)["draft"]

    def after_draft(fn) -> float:
        draft()
        torch.cuda.current_stream().synchronize()
        return fn()

    def build() -> float:
        t0 = CLOCK()
        runner.build_sglang(for_our_accept=False)
        return (CLOCK() - t0) / 1e9

    def gc_off() -> float:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return after_draft(build)
        finally:
            if enabled:
                gc.enable()

    def back_to_back() -> float:
        measure()
        return measure()

    return {
        "build-gc-off": gc_off,
        "build-in-situ": lambda: after_draft(measure),
        "build-in-situ-back-to-back": back_to_back,
    }


def run_prefix(run: int) -> str:
    """The timings' prefix of a repeated run (``run2:`` ...); none for the first."""
    return "" if run == 1 else f"run{run}:"


def _rows(base, samples: dict, prefix: str, **fields) -> list[dict]:
    return [
        {
            **base(prefix + timing),
            "phase": phase,
            "repetition": rep,
            "seconds": seconds,
            "status": "ok",
            **fields,
        }
        for timing, values in samples.items()
        for phase, rep, seconds in values
    ]


def _ready(torch, runner, base, budget: int, prefix: str) -> tuple[list, list[dict]]:
    """The stacks that prepared and ran one round within the limit, and rows saying why for the others."""
    from ddtree_bench.k26.stack import TooSlow  # noqa: PLC0415

    ready, out = [], []
    for stack in runner.stacks:
        row = base(stack.name, budget, prefix + "wall")
        try:
            runner.prepare_stack(stack)
            t0 = CLOCK()
            runner.run_stack(stack)
            seconds = (CLOCK() - t0) / 1e9
            if seconds > runner.max_seconds:
                raise TooSlow(f"one round took {seconds:.2f} s, over the limit of {runner.max_seconds:g} s")
            ready.append(stack)
        except TooSlow as exc:
            out.append(unavailable_row(row, f"not timed: {exc}"))
        except Exception as exc:  # noqa: BLE001 (a stack failing: recorded, the others still run)
            torch.cuda.synchronize()
            out.append(unavailable_row(row, describe_error(exc), "failed"))
    return ready, out


def _checked_rows(torch, runner, job, base, budget: int, run: int, samples: dict) -> list[dict]:
    """Each timed stack's rows: its samples with its check, note and launches, and the estimates."""
    prefix = run_prefix(run)
    out = []
    for stack in [s for s in runner.stacks if s.name in samples]:
        mine = lambda t, s=stack.name: base(s, budget, t)  # noqa: E731
        try:
            runner.run_stack(stack)
            fields = {
                "correct": runner.check(stack),
                "launches": runner.launches_per_layer(stack.attention),
                "note": runner.describe(stack),
                "experts_touched": runner.target.experts_touched,
            }
        except Exception as exc:  # noqa: BLE001 (recorded)
            torch.cuda.synchronize()
            out.append(unavailable_row(mine(prefix + "wall"), describe_error(exc), "failed"))
            continue
        out += _rows(mine, samples[stack.name], prefix, **fields)
        if run == 1:
            out += estimate_rows(job, budget, mine, chain=False)
    return out


def tree_rows(weights, job, kernels, base, budget: int, run: int) -> list[dict]:
    """Every configured stack's rounds at ``budget`` (run ``run``: 1, or a repeat), or rows saying why."""
    import torch  # noqa: PLC0415

    from ddtree_bench.k26.stack import StackRound  # noqa: PLC0415
    from ddtree_bench.k26.target import weights_bytes  # noqa: PLC0415

    names, stacks = list(job.stacks["stacks"]), job.stacks
    prefix = run_prefix(run)
    reason = _fits(torch, job, budget, weights_bytes(weights.shape, weights.moe_impl))
    if reason is not None:
        return [unavailable_row(base(n, budget, prefix + "wall"), reason) for n in names]
    try:
        runner = StackRound(
            weights,
            job.drafter_shape,
            job.options(budget),
            stacks=names,
            sglang=sglang_paths(job),
            max_seconds=stacks["max_seconds"],
            **kernels,
        )
        runner.capture()
    except Exception as exc:  # noqa: BLE001 (every stack of this budget: recorded)
        torch.cuda.synchronize()
        reason = describe_error(exc)
        return [unavailable_row(base(n, budget, prefix + "wall"), reason, "failed") for n in names]
    ready, out = _ready(torch, runner, base, budget, prefix)
    entries = [
        (s.name, lambda s=s, r=runner: r.run_stack(s), runner.parts_of(s), build_probes(runner, s))
        for s in ready
    ]
    t0 = time.perf_counter()
    samples = _turns(torch, entries, stacks["warmup"], stacks["repeats"])
    for name in samples:
        _progress(name, budget, samples[name], (time.perf_counter() - t0) / max(1, len(samples)))
    out += _checked_rows(torch, runner, job, base, budget, run, samples)
    del runner
    return out


def chain_rows(weights, job, base, block: int, run: int) -> list[dict]:
    """The chain's rounds at ``block`` (run ``run``), or a row saying why."""
    import torch  # noqa: PLC0415

    from ddtree_bench.k26.chain import ChainRound  # noqa: PLC0415
    from ddtree_bench.k26.target import weights_bytes  # noqa: PLC0415

    budget = block - 1
    prefix = run_prefix(run)
    mine = lambda t: base(catalog.CHAIN, budget, t)  # noqa: E731
    reason = _fits(torch, job, budget, weights_bytes(weights.shape, weights.moe_impl), chain=True)
    if reason is not None:
        return [unavailable_row(mine(prefix + "wall"), reason)]
    try:
        runner = ChainRound(
            weights,
            job.drafter_shape,
            batch=job.batch,
            block=block,
            prefix=job.prefix,
            sglang_files=job.sglang_files,
            seed=job.seed,
        )
        runner.capture()
        extra = {} if runner.graphs["round"] is None else {"model-one-graph": runner.run_graph}
        t0 = time.perf_counter()
        samples = _turns(
            torch,
            [(catalog.CHAIN, runner.run_round, runner.parts(), extra)],
            job.stacks["warmup"],
            job.stacks["repeats"],
        )[catalog.CHAIN]
        _progress(f"{catalog.CHAIN}-{block}", budget, samples, time.perf_counter() - t0)
        runner.run_round()
        fields = {
            "correct": runner.check(),
            "launches": runner.launches_per_layer(),
            "experts_touched": runner.target.experts_touched,
            "note": f"block {block}: draft graph, eager candidates and accept, {runner.note}; "
            "model-one-graph: the same round as one CUDA graph (the overlap model)",
        }
    except Exception as exc:  # noqa: BLE001 (recorded)
        torch.cuda.synchronize()
        return [unavailable_row(mine(prefix + "wall"), describe_error(exc), "failed")]
    del runner
    out = _rows(mine, samples, prefix, **fields)
    if run == 1:
        out += estimate_rows(job, budget, mine, chain=True)
    return out


def sglang_paths(job) -> dict:
    """Where SGLang's code is, as ``k26.stack.StackRound`` takes it."""
    builder = job.builder_options.get(catalog.SGLANG, {})
    return {
        "builder": dict(builder),
        "accept": builder.get("source"),
        "attention_files": job.stacks.get("attention_files"),
        "files": job.sglang_files,
    }


def run_stack_rounds(weights, job, kernels, base) -> dict[int, list[dict]]:
    """Every tree budget's stacks, every chain block, then the repeated runs (module docstring): rows by
    budget. ``base(name, budget, timing)``: a row's configuration."""
    rows: dict[int, list[dict]] = {int(b): [] for b in job.budgets}
    stacks = job.stacks
    names = list(stacks["stacks"])
    for run in range(1, max(1, stacks["repeat_runs"]) + 1):
        for budget in job.tree_budgets:
            if names and (run == 1 or budget in stacks["repeat_budgets"]):
                rows[budget] += tree_rows(weights, job, kernels, base, budget, run)
        for block in stacks["chain_blocks"]:
            if block - 1 in rows and (run == 1 or block - 1 in stacks["repeat_budgets"]):
                rows[block - 1] += chain_rows(weights, job, base, block, run)
    return rows
