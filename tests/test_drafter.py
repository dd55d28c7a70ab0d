"""The drafter distribution, its calibration and the simulated acceptance."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from ddtree_bench.acceptance import expected_accepted_tokens
from ddtree_bench.builders import get_builder
from ddtree_bench.calibrate import (
    PAPER_CHAIN,
    PAPER_TAU,
    Evaluator,
    FitOptions,
    check_chain,
    fit,
    fragment_yaml,
    nelder_mead,
    parse_tau_pairs,
)
from ddtree_bench.cli import main
from ddtree_bench.config import check_config
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.drafter import DrafterParams, check_params, row_probabilities, top1_probabilities
from ddtree_bench.io import write_json
from ddtree_bench.report import acceptance as acceptance_report
from ddtree_bench.report.acceptance import acceptance_targets
from ddtree_bench.summary.build import (
    chain_tau_mean,
    combine_shapes,
    expected_accept_stats,
    simulated_accept_stats,
    tree_shape,
)
from ddtree_bench.traces import TraceSpec, generate, load_trace, save_trace
from ddtree_bench.validation import check_topk_arrays

GPU_REASON = cuda.gpu_unavailable_reason()


def drafter(requests=8, depth=6, topk=32, vocab=4096, seed=0, bf16=False, params=None):
    name = "drafter-bf16" if bf16 else "drafter"
    return generate(TraceSpec(name, requests, depth, topk, vocab, seed), "cpu", drafter=params)


# ----------------------------------------------------------------------------------------- the distribution


@pytest.mark.parametrize("bf16", [False, True])
def test_valid_canonical_and_deterministic(bf16):
    trace = drafter(bf16=bf16)
    lp, ids = trace.top_log_probs, trace.top_token_ids
    assert lp.shape == ids.shape == (8, 6, 32)
    check_topk_arrays(lp, ids)  # finite, <= 0, sorted descending, ids >= 0
    assert (ids < 4096).all()
    for row in ids.reshape(-1, 32):
        assert len(set(row.tolist())) == 32
    # equal values by increasing id (the other traces' canonical order)
    same = lp[..., 1:] == lp[..., :-1]
    assert (ids[..., 1:][same] > ids[..., :-1][same]).all()
    if bf16:
        assert same.any()  # rounding to bfloat16 makes ties
    again = drafter(bf16=bf16)
    np.testing.assert_array_equal(again.top_log_probs, lp)
    np.testing.assert_array_equal(again.top_token_ids, ids)
    other = drafter(bf16=bf16, seed=1)
    assert not np.array_equal(other.top_log_probs, lp)
    # the first b requests equal a trace of b requests
    head = drafter(requests=3, bf16=bf16)
    np.testing.assert_array_equal(head.top_log_probs, lp[:3])
    assert trace.metadata["distribution"] == ("drafter-bf16" if bf16 else "drafter")
    assert trace.metadata["drafter_alt_ranks"] == DrafterParams().alt_ranks


def test_rows_are_a_proper_log_softmax_over_the_vocabulary():
    params = DrafterParams()
    p1 = np.array([0.99, 0.6, 0.2, 0.05])
    full = row_probabilities(params, p1, 64, 64)  # K = V: the whole row
    np.testing.assert_allclose(full.sum(axis=1), 1.0, rtol=1e-12)
    assert (np.diff(full, axis=1) <= 0).all()
    params = DrafterParams(alt_ratio=0.5)  # alternatives above the tail's tokens, so first after the top-1
    big = row_probabilities(params, p1, 32, 163840)
    # the alternatives hold alt_mass of what the top-1 leaves; the shown tail is tiny
    rest = 1 - p1
    shown_alts = big[:, : 1 + params.alt_ranks].sum(axis=1)
    np.testing.assert_allclose(shown_alts, p1 + params.alt_mass * rest, rtol=1e-9)
    assert big[:, 1 + params.alt_ranks :].max() < 1e-5


def test_top1_decays_along_the_block_and_mixes_two_kinds():
    params = DrafterParams(top1_spread=0.0)
    lp = drafter(requests=200, depth=15, params=params.as_dict()).top_log_probs
    top1 = np.exp(lp[:, :, 0].astype(np.float64))
    # two kinds of blocks: first-position top-1 takes exactly two values
    kinds = np.unique(np.round(top1[:, 0], 5))
    assert kinds.size == 2
    confident = np.isclose(top1[:, 0], params.confident_top1, atol=1e-5)
    assert 0.3 < confident.mean() < 0.8
    # the designated top-1 decays along the block; a row's largest probability is the larger of it and the
    # first alternative's share of what it leaves
    p1 = top1_probabilities(params, confident, np.zeros((200, 15)))
    assert (np.diff(p1, axis=1) < 0).all()
    alt1 = params.alt_mass * (1 - p1) * (1 - params.alt_ratio) / (1 - params.alt_ratio**params.alt_ranks)
    np.testing.assert_allclose(top1, np.maximum(p1, alt1), rtol=1e-6)


def test_every_builder_builds_the_same_trees(native_library):
    trace = drafter(requests=6, depth=8, topk=64, bf16=True)
    lp, ids = trace.top_log_probs, trace.top_token_ids
    ref = get_builder("reference").build(lp, ids, 64)
    native = get_builder("native", library=native_library).build(lp, ids, 64)
    for name in ("node_count", "node_token_ids", "node_depths", "parents"):
        np.testing.assert_array_equal(getattr(native, name), getattr(ref, name))


@pytest.mark.parametrize(
    ("params", "problem", "config_problem"),
    [
        (
            {"alt_mass": 1.5},
            r"drafter\.alt_mass: must be in \[0, 1\], got 1\.5",
            r"drafter\.alt_mass: 1\.5 is greater than the maximum of 1",
        ),
        (
            {"confident_top1": 1.0},
            r"drafter\.confident_top1: must be in \(0, 1\)",
            r"drafter\.confident_top1: 1\.0 is greater than or equal to the maximum of 1",
        ),
        (
            {"alt_ranks": 0},
            r"drafter\.alt_ranks: must be an integer >= 1",
            r"drafter\.alt_ranks: 0 is less than the minimum of 1",
        ),
        (
            {"uncertain_decay": "x"},
            r"drafter\.uncertain_decay: must be a finite number",
            r"drafter\.uncertain_decay: 'x' is not of type 'number'",
        ),
        (
            {"bogus": 1},
            r"drafter: unknown parameter\(s\) bogus",
            r"drafter: Additional properties are not allowed \('bogus' was unexpected\)",
        ),
    ],
)
def test_bad_parameters_one_line(params, problem, config_problem):
    with pytest.raises(ValueError, match=problem):
        check_params(params)
    config = {
        "budgets": [4],
        "batch_sizes": [1],
        "depths": [4],
        "distributions": ["drafter"],
        "builders": ["reference"],
        "drafter": params,
    }
    with pytest.raises(ValueError, match="^config: " + config_problem) as info:
        check_config(config)
    assert "\n" not in str(info.value)


def test_config_defaults_fill_the_drafter_mapping():
    config = check_config(
        {
            "budgets": [4],
            "batch_sizes": [1],
            "depths": [4],
            "distributions": ["drafter"],
            "builders": ["reference"],
        }
    )
    assert check_params(config["drafter"]) == DrafterParams()


# ----------------------------------------------------------------------------------------- calibration


@pytest.mark.parametrize(
    ("pairs", "problem"),
    [
        (["16:0.5"], "below 1"),
        (["16:9", "32:20"], "above depth \\+ 1 = 16"),
        (["16:9", "32:8.5"], "decreases with the budget"),
        (["16=9"], "malformed pair"),
        (["x:9"], "malformed pair"),
        (["16:9", "16:9.5"], "given twice"),
        (["4:10"], "tau at budget 4 is 10, above N \\+ 1 = 5: a tree of 4 nodes verifies at most 5 tokens"),
        (["1:2.5", "16:9"], "tau at budget 1 is 2.5, above N \\+ 1 = 2"),
    ],
)
def test_bad_tau_pairs(pairs, problem, tmp_path, capsys):
    with pytest.raises(ValueError, match=problem):
        parse_tau_pairs(pairs, 15)
    out = tmp_path / "fit.yaml"
    assert main(["calibrate", "--tau", *pairs, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem.replace("\\", "") in err
    assert not out.exists()


def test_bad_chain_is_refused(tmp_path, capsys):
    out = tmp_path / "fit.yaml"
    assert main(["calibrate", "--tau", "16:9", "--chain", "0.5", "-o", str(out)]) == 2
    assert "--chain is 0.5, below 1" in capsys.readouterr().err
    assert not out.exists()


def test_a_budget_given_twice_across_tau_options_is_refused(tmp_path, capsys):
    """Before: ``--tau 16:8.6 --tau 16:9`` kept only the last option's pairs."""
    out = tmp_path / "fit.yaml"
    assert main(["calibrate", "--tau", "16:8.6", "32:9", "--tau", "16:9", "-o", str(out)]) == 2
    assert capsys.readouterr().err.strip() == "ddtree-bench: error: calibrate: budget 16 is given twice"
    assert not out.exists()


def test_a_chain_above_the_trees_tau_at_the_same_depth_is_refused(tmp_path, capsys):
    """The chain is a tree of ``depth`` nodes: the best tree of N >= depth nodes accepts at least as much."""
    out = tmp_path / "fit.yaml"
    assert main(["calibrate", "--tau", "16:8.61", "32:9.27", "--chain", "8.7", "-o", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        "ddtree-bench: error: calibrate: --chain 8.7 is above the tree's tau 8.61 at budget 16"
    )
    assert line.endswith("(--chain at most 8.61)") and not out.exists()
    assert check_chain(7.79, {16: 8.61, 32: 9.27}, 15) == 7.79
    assert check_chain(9.0, {8: 5.0, 16: 9.5}, 15) == 9.0  # budget 8 < depth 15: no bound from it


def test_nelder_mead_finds_a_quadratic_minimum():
    x, value, _ = nelder_mead(
        lambda x: float(((x - np.array([1.0, -2.0])) ** 2).sum()), [0.0, 0.0], iterations=200
    )
    np.testing.assert_allclose(x, [1.0, -2.0], atol=1e-3)
    assert value < 1e-6


def test_fit_recovers_a_synthetic_curve(tmp_path):
    """A curve made by known parameters is fitted back within 3 % (small: a few seconds)."""
    truth = DrafterParams(confident_fraction=0.4, uncertain_top1=0.6, alt_mass=0.8, alt_ratio=0.5)
    evaluate = Evaluator((4, 8, 16, 32), depth=8, requests=48, vocab_size=4096, seed=3)
    taus, chain = evaluate(truth)
    start, _ = evaluate(DrafterParams())
    assert max(abs(start[n] / taus[n] - 1) for n in taus) > 0.1  # the fit has ground to cover
    options = FitOptions(depth=8, requests=48, vocab_size=4096, iterations=60, restarts=1, seed=3)
    result = fit(taus, chain=chain, options=options)
    assert result.worst() <= 0.03, (result.residuals(), result.chain_residual())
    text = fragment_yaml(result)
    mapping = yaml.safe_load(text)["drafter"]
    assert check_params(mapping) == check_params(mapping)  # a valid mapping
    assert (
        check_config(
            {
                "budgets": [4],
                "batch_sizes": [1],
                "depths": [4],
                "distributions": ["drafter"],
                "builders": ["reference"],
                "drafter": mapping,
            }
        )["drafter"]
        == mapping
    )


def test_calibrate_cli_writes_a_config_fragment(tmp_path, capsys):
    out = tmp_path / "fit.yaml"
    args = ["calibrate", "--tau", "4:4.0", "8:4.6", "--chain", "3.8", "--depth", "6"]
    args += ["--requests", "16", "--iterations", "10", "--vocab-size", "1024", "-o", str(out)]
    assert main(args) == 0
    assert "worst residual" in capsys.readouterr().out
    mapping = yaml.safe_load(out.read_text())["drafter"]
    check_params(mapping)
    assert "#   chain" in out.read_text()


# ----------------------------------------------------------------------------------------- simulated accept


def test_simulated_mean_agrees_with_the_expected(tmp_path):
    """Drafter equals target: the walk's mean tokens per round is 1 + the expected acceptance, within 4
    standard errors (fixed seeds)."""
    trace = drafter(requests=400, depth=10, topk=32, vocab=8192)
    lp, ids = trace.top_log_probs, trace.top_token_ids
    for budget in (1, 8, 32):
        trees = get_builder("reference").build(lp, ids, budget)
        expected = 1.0 + expected_accept_stats(lp, ids, trees)["expected_accept_mean"]
        sim = simulated_accept_stats(lp, ids, trees, seed=budget, gpu=False)
        assert sim["simulated_tau_se"] > 0
        assert abs(sim["simulated_tau_mean"] - expected) <= 4 * sim["simulated_tau_se"], (
            budget,
            sim,
            expected,
        )
        hist = sim["simulated_accept_hist"]
        assert len(hist) == 12 and sum(hist) == 400 and hist[0] == 0
        assert sum(k * c for k, c in enumerate(hist)) / 400 == pytest.approx(sim["simulated_tau_mean"])


def test_tree_shape_records_simulated_and_paper_depth_tau(tmp_path):
    trace = drafter(requests=16, depth=16, topk=16, vocab=4096)
    path = tmp_path / "t.npz"
    save_trace(path, trace.top_log_probs, trace.top_token_ids, **trace.metadata)
    records = tree_shape(path, 16)
    first = records[0]
    assert first["distribution"] == "drafter"
    assert 1.0 <= first["simulated_tau_mean"] <= 17.0
    assert len(first["simulated_accept_hist"]) == 18
    assert 1.0 < first["paper_depth_tau_mean"] <= 1.0 + first["expected_accept_mean"] + 1e-9
    assert load_trace(path).metadata["drafter_alt_mass"] == DrafterParams().alt_mass


@pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")
def test_gpu_accept_kernel_agrees_on_the_simulated_draws():
    trace = drafter(requests=64, depth=16, topk=256, vocab=163840)
    lp, ids = trace.top_log_probs, trace.top_token_ids
    for budget in (8, 256):
        trees = get_builder("reference").build(lp, ids, budget)
        assert simulated_accept_stats(lp, ids, trees, seed=budget)["simulated_gpu_agrees"] is True


def test_acceptance_report_table_and_figures(tmp_path):
    trace = drafter(requests=32, depth=16, topk=32, vocab=4096)
    path = tmp_path / "t.npz"
    save_trace(path, trace.top_log_probs, trace.top_token_ids, **trace.metadata)
    files = []
    for budget in (16, 32):
        files.append(tmp_path / f"s{budget}.json")
        write_json(tree_shape(path, budget), files[-1])
    machine = SimpleNamespace(label="here", shapes=combine_shapes(files))
    table = acceptance_report.tau_table([machine])
    assert list(table["N"]) == [16, 32]
    assert list(table["paper tau (Fig. 3)"]) == ["8.61", "9.27"]
    assert table["vs paper"].str.endswith("%").all()
    for name, maker in (
        ("tau", acceptance_report.figure_tau),
        ("hist", lambda ms, p: acceptance_report.figure_histogram(ms, p, "drafter", 16)),
    ):
        out = tmp_path / f"{name}.png"
        assert "paper" in maker([machine], out)
        assert out.stat().st_size > 1000
    np.testing.assert_allclose(acceptance_report.survival([0, 2, 1, 1]), [1.0, 0.5, 0.25])


def test_defaults_reproduce_the_paper_within_3_percent(native_library):
    """The pipeline's drafter trace (256 requests, seed 0, K = 1024), its first 15 positions (the paper's
    block 16): expected tau within 3 % of Fig. 3 at every budget, the top-1 chain within 3 % of 7.79."""
    trace = generate(TraceSpec("drafter", 256, 15, 1024, 163840, 0), "cpu")
    lp, ids = trace.top_log_probs, trace.top_token_ids
    builder = get_builder("native", library=native_library, validate=False)
    for budget, paper in PAPER_TAU.items():
        sub_lp, sub_ids = np.ascontiguousarray(lp[:, :, :budget]), np.ascontiguousarray(ids[:, :, :budget])
        tau = 1.0 + expected_accepted_tokens(sub_lp, sub_ids, builder.build(sub_lp, sub_ids, budget)).mean()
        assert abs(tau / paper - 1.0) <= 0.03, (budget, tau, paper)
    assert abs(chain_tau_mean(lp) / PAPER_CHAIN - 1.0) <= 0.03


def test_trace_cli_takes_a_drafter_config(tmp_path, capsys):
    fragment = tmp_path / "my.yaml"
    fragment.write_text(
        "drafter:\n  confident_fraction: 1.0\n  confident_top1: 0.5\n  confident_decay: 1.0\n"
    )
    out = tmp_path / "t.npz"
    args = ["trace", "--distribution", "drafter", "--requests", "3", "--depth", "4", "--topk", "8"]
    assert main([*args, "--vocab-size", "512", "--drafter-config", str(fragment), "-o", str(out)]) == 0
    trace = load_trace(out)
    assert trace.metadata["drafter_confident_top1"] == 0.5
    fragment.write_text("drafter:\n  alt_mass: 7\n")
    bad = tmp_path / "bad.npz"
    assert main([*args, "--drafter-config", str(fragment), "-o", str(bad)]) == 2
    assert "drafter.alt_mass: must be in [0, 1], got 7" in capsys.readouterr().err
    assert not bad.exists()


def test_acceptance_targets(tmp_path):
    trace = drafter(requests=16, depth=16, topk=16, vocab=4096)
    path = tmp_path / "t.npz"
    save_trace(path, trace.top_log_probs, trace.top_token_ids, **trace.metadata)
    write_json(tree_shape(path, 16), tmp_path / "s.json")
    targets = acceptance_targets(combine_shapes([tmp_path / "s.json"]))
    assert [t[2] in ("met", "not met") for t in targets] == [True, True, True]
    assert "N = 16" in targets[0][3] and "1 of 7 budgets" in targets[0][3]
    old = combine_shapes([tmp_path / "s.json"]).drop(columns=["paper_depth_tau_mean", "simulated_tau_se"])
    assert [t[2] for t in acceptance_targets(old)] == ["no data", "no data", "no data"]
    assert acceptance_targets(old, "uniform")[0][2] == "no data"
    # one request per trace (SGLang's regime runs batch 1): too few to set against the paper's means
    single = combine_shapes([tmp_path / "s.json"]).assign(requests=1)
    assert {t[2] for t in acceptance_targets(single)} == {"no data"}
    assert "1 request(s) per trace: too few" in acceptance_targets(single)[0][3]
