"""Writing outputs whole or not at all: the report's folder staged."""

from __future__ import annotations

import pytest

from ddtree_bench.io import staged_folder


def test_a_staged_folder_appears_only_when_complete(tmp_path):
    out = tmp_path / "report"
    with pytest.raises(RuntimeError), staged_folder(out) as stage:
        (stage / "index.html").write_text("half")
        raise RuntimeError("the render failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither the folder nor its stage
    with staged_folder(out) as stage:
        (stage / "figures").mkdir()
        (stage / "figures" / "a.png").write_text("a")
        (stage / "index.html").write_text("one")
        assert not out.exists()
    assert (out / "index.html").read_text() == "one" and (out / "figures" / "a.png").read_text() == "a"
    (out / "notes.txt").write_text("mine")
    with staged_folder(out) as stage:
        (stage / "index.html").write_text("two")
    assert (out / "index.html").read_text() == "two" and (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]
