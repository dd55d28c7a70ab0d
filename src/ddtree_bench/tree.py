"""The one tree contract every builder returns: ``TreeBatch``.

Arrays are padded the way SGLang's DDTree worker pads them for CUDA graphs, to the budget ``N``:

=======================  ===================  ========  ===========
field                    shape                dtype     padding
=======================  ===================  ========  ===========
node_count               [B]                  int32     --
node_token_ids           [B, N]               int64     -1
node_depths              [B, N]               int64     0
parents                  [B, N+1]             int32     -1 (``parents[:, 0] = -1``)
visibility               [B, N+1, N+1]        bool      False
retrieve_next_token      [B, N+1]             int64     -1
retrieve_next_sibling    [B, N+1]             int64     -1
=======================  ===================  ========  ===========

Row ``i`` of ``visibility`` marks node ``i``'s ancestors and ``i`` itself (the root is index 0).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

TREE_FIELDS = (
    "node_count",
    "node_token_ids",
    "node_depths",
    "parents",
    "visibility",
    "retrieve_next_token",
    "retrieve_next_sibling",
)

FIELD_DTYPES = {
    "node_count": np.int32,
    "node_token_ids": np.int64,
    "node_depths": np.int64,
    "parents": np.int32,
    "visibility": np.bool_,
    "retrieve_next_token": np.int64,
    "retrieve_next_sibling": np.int64,
}


@dataclass
class TreeBatch:
    """A batch of DDTree draft trees, padded to the budget (see module docstring)."""

    node_count: np.ndarray
    node_token_ids: np.ndarray
    node_depths: np.ndarray
    parents: np.ndarray
    visibility: np.ndarray
    retrieve_next_token: np.ndarray
    retrieve_next_sibling: np.ndarray

    @property
    def batch_size(self) -> int:
        return int(self.node_count.shape[0])

    @property
    def budget(self) -> int:
        return int(self.node_token_ids.shape[1])

    @classmethod
    def empty(cls, batch_size: int, budget: int) -> TreeBatch:
        """Padding everywhere: what a builder fills in place."""
        n1 = budget + 1
        return cls(
            node_count=np.zeros(batch_size, np.int32),
            node_token_ids=np.full((batch_size, budget), -1, np.int64),
            node_depths=np.zeros((batch_size, budget), np.int64),
            parents=np.full((batch_size, n1), -1, np.int32),
            visibility=np.zeros((batch_size, n1, n1), np.bool_),
            retrieve_next_token=np.full((batch_size, n1), -1, np.int64),
            retrieve_next_sibling=np.full((batch_size, n1), -1, np.int64),
        )

    def as_dict(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def save(self, path) -> None:
        np.savez_compressed(path, **self.as_dict())

    @classmethod
    def load(cls, path) -> TreeBatch:
        with np.load(path) as data:
            missing = [name for name in TREE_FIELDS if name not in data]
            if missing:
                raise ValueError(f"{path}: tree file lacks arrays {missing}")
            return cls(**{name: data[name] for name in TREE_FIELDS})

    def request(self, index: int) -> dict[str, np.ndarray]:
        """One request's arrays, unpadded (root-inclusive where the contract says N+1)."""
        n = int(self.node_count[index])
        return {
            "node_token_ids": self.node_token_ids[index, :n],
            "node_depths": self.node_depths[index, :n],
            "parents": self.parents[index, : n + 1],
            "visibility": self.visibility[index, : n + 1, : n + 1],
            "retrieve_next_token": self.retrieve_next_token[index, : n + 1],
            "retrieve_next_sibling": self.retrieve_next_sibling[index, : n + 1],
        }


def first_difference(expected: TreeBatch, actual: TreeBatch) -> str | None:
    """``None`` when both batches are identical element for element (dtypes and shapes included),
    else a one-line description naming the first differing request and field."""
    for name in TREE_FIELDS:
        a, b = getattr(expected, name), getattr(actual, name)
        if a.shape != b.shape:
            return f"field {name}: shape {b.shape} != expected {a.shape}"
        if a.dtype != b.dtype:
            return f"field {name}: dtype {b.dtype} != expected {a.dtype}"
    for request in range(expected.batch_size):
        for name in TREE_FIELDS:
            a, b = getattr(expected, name)[request], getattr(actual, name)[request]
            if not np.array_equal(a, b):
                where = np.argwhere(np.asarray(a != b))
                at = tuple(int(i) for i in where[0]) if where.size else ()
                got = b[at] if at else b
                want = a[at] if at else a
                return f"request {request}, field {name}, index {at}: got {got}, expected {want}"
    return None


def packed_visibility(visibility: np.ndarray) -> np.ndarray:
    """Bool ``[..., R, C]`` to packed bits ``[..., R, ceil(C/32)]`` uint32, bit ``j % 32`` of word ``j // 32``
    marks key ``j`` (little-endian bit order, as FlashInfer's packed custom masks)."""
    cols = visibility.shape[-1]
    words = (cols + 31) // 32
    padded = np.zeros(visibility.shape[:-1] + (words * 32,), np.bool_)
    padded[..., :cols] = visibility
    as_bytes = np.packbits(padded, axis=-1, bitorder="little")
    return np.ascontiguousarray(as_bytes).view(np.uint32).reshape(visibility.shape[:-1] + (words,))
