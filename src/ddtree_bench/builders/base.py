"""The interface every tree builder implements."""

from __future__ import annotations

import numpy as np

from ddtree_bench.tree import TreeBatch
from ddtree_bench.validation import check_budget, check_topk_arrays


class BuilderUnavailable(RuntimeError):
    """The builder cannot run on this machine (the message says why)."""


class Builder:
    """``build(top_log_probs [B, L, K] float32, top_token_ids [B, L, K] int64, budget) -> TreeBatch``."""

    name: str = ""
    label: str = ""
    device: str = "cpu"

    def unavailable_reason(self) -> str | None:
        """``None`` when the builder can run here, else why it cannot."""
        return None

    @property
    def available(self) -> bool:
        return self.unavailable_reason() is None

    def check(self, top_log_probs: np.ndarray, top_token_ids: np.ndarray, budget) -> int:
        check_topk_arrays(top_log_probs, top_token_ids)
        return check_budget(budget)

    def build(self, top_log_probs: np.ndarray, top_token_ids: np.ndarray, budget: int) -> TreeBatch:
        raise NotImplementedError

    def info(self) -> dict:
        """What the benchmark records about this builder (versions, variant, paths)."""
        return {"builder": self.name, "label": self.label, "device": self.device}
