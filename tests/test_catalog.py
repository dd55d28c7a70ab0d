"""The catalog declares each builder, series, impl, stage and figure once; everything else derives from it.

A toy builder registered in the catalog (before anything else imports it, as an entry in the file would be)
is built by ``get_builder``, accepted by the configuration, planned by the workflow and named by the report;
a toy figure registered there is drawn and shown in the report."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import types

import yaml
from workflow_copy import ROOT, catalog_entry_environment, needs_snakemake, snakemake, workdir_copy

from ddtree_bench import catalog
from ddtree_bench.config import CATALOG_ENUMS, SCHEMA_PATH, load_schema, schema_enum

SRC = ROOT / "src" / "ddtree_bench"


def _literal_files(value: str) -> dict[str, int]:
    """The files of src/ that spell ``value`` as a string literal, and how often."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        count = sum(
            isinstance(node, ast.Constant) and node.value == value
            for node in ast.walk(ast.parse(path.read_text()))
        )
        if count:
            found[str(path.relative_to(SRC))] = count
    return found


def test_names_are_spelled_in_at_most_two_files():
    for name in (catalog.NATIVE_MT, catalog.IN_SITU):
        files = _literal_files(name)
        assert "catalog.py" in files and len(files) <= 2, (name, files)


def test_builder_and_impl_names_are_spelled_only_in_the_catalog():
    """Every builder and verify-attention impl name that means nothing else is a string literal in
    catalog.py only; code says ``catalog.ORACLE``, ``catalog.NATIVE``, ``catalog.OURS``...

    Not checked: "gpu" (also the configuration's ``gpu`` key, on/off/auto; a machine label's fallback; the
    device side of the stacks' host/gpu split) and "sglang" (also the configuration's ``sglang`` section,
    the Python package ``sglang`` and the environment's column of its version)."""
    names = (catalog.REFERENCE, catalog.NATIVE, catalog.NATIVE_MT, *catalog.ATTENTION_IMPLS)
    assert catalog.OURS in names and catalog.STREAM_IMPL in names
    spelled = {name: files for name in names if set(files := _literal_files(name)) != {"catalog.py"}}
    assert spelled == {}


def test_the_schema_files_enums_hold_the_catalogs_names():
    """The builders', stacks' and acceptance profiles' nodes name none in the file (each is one catalog
    entry); every other catalog enum in the file equals the catalog's, and the loaded schema holds the
    catalog's names everywhere."""
    schema = yaml.safe_load(SCHEMA_PATH.read_text())  # the file itself, not load_schema's
    loaded = load_schema()
    for path, names in CATALOG_ENUMS:
        node = schema_enum(schema, path)
        if names in (catalog.builder_names, catalog.stack_names, catalog.profile_names):
            assert "enum" not in node, path
        else:
            assert set(node["enum"]) == set(names()), path
        assert set(schema_enum(loaded, path)["enum"]) == set(names()), path


def test_every_figure_and_builder_entry_names_what_exists():
    import importlib  # noqa: PLC0415

    for entry in (*catalog.FIGURES.values(), *catalog.BUILDERS.values()):
        module, _, attribute = (entry.draw if isinstance(entry, catalog.Figure) else entry.impl).partition(
            ":"
        )
        assert callable(getattr(importlib.import_module(module), attribute)), entry.name
    series = catalog.all_series().values()
    assert len({s.name for s in series}) == len(series)
    for builder in catalog.BUILDERS.values():  # a builder's series are told apart by kind and mask
        kinds = [(s.kind, s.packed) for s in (*builder.series, *builder.in_situ)]
        assert len(set(kinds)) == len(kinds) and {k for k, _ in kinds} <= set(catalog.TIMING_KINDS), (
            builder.name
        )


# ----------------------------------------------------------------------------------------- a toy builder

TOY_MODULE = '''
from ddtree_bench.builders.reference import ReferenceBuilder


class ToyBuilder(ReferenceBuilder):
    """reference's trees under another name (the catalog's toy entry)."""

    def __init__(self, scale=1):
        super().__init__()
        self.name, self.label, self.scale = "toy", "toy", scale
'''

TOY_ENTRY = """
from ddtree_bench import catalog

catalog.BUILDERS["toy"] = catalog.Builder(
    "toy",
    "toy_builder:ToyBuilder",
    catalog.CPU,
    "toy (a test's builder)",
    ("#000000", "x", "-"),
    (catalog.Series(catalog.WALL, "toy (wall)", catalog.WALL_CLOCK, "toy (wall)"),),
    (catalog.Series(catalog.IN_SITU, "toy in-situ", catalog.IN_SITU_KIND, "toy in-situ", ("n/a",)),),
    catalog.PAGEABLE,
    options={"scale": 2},
)
"""

TOY_CHECKS = """
import numpy as np

from ddtree_bench.builders import BUILDER_NAMES, get_builder
from ddtree_bench.config import check_config, read_config_file

assert "toy" in BUILDER_NAMES
toy = get_builder("toy")
assert toy.scale == 2 and type(toy).__name__ == "ToyBuilder"
rng = np.random.default_rng(0)
lp = -np.sort(np.abs(rng.standard_normal((2, 4, 8))), axis=-1).astype(np.float32) - 0.1
ids = np.tile(np.arange(8, dtype=np.int64), (2, 4, 1))
assert (toy.build(lp, ids, 8).node_count == get_builder("reference").build(lp, ids, 8).node_count).all()

config = read_config_file("config/smoke.yaml")
config["builders"] = ["reference", "toy"]
assert check_config(config)["builders"] == ["reference", "toy"]

from ddtree_bench.report import names
from ddtree_bench.summary import step
from ddtree_bench import throughput

assert names.SERIES_NAMES[("toy", "wall")] == "toy (wall)"
assert ("toy", "toy (a test's builder)", "wall", "wall clock") in throughput.BUILDERS
assert "toy" in throughput.CPU_BUILDERS and "toy" in names.CPU_BUILDERS
assert names.BUILDER_STYLES["toy"] == ("#000000", "x", "-") and names.PER_CALL_TIMING["toy"] == "wall"
assert ("toy in-situ", "toy", "toy (a test's builder)") in names.IN_SITU_COLUMNS
assert ("toy", "wall", ("n/a", "warm"), "toy (wall)") in step.BUILD_SERIES
print("toy ok")
"""


@needs_snakemake
def test_a_toy_builder_is_one_catalog_entry_plus_its_module(tmp_path):
    env = catalog_entry_environment(tmp_path, TOY_ENTRY, {"toy_builder": TOY_MODULE})
    result = subprocess.run(
        [sys.executable, "-c", TOY_CHECKS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "toy ok" in result.stdout, result.stdout + result.stderr

    # the workflow plans its check and timing jobs, with nothing but the catalog entry and the module added
    work = workdir_copy(tmp_path)
    config = yaml.safe_load((work / "config" / "smoke.yaml").read_text())
    config.update(builders=["reference", "toy"], gpu="off")
    (work / "config" / "toy.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(work, "-n", "--cores", "1", "--configfile", "config/toy.yaml", "--", "report", env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "/check/toy/" in result.stdout and "/bench/toy/" in result.stdout


# ----------------------------------------------------------------------------------------- a toy figure


def test_a_toy_figure_is_drawn_and_shown(tmp_path, monkeypatch):
    from ddtree_bench.report import ReportFiles, render_report  # noqa: PLC0415
    from ddtree_bench.report.figures import empty_figure  # noqa: PLC0415
    from ddtree_bench.stages.build import unavailable_frame  # noqa: PLC0415
    from ddtree_bench.summary.build import summarize  # noqa: PLC0415

    drawn = []

    def draw(inputs, path):
        drawn.append([m.label for m in inputs.machines])
        empty_figure(path, "a toy")
        return "Drawn for every machine."

    module = types.ModuleType("toy_figure")
    module.draw = draw
    monkeypatch.setitem(sys.modules, "toy_figure", module)
    monkeypatch.setitem(
        catalog.FIGURES, "toy", catalog.Figure("toy", "A toy figure", "One panel.", "toy_figure:draw")
    )

    folder = tmp_path / "m"
    folder.mkdir()
    summarize(unavailable_frame("gpu", "no CUDA device", machine="m")).to_parquet(folder / "summary.parquet")
    (folder / "environment.json").write_text(json.dumps({"machine": "m"}))
    out = tmp_path / "r"
    render_report(summary=folder / "summary.parquet", files=ReportFiles.in_folder(out))

    assert drawn == [["m"]]
    assert (out / "figures" / "toy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (out / "summary.md").read_text()
    assert "A toy figure" in markdown and "![toy](figures/toy.png)" in markdown
    assert "One panel. Drawn for every machine." in markdown
    page = (out / "index.html").read_text()
    assert '<img alt="toy"' in page and page.count("data:image/png;base64,") == len(catalog.FIGURES)
