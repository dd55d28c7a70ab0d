"""Tree builders by name: ``get_builder(name).build(top_log_probs, top_token_ids, budget) -> TreeBatch``. The
names, their classes and their default options are the catalog's (``catalog.BUILDERS``). The gpu builder's
self-test against reference: ``python -m ddtree_bench.builders.selftest``."""

from __future__ import annotations

import importlib
import inspect

from ddtree_bench import catalog
from ddtree_bench.builders.base import Builder, BuilderUnavailable


def __getattr__(name: str):
    if name == "BUILDER_NAMES":  # read at each use: the catalog's builders
        return catalog.builder_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _make(name: str, cls, options: dict) -> Builder:
    """``cls(**options)``, after checking that its constructor takes every option (a ValueError naming the
    option and the ones it does take, instead of a TypeError's traceback)."""
    parameters = inspect.signature(cls).parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        known = [
            p.name
            for p in parameters
            if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
        unknown = [key for key in options if key not in known]
        if unknown:
            takes = f"its options: {', '.join(known)}" if known else "it takes no options"
            raise ValueError(f"builder {name} takes no option {unknown[0]!r}; {takes}")
    return cls(**options)


def builder_class(name: str):
    """The class of the builder called ``name`` (imported on first use)."""
    entry = catalog.BUILDERS.get(name)
    if entry is None:
        raise ValueError(f"unknown builder {name!r}; known builders: {', '.join(catalog.BUILDERS)}")
    module, _, attribute = entry.impl.partition(":")
    return getattr(importlib.import_module(module), attribute)


def get_builder(name: str, **options) -> Builder:
    """The builder called ``name``; options go to its constructor over the catalog's defaults (e.g.
    ``threads`` for native). An option the builder does not take is a one-line ValueError."""
    cls = builder_class(name)
    return _make(name, cls, {**catalog.BUILDERS[name].options, **options})


__all__ = ["BUILDER_NAMES", "Builder", "BuilderUnavailable", "builder_class", "get_builder"]
