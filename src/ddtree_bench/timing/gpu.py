"""The one GPU timer: CUDA events recorded on a stream around a single call queued behind a spin kernel.

The spin kernel (``kernels/bench_util/bench_util.cu``: ``ddtree_spin_kernel``) keeps the GPU busy while the
host queues the start event, the timed call and the end event, so that the events time the GPU's work, not
the host's launch overhead (nvbench's blocking-kernel approach). An optional ``flush`` call, queued after
the spin and before the start event, overwrites the L2 for a cold-cache sample.
"""

from __future__ import annotations

import numpy as np

#: How long the spin kernel runs (ns): long enough to cover the host's cost of queueing one timed call.
SPIN_NS = 100_000
#: The clock name event-timed rows carry.
EVENT_CLOCK = "cudaEventElapsedTime"


class EventTimer:
    """``timer(fn)`` -> seconds of one call of ``fn()`` on ``stream``, by CUDA events behind a spin kernel.

    ``spin_kernel`` is the loaded ``ddtree_spin_kernel``; ``flush`` (optional) a callable queueing an
    L2-flush on ``stream``, run before the start event when a sample asks for ``cold=True``."""

    def __init__(self, stream, spin_kernel, *, spin_ns: int = SPIN_NS, flush=None):
        import cupy as cp  # noqa: PLC0415

        self.stream = stream
        self.spin_kernel = spin_kernel
        self.spin_ns = np.int64(spin_ns)
        self.flush = flush
        self.start, self.end = cp.cuda.Event(), cp.cuda.Event()
        self._elapsed_ms = cp.cuda.get_elapsed_time

    def spin(self) -> None:
        self.spin_kernel((1,), (1,), (self.spin_ns,), stream=self.stream)

    def __call__(self, fn, cold: bool = False) -> float:
        self.spin()
        if cold:
            self.flush()
        self.start.record(self.stream)
        fn()
        self.end.record(self.stream)
        self.end.synchronize()
        return self._elapsed_ms(self.start, self.end) / 1e3


def pinned(nbytes: int) -> np.ndarray:
    """A page-locked host byte buffer of ``nbytes`` bytes."""
    import cupy as cp  # noqa: PLC0415

    return np.frombuffer(cp.cuda.alloc_pinned_memory(max(1, nbytes)), np.uint8, nbytes)
