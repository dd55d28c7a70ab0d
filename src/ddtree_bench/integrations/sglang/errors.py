"""The one error style of SGLang's loading: ``SglangUnavailable`` (one line), and ``describe`` for a cause."""

from __future__ import annotations


class SglangUnavailable(RuntimeError):
    """SGLang's code cannot be loaded or run here; the message (one line: whitespace runs become one space)
    says why. A path the user gave that is wrong is a ``ValueError`` instead (bad input)."""

    def __init__(self, reason: str):
        super().__init__(" ".join(str(reason).split()))


def describe(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` (with the next line where the first only introduces it, as
    Dynamo's "backend='inductor' raised:" does), truncated to ``limit`` characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):  # e.g. "backend='inductor' raised:" and the cause below
        lines[0] = f"{lines[0]} {lines[1]}"
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
