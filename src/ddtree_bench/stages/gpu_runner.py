"""What the rest of the round's stages (``model``, ``draft``, ``round``) share: why they cannot run here
(``gpu_reason``), the room they leave free (``HEADROOM``), an exception in one line (``describe_error``), the
job's event timer (``GraphRunner``) and the rows of a timed call (``ok_rows``)."""

from __future__ import annotations

from ddtree_bench.cuda import loader as cuda
from ddtree_bench.timing.policy import TimingPolicy

#: Room left free on the GPU beside what a job allocates (the CUDA context, allocator slack).
HEADROOM = 0.06


def describe_error(exc: BaseException) -> str:
    """``exc`` in one line: its type and the first line of its message (at most 300 characters)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def gpu_reason() -> str | None:
    """Why the round's stages cannot run here (no GPU, no PyTorch), or None."""
    reason = cuda.gpu_unavailable_reason()
    if reason is None:
        try:
            import torch  # noqa: F401, PLC0415
        except ImportError as exc:
            reason = f"PyTorch is not installed: {exc}"
    return reason


class GraphRunner:
    """The job's one event timer (behind the spin kernel) on a stream that torch also launches on."""

    def __init__(self, policy: TimingPolicy, util_fatbin):
        import cupy as cp  # noqa: PLC0415
        import torch  # noqa: PLC0415

        from ddtree_bench.timing.gpu import EventTimer  # noqa: PLC0415

        util = cp.RawModule(path=str(util_fatbin or cuda.cached_fatbin(cuda.BENCH_UTIL_SOURCE)))
        self.policy = policy
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.torch_stream = torch.cuda.ExternalStream(self.stream.ptr)
        self.timer = EventTimer(self.stream, util.get_function("ddtree_spin_kernel"))
        self.torch = torch

    def measure(self, fn):
        """``(samples, note)``: ``fn`` captured as one CUDA graph and its replays timed; where capture fails,
        the eager calls (said in the note)."""
        from ddtree_bench.k26.target import capture  # noqa: PLC0415

        torch = self.torch
        with torch.cuda.stream(self.torch_stream):
            try:
                graph, _ = capture(fn)
                call, note = graph.replay, "one CUDA graph"
            except Exception as exc:  # noqa: BLE001 (recorded: the eager calls are timed instead)
                torch.cuda.synchronize()
                graph, call, note = None, fn, f"eager (graph capture failed: {describe_error(exc)})"
            samples = self.policy.samples(lambda: self.timer(call))
        torch.cuda.synchronize()
        del graph
        return samples, note

    def free(self) -> float:
        """The GPU's free bytes, after a synchronisation and torch's cache emptied."""
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()
        return float(self.torch.cuda.mem_get_info()[0])


def ok_rows(base_row: dict, samples, *, flops, nbytes, experts_touched, note) -> list[dict]:
    """A row per timed call of ``samples`` (``(phase, repetition, seconds)``) on ``base_row``."""
    return [
        {
            **base_row,
            "phase": phase,
            "repetition": rep,
            "seconds": seconds,
            "flops": flops,
            "bytes": nbytes,
            "experts_touched": experts_touched,
            "note": note,
            "status": "ok",
        }
        for phase, rep, seconds in samples
    ]
