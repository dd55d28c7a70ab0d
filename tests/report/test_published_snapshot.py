"""The published report is reproducible: the render command the documentation gives, run as written (only
its output folder moved), writes ``results/published/h200/report.md`` byte for byte. A snapshot of the whole
page: any change of the report's layout or numbers shows here, and is committed with a re-render."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "results" / "published" / "h200" / "report.md"
#: The marker before the fenced block that holds the command (an HTML comment: not shown by a renderer).
MARKER = "<!-- published-report-command -->"
#: Where the command is written; docs/reproducing.md holds it, the others may, and then the same text.
DOCUMENTS = ("README.md", "docs/reproducing.md", "results/published/h200/README.md")


def marked_command(text: str) -> list[str]:
    """The command in the fenced block after ``MARKER``: its lines joined at trailing backslashes, split as
    the shell splits it."""
    after = text[text.index(MARKER) + len(MARKER) :].lstrip("\n")
    assert after.startswith("```"), "the marker must be followed by a fenced code block"
    body = after.split("\n", 1)[1]
    block = body[: body.index("```")]
    command = " ".join(line.rstrip().rstrip("\\").strip() for line in block.strip().splitlines())
    return shlex.split(command)


def commands() -> dict[str, list[str]]:
    out = {}
    for name in DOCUMENTS:
        path = ROOT / name
        if path.is_file() and MARKER in path.read_text():
            out[name] = marked_command(path.read_text())
    return out


def test_every_document_gives_the_same_render_command():
    found = commands()
    assert "docs/reproducing.md" in found, f"docs/reproducing.md has no {MARKER} block"
    first = found["docs/reproducing.md"]
    assert first[:2] == ["ddtree-bench", "report"] and "-o" in first
    for name, command in found.items():
        assert command == first, f"{name} gives another command than docs/reproducing.md"


def test_the_documented_command_renders_the_published_report_byte_for_byte(tmp_path):
    found = commands()
    command = found.get("README.md") or found["docs/reproducing.md"]  # README.md's once it has the marker
    args = list(command)
    args[args.index("-o") + 1] = str(tmp_path / "out")
    script = Path(sys.executable).parent / "ddtree-bench"
    result = subprocess.run([str(script), *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    rendered = (tmp_path / "out" / "summary.md").read_bytes()
    # a published folder is published, even as --results: never "this run"
    markdown = rendered.decode()
    assert (
        "**Machines:** h200 (published), h200-sglang (published), h200-sglang-regime (published), h100 "
        "(published)." in markdown
    )
    assert "(this run)" not in markdown
    committed = PUBLISHED.read_bytes()
    if rendered != committed:
        new, old = rendered.decode().splitlines(), committed.decode().splitlines()
        line = next(
            (i for i, (a, b) in enumerate(zip(new, old, strict=False)) if a != b), min(len(new), len(old))
        )
        raise AssertionError(
            f"{PUBLISHED.relative_to(ROOT)} differs from the render at line {line + 1}: re-render it with "
            f"the command of docs/reproducing.md and commit it\n"
            f"rendered:  {_line(new, line)}\ncommitted: {_line(old, line)}"
        )


def _line(lines: list[str], index: int) -> str:
    return lines[index] if index < len(lines) else "<end>"
