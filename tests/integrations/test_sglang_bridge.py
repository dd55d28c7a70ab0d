"""The bridge from a live SGLang DDTree service (``ddtree_bench.integrations.sglang.service``), on the CPU.

record: a fake worker module that imported SGLang's function by name (the function loaded from a file, as
the ``sglang`` builder's ``source`` option loads it) calls it per request; the recording's trace must load as
a recorded trace and give the same trees with every CPU builder. profile: a log in the format SGLang's
``DFlashWorkerV2._profile_finish`` prints (dflash_worker_v2.py: ``logger.info("%s: %s", prefix, parts)``).
"""

from __future__ import annotations

import copy
import io
import logging
import sys
import types

import numpy as np
import pytest
import yaml
from builders.test_sglang import make_fake_torch, write_stand_in
from conftest import make_topk
from workflow_copy import ROOT

from ddtree_bench.builders import get_builder
from ddtree_bench.cli import main
from ddtree_bench.config import check_config
from ddtree_bench.integrations.sglang import service as bridge
from ddtree_bench.settings import Settings
from ddtree_bench.throughput import RoundAssumptions
from ddtree_bench.traces import check_trace_file, import_recorded, load_trace
from ddtree_bench.tree import first_difference

# The worker's decode round, as far as the tree build goes: one call per request, through the name the
# module imported (a global lookup in the module's namespace, which is what ``record`` replaces).
WORKER_ROUND = """
def ddtree_round(top_log_probs, top_token_ids, tree_budget, workspace):
    outputs = []
    for req_idx in range(top_log_probs.shape[0]):
        outputs.append(
            build_ddtree_tree_from_topk(
                top_log_probs[req_idx], top_token_ids[req_idx], tree_budget, workspace=workspace
            )
        )
    return outputs
"""


def fake_worker(function, name="fake_dflash_ddtree_worker") -> types.ModuleType:
    """A module that did ``from ...dflash_ddtree_utils import build_ddtree_tree_from_topk``."""
    worker = types.ModuleType(name)
    worker.build_ddtree_tree_from_topk = function
    exec(WORKER_ROUND, worker.__dict__)
    return worker


@pytest.fixture(params=["fake", "real"])
def torch_module(request, monkeypatch):
    """The fake torch of the builder tests (torch-free), or real torch where installed."""
    if request.param == "fake":
        fake = make_fake_torch()
        monkeypatch.setitem(sys.modules, "torch", fake)
        return fake
    return pytest.importorskip("torch", reason="torch is not installed (the fake-torch case still runs)")


def test_recorded_rounds_build_the_same_trees_with_every_cpu_builder(
    torch_module, tmp_path, native_library, monkeypatch
):
    source = write_stand_in(tmp_path / "sglang" / "dflash_ddtree_utils.py")
    sglang = get_builder("sglang", source=source)
    assert sglang.unavailable_reason() is None
    function = sglang.function
    worker = fake_worker(function)
    stand_in = sys.modules[function.__module__]
    workspace = stand_in.DFlashDDTreeBuildWorkspace()
    lp, ids, budget = *make_topk("bf16", 7, 8, 12, seed=5), 12  # L = 8, K = N = 12, bf16 ties
    rounds = [(lp[r : r + 1], ids[r : r + 1]) for r in range(len(lp))]

    path = tmp_path / "recorded.npz"
    with bridge.record(worker, path, max_rounds=64) as recording:
        assert worker.build_ddtree_tree_from_topk is not function
        assert worker.build_ddtree_tree_from_topk.__wrapped__ is function
        for round_lp, round_ids in rounds:
            outputs = worker.ddtree_round(
                torch_module.from_numpy(round_lp), torch_module.from_numpy(round_ids), budget, workspace
            )
            direct = function(
                torch_module.from_numpy(round_lp[0]), torch_module.from_numpy(round_ids[0]), budget
            )
            assert outputs[0][2] == direct[2] and outputs[0][3] == direct[3]  # the original's result
        assert stand_in.CALLS.count(workspace) == len(rounds)  # the workspace went through unchanged
    assert worker.build_ddtree_tree_from_topk is function  # restored
    assert recording.kept == recording.calls == 7 and not any(recording.skipped.values())
    assert recording.summary().startswith(
        "7 calls to fake_dflash_ddtree_worker.build_ddtree_tree_from_topk: kept 7 of L = 8, K = 12, budget 12"
    )

    assert check_trace_file(path) == (7, 8, 12)
    trace = load_trace(path)
    assert np.array_equal(trace.top_log_probs, lp) and np.array_equal(trace.top_token_ids, ids)
    meta = trace.metadata
    assert meta["distribution"] == "recorded" and meta["kept"] == 7 and meta["calls"] == 7
    assert meta["budget"] == 12 and meta["skipped_cap"] == 0 and meta["summary"] == recording.summary()
    # the pipeline's route: the recorded_trace key, checked with the config, then imported per depth
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config.update(
        distributions=["recorded"],
        recorded_trace=str(path),
        budgets=[12],
        depths=[8],
        topk=12,
        batch_sizes=[1, 4],
    )
    config["step"].update(batch_sizes=None, budgets=None)
    check_config(config)
    imported = import_recorded(path, tmp_path / "imported.npz", depth=8, topk=12, requests=4)

    tl, ti = imported.top_log_probs, imported.top_token_ids
    expected = get_builder("reference").build(tl, ti, budget)
    builders = {
        "native": get_builder("native", library=native_library),
        "native-mt": get_builder("native-mt", library=native_library),
        "sglang": sglang,
    }
    for name, builder in builders.items():
        diff = first_difference(expected, builder.build(tl, ti, budget))
        assert diff is None, f"{name}: {diff}"


def spy(result="tree"):
    calls = []

    def build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget, workspace=None):
        calls.append((top_log_probs, budget, workspace))
        return result

    build_ddtree_tree_from_topk.calls = calls
    return build_ddtree_tree_from_topk


def test_the_result_is_returned_unchanged_and_by_name(tmp_path, monkeypatch):
    """Torch-free: numpy inputs, a module given by its dotted name."""
    sentinel = object()
    function = spy(sentinel)
    worker = fake_worker(function, "fake_pkg_worker")
    monkeypatch.setitem(sys.modules, "fake_pkg_worker", worker)
    lp, ids = make_topk("uniform", 2, 4, 5)
    recording = bridge.record("fake_pkg_worker", tmp_path / "r.npz", max_rounds=10)
    first = lp[0]
    assert worker.build_ddtree_tree_from_topk(first, ids[0], 5) is sentinel
    assert worker.build_ddtree_tree_from_topk(lp[1], ids[1], budget=5, workspace="ws") is sentinel
    assert function.calls[1][2] == "ws" and function.calls[0][0] is first  # the same objects passed on
    assert recording.close() == tmp_path / "r.npz"
    assert recording.close() == tmp_path / "r.npz"  # a second close does nothing
    assert worker.build_ddtree_tree_from_topk is function
    assert np.array_equal(load_trace(tmp_path / "r.npz").top_log_probs, lp)


def test_caps_and_other_calls_are_counted_never_dropped_silently(tmp_path):
    function = spy()
    worker = fake_worker(function)
    lp, ids = make_topk("peaked", 8, 4, 5, seed=1)
    path = tmp_path / "capped.npz"
    recording = bridge.record(worker, path, max_rounds=3)
    call = worker.build_ddtree_tree_from_topk
    call(lp[0], ids[0], 5)  # fixes L = 4, K = 5, budget 5
    call(lp[1][:1], ids[1][:1], 5)  # another L (the worker's DDTREE_FORCE_STAR call): skipped
    call(lp[1][:, :4], ids[1][:, :4], 5)  # another K: skipped
    call(lp[1], ids[1], 6)  # another budget: skipped
    bad = lp[2].copy()
    bad[1, 2] = np.nan
    call(bad, ids[2], 5)  # a value no trace holds: skipped
    call(lp[3], ids[3], 5)
    assert not path.exists()
    call(lp[4], ids[4], 5)  # the third kept row: the cap is reached, the file written now
    assert path.exists() and load_trace(path).metadata["kept"] == 3
    for r in (5, 6, 7):
        call(lp[r], ids[r], 5)
    assert len(function.calls) == 10  # every call reached the original
    assert recording.calls == 10 and recording.kept == 3
    assert recording.skipped == {"shape": 2, "budget": 1, "invalid": 1, "cap": 3}
    assert recording.summary() == (
        "10 calls to fake_dflash_ddtree_worker.build_ddtree_tree_from_topk: kept 3 of L = 4, K = 5, budget "
        "5, skipped 7 (2 shape, 1 budget, 1 invalid, 3 cap); caps: max_rounds 3, max_bytes 268435456"
    )
    recording.close()
    trace = load_trace(path)
    assert np.array_equal(trace.top_log_probs, lp[[0, 3, 4]])
    meta = trace.metadata
    assert (meta["calls"], meta["kept"], meta["skipped_shape"], meta["skipped_budget"]) == (10, 3, 2, 1)
    assert (meta["skipped_invalid"], meta["skipped_cap"], meta["max_rounds"]) == (1, 3, 3)


def test_a_byte_cap_and_a_recording_that_kept_nothing(tmp_path):
    lp, ids = make_topk("uniform", 4, 4, 5)  # 4 x 5 x 12 = 240 bytes a row
    worker = fake_worker(spy())
    recording = bridge.record(worker, tmp_path / "b.npz", max_rounds=None, max_bytes=500)
    for r in range(4):
        worker.build_ddtree_tree_from_topk(lp[r], ids[r], 5)
    assert (recording.kept, recording.skipped["cap"], recording.capacity) == (2, 2, 2)
    recording.close()
    assert load_trace(tmp_path / "b.npz").requests == 2

    original = spy()
    worker = fake_worker(original)
    empty = bridge.record(worker, tmp_path / "none.npz", max_bytes=100)  # less than one row
    worker.build_ddtree_tree_from_topk(lp[0], ids[0], 5)
    with pytest.raises(ValueError, match=r"^record: nothing written to .*none\.npz: 1 calls .*kept 0.*1 cap"):
        empty.close()
    assert not (tmp_path / "none.npz").exists() and worker.build_ddtree_tree_from_topk is original


def test_bad_use_is_one_clear_value_error(tmp_path, monkeypatch):
    worker = fake_worker(spy())
    without = types.ModuleType("no_function_here")
    cases = [
        (lambda: bridge.record(without, tmp_path / "x.npz"), "module 'no_function_here' has no function"),
        (lambda: bridge.record("no.such.module_here", tmp_path / "x.npz"), "cannot import module 'no.such"),
        (lambda: bridge.record(42, tmp_path / "x.npz"), "record needs a module or a dotted module name"),
        (lambda: bridge.record(worker, tmp_path), "record: path"),  # a folder
        (lambda: bridge.record(worker, tmp_path / "f.txt" / "x.npz"), "record: path"),  # under a file
        (lambda: bridge.record(worker, tmp_path / "x.npz", max_rounds=0), "max_rounds must be an integer"),
        (
            lambda: bridge.record(worker, tmp_path / "x.npz", max_rounds=None, max_bytes=None),
            "record needs a cap",
        ),
    ]
    (tmp_path / "f.txt").write_text("a file")
    for call, message in cases:
        with pytest.raises(ValueError) as error:
            call()
        assert str(error.value).startswith(message) and "\n" not in str(error.value), str(error.value)
    first = bridge.record(worker, tmp_path / "x.npz")
    with pytest.raises(ValueError, match=r"already wrapped by a recording to .*x\.npz; close it first"):
        bridge.record(worker, tmp_path / "y.npz")
    first.closed = True  # (closing would need a kept row) the wrapper is still in place: still refused
    with pytest.raises(ValueError, match="already wrapped"):
        bridge.record(worker, tmp_path / "y.npz")


# ----------------------------------------------------------------------------------------------- profile

STAGES = (
    "draft_prepare", "draft_forward", "draft_topk", "tree_build_cpu", "tree_tensors", "verify_prepare",
    "target_verify", "tree_accept", "mamba_update", "draft_kv_append", "total",
)  # fmt: skip


def profile_line(label: str, every: int, sums: dict, commit_lens=None) -> str:
    """The message of ``DFlashWorkerV2._profile_finish``: the prefix, then sorted ``key=avg.3fms`` parts."""
    prefix = f"{label} profile avg over {every} verify steps"
    if commit_lens is not None:
        prefix += f", last_commit_lens={commit_lens}"
    parts = [f"{key}={sums[key] / every:.3f}ms" for key in sorted(sums)]
    return "%s: %s" % (prefix, ", ".join(parts))  # noqa: UP031 (the worker's logger.info arguments)


def write_log(path, windows) -> None:
    """A log as SGLang's scheduler process writes it: its logging prefix, then the message."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("[%(asctime)s TP0] %(message)s"))
    logger = logging.getLogger("sglang.srt.speculative.dflash_worker_v2.test")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        logger.info("Load weight end. type=KimiK25ForConditionalGeneration")
        for label, every, sums, commits in windows:
            logger.info(profile_line(label, every, sums, commits))
            logger.info("Decode batch. #running-req: 1, #token: 5120, accept len: 4.12")
    finally:
        logger.removeHandler(handler)
    path.write_text(stream.getvalue())


# window means in ms per stage (three windows of 32 rounds; a linear-DFlash line that must be ignored)
MEANS = [
    {"draft_prepare": 0.2, "draft_forward": 3.0, "draft_topk": 0.5, "target_verify": 20.0, "total": 30.0},
    {"draft_prepare": 0.4, "draft_forward": 2.0, "draft_topk": 0.7, "target_verify": 24.0, "total": 34.0},
    {"draft_prepare": 0.3, "draft_forward": 5.0, "draft_topk": 0.6, "target_verify": 22.0, "total": 31.0},
]


def windows():
    rows = []
    for i, means in enumerate(MEANS):
        full = {stage: means.get(stage, 0.1 * (i + 1)) for stage in STAGES}
        rows.append(("DDTREE", 32, {k: v * 32 for k, v in full.items()}, [3 + i]))
    rows.insert(1, ("DFLASH", 32, {"draft_forward": 99.0 * 32, "total": 999.0 * 32}, None))
    return rows


def test_a_profile_log_gives_the_stage_medians_and_the_fragment(tmp_path):
    log = tmp_path / "server.log"
    write_log(log, windows())
    profile = bridge.parse_profile_log(log)
    assert (profile.label, profile.windows, profile.rounds) == ("DDTREE", 3, 96)
    assert set(profile.medians) == set(STAGES)
    assert profile.medians["draft_prepare"] == pytest.approx(0.3)
    assert profile.medians["draft_forward"] == pytest.approx(3.0)
    assert profile.medians["draft_topk"] == pytest.approx(0.6)
    assert profile.medians["target_verify"] == pytest.approx(22.0)
    assert profile.medians["tree_build_cpu"] == pytest.approx(0.2)
    assert profile.commit_lens == ((3,), (4,), (5,))
    assert bridge.parse_profile_log(log.read_text()).medians == profile.medians  # the text itself
    dflash = bridge.parse_profile_log(log, label="DFLASH")
    assert dflash.windows == 1 and dflash.medians["draft_forward"] == pytest.approx(99.0)

    fragment = bridge.budget_fragment(profile)
    assert fragment == {"throughput": {"draft_ms": 3.9, "forward_ms": 22.0}}
    text = bridge.fragment_yaml(profile)
    assert yaml.safe_load(text) == fragment
    assert "#   tree_build_cpu        0.200 ms  the model's own build term" in text
    assert "#   verify_prepare        0.200 ms  not in the model" in text
    assert "# last_commit_lens: 3 samples (one round per window), mean 4.00 tokens" in text
    # the fragment is a valid throughput section, and the model takes its terms as entered
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["throughput"].update(copy.deepcopy(fragment["throughput"]))
    model = RoundAssumptions.from_options(Settings.from_config(config).throughput_options(), 61)
    assert (model.draft_ms, model.forward_ms) == (3.9, 22.0)


def test_profile_problems_are_one_line_value_errors(tmp_path):
    with pytest.raises(ValueError, match=r"nowhere\.log: file not found$"):
        bridge.parse_profile_log(tmp_path / "nowhere.log")
    plain = tmp_path / "plain.log"
    plain.write_text("[TP0] Decode batch. #running-req: 1\n")
    with pytest.raises(ValueError, match=r"plain\.log: no DDTREE profile lines .*DFLASH_PROFILE_VERIFY=1$"):
        bridge.parse_profile_log(plain)
    broken = tmp_path / "broken.log"
    broken.write_text("x\nDDTREE profile avg over 32 verify steps: draft_forward=1.000ms, total=oops\n")
    with pytest.raises(ValueError, match=r"broken\.log: line 2: .* not key=<ms>ms: 'total=oops'$"):
        bridge.parse_profile_log(broken)
    partial = tmp_path / "partial.log"
    partial.write_text("DDTREE profile avg over 32 verify steps: draft_forward=1.000ms, total=2.000ms\n")
    with pytest.raises(ValueError, match="has no draft_prepare, draft_topk stage$"):
        bridge.budget_fragment(bridge.parse_profile_log(partial))


def test_cli_sglang_profile_writes_the_fragment_and_refuses_bad_input(tmp_path, capsys):
    log = tmp_path / "server.log"
    write_log(log, windows())
    out = tmp_path / "fragment.yaml"
    assert main(["sglang-profile", str(log), "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text()) == {"throughput": {"draft_ms": 3.9, "forward_ms": 22.0}}
    assert "wrote" in capsys.readouterr().out
    plain = tmp_path / "plain.log"
    plain.write_text("nothing to see\n")
    for args in ([str(tmp_path / "missing.log")], [str(plain)]):
        target = tmp_path / "never.yaml"
        assert main(["sglang-profile", *args, "-o", str(target)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("ddtree-bench: error: "), err
        assert not target.exists()


def test_cli_budget_takes_the_fragment(tmp_path):
    """The fragment on the published H200 results without their forward rows: the forward is the entered
    term (the published set measured every forward that fits, so there the measured ones come first)."""
    import shutil  # noqa: PLC0415

    import pandas as pd  # noqa: PLC0415

    source = ROOT / "results" / "published" / "h200"
    if not (source / "summary.parquet").is_file():
        pytest.skip(f"{source} has no summary.parquet")
    published = tmp_path / "h200"
    published.mkdir()
    for name in ("summary.parquet", "tree_shape.parquet", "environment.json"):
        shutil.copy(source / name, published / name)
    step = pd.read_parquet(source / "step_summary.parquet")
    step[step["stage"] != "forward"].to_parquet(published / "step_summary.parquet")
    log = tmp_path / "server.log"
    write_log(log, windows())
    fragment = tmp_path / "fragment.yaml"
    assert main(["sglang-profile", str(log), "-o", str(fragment)]) == 0
    import subprocess  # noqa: PLC0415

    done = subprocess.run(
        [sys.executable, "-m", "ddtree_bench.cli", "budget", str(published), "--configfile", str(fragment)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "forward 22 ms where not measured (communication in it)" in done.stdout
    assert "| target forward | entered" in done.stdout
