"""The environment record's git commit: the checkout's own, or the override for copies without git data."""

import shutil
import subprocess

import pytest

from ddtree_bench import environment


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_commit_is_the_checkouts_head_with_dirty_when_tracked_files_change(tmp_path, monkeypatch):
    monkeypatch.delenv(environment.GIT_COMMIT_ENV, raising=False)

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    (tmp_path / "a.txt").write_text("1\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git("rev-parse", "HEAD").strip()
    assert environment.git_commit(tmp_path) == head
    (tmp_path / "b.txt").write_text("untracked\n")  # untracked files do not count
    assert environment.git_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("2\n")
    assert environment.git_commit(tmp_path) == head + "-dirty"


def test_git_commit_outside_git_is_none_and_the_override_wins(tmp_path, monkeypatch):
    monkeypatch.delenv(environment.GIT_COMMIT_ENV, raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above tmp_path
    assert environment.git_commit(tmp_path) is None
    monkeypatch.setenv(environment.GIT_COMMIT_ENV, " 368f66f ")
    assert environment.git_commit(tmp_path) == "368f66f"
    monkeypatch.setenv(environment.GIT_COMMIT_ENV, "")  # empty: not set
    assert environment.git_commit(tmp_path) is None
