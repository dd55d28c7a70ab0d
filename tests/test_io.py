"""Writing outputs whole or not at all: the report's folder staged, and the probe that finds an unwritable
results folder (read-only, or a full disk) before any work."""

from __future__ import annotations

import errno
import os

import pytest

from ddtree_bench.io import check_writable, staged_folder


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


def test_a_full_disk_is_found_by_the_probe(tmp_path, monkeypatch):
    """Creating an empty file succeeds on a full disk; writing to it does not: the probe writes."""
    check_writable(tmp_path / "results", "config: results:", folder=True)
    real_write = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(ValueError) as error:
        check_writable(tmp_path / "results", "config: results:", folder=True)
    monkeypatch.setattr(os, "write", real_write)
    assert str(error.value) == (
        f"config: results: {tmp_path / 'results'}: cannot write in {tmp_path} (No space left on device)"
    )
    assert list(tmp_path.iterdir()) == []  # the probe removed
