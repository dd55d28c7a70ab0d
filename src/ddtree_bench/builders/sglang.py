"""``sglang``: SGLang's own ``build_ddtree_tree_from_topk``, called the way its DDTree worker calls it.

Per request ``b``, with CPU torch tensors ``top_log_probs[b]`` (float32 [L, K]) and ``top_token_ids[b]``
(int64 [L, K]) and the budget; the function returns, unpadded, ``(node_token_ids, node_depths, parents,
child_maps, visibility, retrieve_next_token, retrieve_next_sibling)``, which this builder copies into the
padded :class:`~ddtree_bench.tree.TreeBatch`.

A build's time includes that copy into the padded batch, as SGLang's worker pays for its own padding
(``pad_ddtree_build_outputs``) after each call.

SGLang and torch come only with the optional extra (``pip install .[sglang]``); nothing here imports
either until the builder is asked whether it is available or to build. The DDTree module is looked for at
the ``module_paths`` given (first) and then at the known paths, in order.

``source``: a path to an SGLang checkout (its root or its ``python/`` folder) or to the ``.py`` file defining
``build_ddtree_tree_from_topk``. The file is loaded under a private module name (no ``import sglang``: the
package's ``__init__`` pulls in much more); only torch is needed. A source that does not exist, a file without
the function, or torch missing raise ``ValueError`` when the builder is made: the user asked for it.

Where the function takes ``workspace=`` and its module defines ``DFlashDDTreeBuildWorkspace`` (newer states of
the DDTree branch), one workspace made with the builder is passed to every call, as SGLang's worker does.
``source_info`` records where the function came from (module or file, the file's sha256, the checkout's git
commit where the file is tracked in one) and whether a workspace is passed; the timing rows carry it.

Finding and loading the function is ``integrations.sglang``'s (``find_function``, ``load_function``); this
builder times it. ``sglang_call`` gives the function as the in-situ timing and the round call it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ddtree_bench import catalog
from ddtree_bench.builders.base import Builder, BuilderUnavailable
from ddtree_bench.integrations.sglang import (
    FUNCTION_NAME,
    KNOWN_MODULE_PATHS,
    Found,
    SglangUnavailable,
    check_source,
    find_function,
    installed_version,
    load_function,
    sglang_version,
)
from ddtree_bench.tree import TreeBatch


def _as_numpy(value) -> np.ndarray:
    """A CPU numpy view of a torch tensor (or anything array-like)."""
    for method in ("detach", "cpu"):
        if hasattr(value, method):
            value = getattr(value, method)()
    if hasattr(value, "numpy"):
        return np.asarray(value.numpy())
    return np.asarray(value)


class SGLangBuilder(Builder):
    name = catalog.SGLANG
    label = "SGLang build_ddtree_tree_from_topk (Python heapq)"
    device = "cpu"

    def __init__(
        self,
        module_paths: list[str] | tuple[str, ...] | str | None = None,
        source: str | Path | None = None,
    ):
        if isinstance(module_paths, str):
            module_paths = [module_paths]
        given = [str(p) for p in (module_paths or [])]
        self.module_paths: tuple[str, ...] = tuple(dict.fromkeys([*given, *KNOWN_MODULE_PATHS]))
        self._function = None
        self._pad_function = None
        self._workspace = None
        self._source_info: dict | None = None
        self._module_path: str | None = None
        self._torch = None
        self._reason: str | None = None
        self._resolved = False
        self.source: Path | None = None
        if source is not None and str(source) != "":
            # asked for explicitly: every problem is bad input now, never a quiet "unavailable"
            self.source = check_source(source)
            self._resolve()

    def _adopt(self, found: Found) -> None:
        """Take the function found, its module's pad function and, where the function takes one, a workspace
        made once; record where it came from."""
        self._torch = found.torch
        self._function = found.function
        self._pad_function = found.pad_function
        self._workspace = found.make_workspace()
        self._source_info = {**found.provenance(), "workspace": self._workspace is not None}

    def _resolve(self) -> None:
        if self._resolved:
            return
        self._resolved = True
        if self.source is not None:
            self._adopt(load_function(self.source))  # asked for by path: ValueError, never "unavailable"
            return
        try:
            found = find_function(self.module_paths)
        except SglangUnavailable as exc:
            self._reason = str(exc)
            return
        self._adopt(found)
        self._module_path = found.source

    def unavailable_reason(self) -> str | None:
        self._resolve()
        return self._reason

    @property
    def module_path(self) -> str | None:
        """The module the function was found in (``None`` when unavailable)."""
        self._resolve()
        return self._module_path

    @property
    def function(self):
        """SGLang's ``build_ddtree_tree_from_topk`` as found (``None`` when unavailable)."""
        self._resolve()
        return self._function

    @property
    def pad_function(self):
        """``pad_ddtree_build_outputs`` from the same module (``None`` where it has none)."""
        self._resolve()
        return self._pad_function

    @property
    def workspace(self):
        """The one ``DFlashDDTreeBuildWorkspace`` passed to every call (``None``: the function takes none)."""
        self._resolve()
        return self._workspace

    @property
    def source_info(self) -> dict | None:
        """Where the function came from: ``kind`` ("module" or "file"), ``source`` (the module path or the
        file given), ``file``, its ``sha256``, ``git_commit`` and ``git_modified`` (the git work tree that
        tracks the file, else None) and ``workspace`` (whether one is passed); ``None`` when unavailable."""
        self._resolve()
        return None if self._source_info is None else dict(self._source_info)

    def build(self, top_log_probs, top_token_ids, budget) -> TreeBatch:
        budget = self.check(top_log_probs, top_token_ids, budget)
        self._resolve()
        if self._function is None:
            raise BuilderUnavailable(self._reason)
        torch, function = self._torch, self._function
        lp = torch.from_numpy(np.ascontiguousarray(top_log_probs))
        ids = torch.from_numpy(np.ascontiguousarray(top_token_ids))
        out = TreeBatch.empty(top_log_probs.shape[0], budget)
        extra = {} if self._workspace is None else {"workspace": self._workspace}
        for b in range(top_log_probs.shape[0]):  # the per-request loop SGLang's worker runs
            result = function(lp[b], ids[b], budget, **extra)
            normalise_into(out, b, result, budget)  # copies now: a workspace's views change next call
        return out

    def info(self) -> dict:
        info = super().info()
        self._resolve()
        # loaded by path: an installed sglang's version from its metadata, never by importing it
        info["sglang"] = sglang_version() if self.source is None else installed_version()
        info["module"] = self._module_path
        info["module_paths"] = list(self.module_paths)
        if self._source_info is not None:
            info["source"] = dict(self._source_info)
        if self._torch is not None:
            info["torch"] = str(getattr(self._torch, "__version__", "unknown"))
        if self._reason is not None:
            info["unavailable"] = self._reason
        return info


def normalise_into(out: TreeBatch, b: int, result, budget: int) -> None:
    """Copy one request's unpadded SGLang outputs into row ``b`` of the padded batch ``out`` (which holds
    padding already), checking that the shapes agree with each other and with the budget."""
    try:
        node_token_ids, node_depths, parents, _child_maps, visibility, next_token, next_sibling = result
    except (TypeError, ValueError):
        raise RuntimeError(
            f"{FUNCTION_NAME} returned {type(result).__name__}, expected the 7-tuple "
            "(node_token_ids, node_depths, parents, child_maps, visibility, retrieve_next_token, "
            "retrieve_next_sibling)"
        ) from None
    tokens = _as_numpy(node_token_ids).reshape(-1)
    depths = _as_numpy(node_depths).reshape(-1)
    parents = _as_numpy(parents).reshape(-1)
    visibility = _as_numpy(visibility)
    next_token = _as_numpy(next_token).reshape(-1)
    next_sibling = _as_numpy(next_sibling).reshape(-1)
    n = tokens.shape[0]
    shapes = {
        "node_depths": (depths.shape, (n,)),
        "parents": (parents.shape, (n + 1,)),
        "visibility": (visibility.shape, (n + 1, n + 1)),
        "retrieve_next_token": (next_token.shape, (n + 1,)),
        "retrieve_next_sibling": (next_sibling.shape, (n + 1,)),
    }
    if n > budget:
        raise RuntimeError(f"{FUNCTION_NAME} returned {n} nodes for request {b}, over the budget {budget}")
    for field, (got, want) in shapes.items():
        if tuple(got) != want:
            raise RuntimeError(f"{FUNCTION_NAME}: request {b} has {n} nodes but {field} has shape {got}")
    out.node_count[b] = n
    out.node_token_ids[b, :n] = tokens
    out.node_depths[b, :n] = depths
    out.parents[b, : n + 1] = parents
    out.visibility[b, : n + 1, : n + 1] = visibility
    out.retrieve_next_token[b, : n + 1] = next_token
    out.retrieve_next_sibling[b, : n + 1] = next_sibling


def sglang_call(builder: SGLangBuilder):
    """``(function, pad_function or None, extra keyword arguments)``: how SGLang's worker calls the function
    that ``builder`` found, once per request (the extra arguments: the one reused workspace, where it takes
    one). ``BuilderUnavailable`` where the builder found none."""
    reason = builder.unavailable_reason()  # resolves the function
    if builder.function is None:
        raise BuilderUnavailable(reason)
    workspace = builder.workspace
    return builder.function, builder.pad_function, ({} if workspace is None else {"workspace": workspace})
