"""Tree builders by name: ``get_builder(name).build(top_log_probs, top_token_ids, budget) -> TreeBatch``."""

from __future__ import annotations

from ddtree_bench.builders.base import Builder, BuilderUnavailable

BUILDER_NAMES = ("sglang", "reference", "native", "native-mt", "gpu")


def get_builder(name: str, **options) -> Builder:
    """The builder called ``name``; options go to its constructor (e.g. ``threads`` for native)."""
    if name == "reference":
        from ddtree_bench.builders.reference import ReferenceBuilder

        return ReferenceBuilder(**options)
    if name == "sglang":
        from ddtree_bench.builders.sglang import SGLangBuilder

        return SGLangBuilder(**options)
    if name in ("native", "native-mt"):
        from ddtree_bench.builders.native import NativeBuilder

        if name == "native-mt":
            options.setdefault("threads", 0)
        return NativeBuilder(**options)
    if name == "gpu":
        from ddtree_bench.builders.gpu import GpuBuilder

        return GpuBuilder(**options)
    raise ValueError(f"unknown builder {name!r}; known builders: {', '.join(BUILDER_NAMES)}")


__all__ = ["BUILDER_NAMES", "Builder", "BuilderUnavailable", "get_builder"]
