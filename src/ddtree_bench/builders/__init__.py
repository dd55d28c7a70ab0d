"""Tree builders by name: ``get_builder(name).build(top_log_probs, top_token_ids, budget) -> TreeBatch``."""

from __future__ import annotations

import inspect

from ddtree_bench.builders.base import Builder, BuilderUnavailable

BUILDER_NAMES = ("sglang", "reference", "native", "native-mt", "gpu")


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


def get_builder(name: str, **options) -> Builder:
    """The builder called ``name``; options go to its constructor (e.g. ``threads`` for native). An option
    the builder does not take is a one-line ValueError."""
    if name == "reference":
        from ddtree_bench.builders.reference import ReferenceBuilder  # noqa: PLC0415

        return _make(name, ReferenceBuilder, options)
    if name == "sglang":
        from ddtree_bench.builders.sglang import SGLangBuilder  # noqa: PLC0415

        return _make(name, SGLangBuilder, options)
    if name in ("native", "native-mt"):
        from ddtree_bench.builders.native import NativeBuilder  # noqa: PLC0415

        if name == "native-mt":
            options.setdefault("threads", 0)
        return _make(name, NativeBuilder, options)
    if name == "gpu":
        from ddtree_bench.builders.gpu import GpuBuilder  # noqa: PLC0415

        return _make(name, GpuBuilder, options)
    raise ValueError(f"unknown builder {name!r}; known builders: {', '.join(BUILDER_NAMES)}")


__all__ = ["BUILDER_NAMES", "Builder", "BuilderUnavailable", "get_builder"]
