"""Snakemake's report captions of the figures (workflow/report/<figure>.rst) are the catalog's titles and
captions, written by tools/write_captions.py: a caption is written once, in the catalog."""

from __future__ import annotations

import subprocess
import sys

import pytest
from workflow_copy import ROOT

from ddtree_bench import catalog
from ddtree_bench.report.captions import CAPTIONS_DIR, WRITE_COMMAND, caption_path, figure_caption_rst

#: The caption files written by hand: Snakemake's report's description, pages, tables and environment.
HAND_WRITTEN = {"workflow", "index", "markdown", "summary", "step_summary", "environment"}


@pytest.mark.parametrize("name", catalog.figure_names())
def test_each_figures_caption_file_is_the_catalogs(name):
    path = caption_path(name)
    assert path.is_file(), f"{path} is missing: run {WRITE_COMMAND}"
    assert path.read_text() == figure_caption_rst(name), (
        f"{path} is not the catalog's caption: run {WRITE_COMMAND}"
    )


def test_every_caption_file_is_a_figures_or_written_by_hand():
    """A figure removed from the catalog leaves no caption behind; the report rule's captions all exist."""
    names = {path.stem for path in CAPTIONS_DIR.glob("*.rst")}
    assert names == set(catalog.figure_names()) | HAND_WRITTEN, (
        f"run {WRITE_COMMAND}; stale: {names - set(catalog.figure_names()) - HAND_WRITTEN}"
    )
    rules = (ROOT / "workflow" / "rules" / "report.smk").read_text()
    assert 'caption=f"../report/{name}.rst"' in rules  # the figures' captions, by name


def test_a_caption_is_the_title_and_the_caption_as_plain_restructuredtext():
    """Rendered as Snakemake renders a caption (Jinja, then reStructuredText), a caption file is two
    paragraphs, the title in bold and the caption, word for word: no character of them taken as markup."""
    import jinja2  # noqa: PLC0415
    from docutils import nodes  # noqa: PLC0415
    from docutils.core import publish_doctree  # noqa: PLC0415

    for name, figure in catalog.FIGURES.items():
        text = jinja2.Template(figure_caption_rst(name)).render()
        tree = publish_doctree(text, settings_overrides={"report_level": 5, "halt_level": 5})
        assert not list(tree.findall(nodes.system_message)), (name, text)
        title, caption = (" ".join(p.astext().split()) for p in tree.findall(nodes.paragraph))
        assert [s.astext() for s in tree.findall(nodes.strong)] == [figure.title] == [title], name
        assert caption == " ".join(figure.caption.split()), name


def test_the_tool_rewrites_a_caption_that_drifted(tmp_path):
    for name in catalog.figure_names():
        (tmp_path / f"{name}.rst").write_text(figure_caption_rst(name))
    (tmp_path / "speedup.rst").write_text("an old caption\n")
    tool = ROOT / "tools" / "write_captions.py"
    done = subprocess.run(
        [sys.executable, tool, "--folder", tmp_path], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "1 caption file(s) rewritten"
    assert (tmp_path / "speedup.rst").read_text() == figure_caption_rst("speedup")
