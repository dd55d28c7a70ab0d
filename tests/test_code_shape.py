"""Every function in src/ takes at most 8 parameters and runs at most 80 lines (its ``def`` line to its last
line, decorators not counted; ``self``/``cls`` not counted, ``*args`` and ``**kwargs`` one each)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_PARAMETERS, MAX_LINES = 8, 80


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    count = len(names) + (args.vararg is not None) + (args.kwarg is not None)
    return count - (1 if names and names[0] in ("self", "cls") else 0)


def offenders(src: Path = SRC) -> list[str]:
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if parameters(node) > MAX_PARAMETERS or lines > MAX_LINES:
                    where = f"{path.relative_to(src)}:{node.lineno} {node.name}"
                    found.append(f"{where}: {parameters(node)} parameters, {lines} lines")
    return found


def test_no_function_takes_more_than_8_parameters_or_runs_over_80_lines():
    assert offenders() == []


def test_the_check_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    (tmp_path / "m.py").write_text(
        f"def long():\n{body}\n\n\ndef wide(self, a, b, c, d, e, f, g, *h, **i):\n    pass\n"
    )
    assert offenders(tmp_path) == [
        "m.py:1 long: 0 parameters, 81 lines",
        "m.py:84 wide: 9 parameters, 2 lines",
    ]
