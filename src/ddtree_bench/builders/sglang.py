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
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys

import numpy as np

from ddtree_bench.builders.base import Builder, BuilderUnavailable
from ddtree_bench.tree import TreeBatch

KNOWN_MODULE_PATHS = (
    "sglang.srt.speculative.dflash_ddtree_utils",
    "sglang.srt.speculative.ddtree_utils",
)
FUNCTION_NAME = "build_ddtree_tree_from_topk"


def _module_present(name: str) -> bool:
    if sys.modules.get(name) is not None:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def sglang_version() -> str | None:
    """The installed SGLang's version, or ``None`` when it is not installed."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        pass
    if not _module_present("sglang"):
        return None
    try:
        module = importlib.import_module("sglang")
    except Exception:  # noqa: BLE001 - a broken install still has "some" version
        return "unknown"
    return str(getattr(module, "__version__", "unknown"))


def _as_numpy(value) -> np.ndarray:
    """A CPU numpy view of a torch tensor (or anything array-like)."""
    for method in ("detach", "cpu"):
        if hasattr(value, method):
            value = getattr(value, method)()
    if hasattr(value, "numpy"):
        return np.asarray(value.numpy())
    return np.asarray(value)


class SGLangBuilder(Builder):
    name = "sglang"
    label = "SGLang build_ddtree_tree_from_topk (Python heapq)"
    device = "cpu"

    def __init__(self, module_paths: list[str] | tuple[str, ...] | str | None = None):
        if isinstance(module_paths, str):
            module_paths = [module_paths]
        given = [str(p) for p in (module_paths or [])]
        self.module_paths: tuple[str, ...] = tuple(dict.fromkeys([*given, *KNOWN_MODULE_PATHS]))
        self._function = None
        self._module_path: str | None = None
        self._torch = None
        self._reason: str | None = None
        self._resolved = False

    def _resolve(self) -> None:
        if self._resolved:
            return
        self._resolved = True
        has_torch = _module_present("torch")
        version = sglang_version()
        if not has_torch and version is None:
            self._reason = "neither torch nor sglang is installed (install the extra: pip install .[sglang])"
            return
        if not has_torch:
            self._reason = f"sglang {version} is installed but torch is not (pip install .[sglang])"
            return
        if version is None:
            self._reason = "sglang is not installed (install the extra: pip install .[sglang])"
            return
        try:
            self._torch = importlib.import_module("torch")
        except Exception as error:  # noqa: BLE001 - report any import failure as the reason
            self._reason = f"torch is installed but fails to import: {type(error).__name__}: {error}"
            return
        tried = []
        for path in self.module_paths:
            try:
                module = importlib.import_module(path)
            except ModuleNotFoundError as error:
                missing = error.name or path
                tried.append(f"{path} (no module {missing})" if missing != path else f"{path} (absent)")
                continue
            except Exception as error:  # noqa: BLE001
                tried.append(f"{path} (import failed: {type(error).__name__}: {error})")
                continue
            function = getattr(module, FUNCTION_NAME, None)
            if not callable(function):
                tried.append(f"{path} (no {FUNCTION_NAME})")
                continue
            self._function = function
            self._module_path = path
            return
        self._reason = (
            f"sglang {version} is installed but has no DDTree {FUNCTION_NAME}; tried: " + "; ".join(tried)
        )

    def unavailable_reason(self) -> str | None:
        self._resolve()
        return self._reason

    @property
    def module_path(self) -> str | None:
        """The module the function was found in (``None`` when unavailable)."""
        self._resolve()
        return self._module_path

    def build(self, top_log_probs, top_token_ids, budget) -> TreeBatch:
        budget = self.check(top_log_probs, top_token_ids, budget)
        self._resolve()
        if self._function is None:
            raise BuilderUnavailable(self._reason)
        torch, function = self._torch, self._function
        lp = torch.from_numpy(np.ascontiguousarray(top_log_probs))
        ids = torch.from_numpy(np.ascontiguousarray(top_token_ids))
        out = TreeBatch.empty(top_log_probs.shape[0], budget)
        for b in range(top_log_probs.shape[0]):  # the per-request loop SGLang's worker runs
            result = function(lp[b], ids[b], budget)
            normalise_into(out, b, result, budget)
        return out

    def info(self) -> dict:
        info = super().info()
        self._resolve()
        info["sglang"] = sglang_version()
        info["module"] = self._module_path
        info["module_paths"] = list(self.module_paths)
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
