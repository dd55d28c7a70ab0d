"""Tensor-parallel communication of one verify round, run with torch.distributed: ``measure_collectives``.

Per forward of ``T`` tree tokens each of the target's layers all-reduces twice ``T x hidden`` bf16 values
(after the attention's ``o_proj`` and after the MLP / MoE): ``2 x layers`` all-reduces, 122 for Kimi K2.6.
The drafter's vocab-parallel top-K is merged with three all-gathers (values float32 and ids int64
[rows, K], the log-softmax normaliser float32 [rows]). ``collective_plan`` lists them; ``run_rank`` runs them
on one rank (NCCL on GPUs: the whole round's collectives captured as one CUDA graph and replayed, timed by
CUDA events on rank 0; gloo on CPUs: back to back, wall clock) and checks each all-reduce's sum;
``measure_collectives`` spawns one process per rank and returns rank 0's samples.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

BACKENDS = ("nccl", "gloo")


@dataclass(frozen=True)
class Collective:
    op: str  # "all-reduce" or "all-gather"
    numel: int  # elements a rank contributes
    dtype: str  # "bfloat16", "float32", "int64"

    @property
    def bytes(self) -> int:
        return self.numel * {"bfloat16": 2, "float32": 4, "int64": 8}[self.dtype]


def collective_plan(tokens: int, hidden: int, layers: int, draft_rows: int, topk: int) -> list[Collective]:
    """The collectives of one round: ``2 x layers`` all-reduces of ``tokens x hidden`` bf16, then the
    drafter's three top-K all-gathers over ``draft_rows`` rows (none where ``draft_rows`` is 0)."""
    for name, value in (("tokens", tokens), ("hidden", hidden), ("layers", layers), ("topk", topk)):
        if value < 1:
            raise ValueError(f"allreduce: {name} must be >= 1, got {value}")
    plan = [Collective("all-reduce", tokens * hidden, "bfloat16") for _ in range(2 * layers)]
    if draft_rows > 0:
        plan += [
            Collective("all-gather", draft_rows * topk, "float32"),
            Collective("all-gather", draft_rows * topk, "int64"),
            Collective("all-gather", draft_rows, "float32"),
        ]
    return plan


def plan_bytes(plan: list[Collective]) -> float:
    """Bytes a rank contributes over the plan."""
    return float(sum(c.bytes for c in plan))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_rank(rank: int, world: int, backend: str, port: int, plan, warmup: int, repeats: int, queue) -> None:
    """One rank: init the process group on loopback, run the plan ``warmup + repeats`` times, check every
    all-reduce's sum, and (rank 0) put ``("ok", [(phase, rep, seconds)...])`` or ``("failed", reason)``
    on ``queue``."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
        dist.init_process_group(backend, rank=rank, world_size=world)
        ranked = _RankedPlan(torch, dist, plan, rank, world, device)
        ranked.reset()
        ranked.round()
        ranked.check()
        timed = _graph_samples if backend == "nccl" else _wall_samples
        samples = timed(torch, dist, ranked.round, warmup, repeats)
        dist.barrier()
        if rank == 0:
            queue.put(("ok", samples))
    except Exception as exc:  # reported by rank 0's queue (or a timeout), never a hang of the stage
        if rank == 0:
            queue.put(("failed", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class _RankedPlan:
    """One rank's buffers of the plan: each all-reduce sends ``rank + 1`` (summed in place), each
    all-gather sends ``rank + 1`` into a buffer of every rank's."""

    def __init__(self, torch, dist, plan, rank: int, world: int, device):
        self.torch, self.dist, self.rank, self.world = torch, dist, rank, world
        dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32, "int64": torch.int64}
        self.buffers = []
        for c in plan:
            if c.op == "all-reduce":
                send = torch.full((c.numel,), float(rank + 1), dtype=dtypes[c.dtype], device=device)
                self.buffers.append((c, send, None))
            else:
                send = torch.full((c.numel,), rank + 1, dtype=dtypes[c.dtype], device=device)
                self.buffers.append((c, send, torch.empty(world * c.numel, dtype=send.dtype, device=device)))

    def round(self):
        for _, send, recv in self.buffers:
            if recv is None:
                self.dist.all_reduce(send)
            else:
                self.dist.all_gather_into_tensor(recv, send)

    def reset(self):
        for _, send, recv in self.buffers:
            if recv is None:
                send.fill_(float(self.rank + 1))

    def check(self):
        """Every collective's result after one round from ``reset``; RuntimeError on a wrong one."""
        torch, world = self.torch, self.world
        expected = world * (world + 1) / 2
        for c, send, recv in self.buffers:
            got = send if recv is None else recv.view(world, -1)[:, 0]
            want = (
                torch.full_like(got, expected)
                if recv is None
                else torch.arange(1, world + 1, dtype=got.dtype, device=got.device)
            )
            if not torch.equal(got.float(), want.float()):
                raise RuntimeError(f"{c.op} of {c.numel} {c.dtype} gave a wrong result on rank {self.rank}")


def _graph_samples(torch, dist, round_, warmup: int, repeats: int) -> list:
    """The round captured as one CUDA graph, each replay timed by CUDA events (after a barrier)."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        round_()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        round_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for i in range(warmup + repeats):
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        phase, rep = ("warmup", i) if i < warmup else ("timed", i - warmup)
        samples.append((phase, rep, start.elapsed_time(end) / 1e3))
    return samples


def _wall_samples(torch, dist, round_, warmup: int, repeats: int) -> list:
    """The round's collectives back to back, each round timed by the wall clock (after a barrier)."""
    samples = []
    for i in range(warmup + repeats):
        dist.barrier()
        t0 = time.perf_counter_ns()
        round_()
        seconds = (time.perf_counter_ns() - t0) / 1e9
        phase, rep = ("warmup", i) if i < warmup else ("timed", i - warmup)
        samples.append((phase, rep, seconds))
    return samples


def measure_collectives(
    plan, *, world: int, backend: str, warmup: int = 1, repeats: int = 5, timeout: float = 300.0
) -> tuple[str, object]:
    """Run ``plan`` on ``world`` processes (``backend``: nccl, one GPU each; gloo, CPUs). Returns
    ``("ok", samples)``, rank 0's ``(phase, repetition, seconds)`` per round, or ``("failed", reason)``."""
    if backend not in BACKENDS:
        raise ValueError(f"allreduce: backend must be one of {list(BACKENDS)}, got {backend!r}")
    if world < 2:
        raise ValueError(f"allreduce: world size must be >= 2, got {world}")
    import torch.multiprocessing as mp  # noqa: PLC0415

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(target=run_rank, args=(r, world, backend, port, plan, warmup, repeats, queue))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    if queue.empty():
        return "failed", (
            f"no result from rank 0 within {timeout:.0f} s" if alive else "rank 0 exited without a result"
        )
    return queue.get()
