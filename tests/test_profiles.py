"""Acceptance profiles: each is declared once in the catalog; the k2.6-reported profile's stored drafter
parameters reproduce the targets it was fitted to (the calibration's round trip); its trace takes the
catalog's parameters whatever the configured drafter; a profile is a configuration choice, checked; the linear
chain's tau never exceeds the tree's at the same verified tokens and lies where its references say."""

from __future__ import annotations

import copy

import pytest
import yaml

from ddtree_bench import catalog
from ddtree_bench.calibrate import Evaluator, round_tau
from ddtree_bench.config import REPO_ROOT, check_config
from ddtree_bench.drafter import check_params
from ddtree_bench.traces import TraceSpec, generate


def test_the_profiles_are_the_papers_first_and_k26s():
    assert catalog.profile_names() == ("paper", "k2.6-reported")
    paper, k26 = catalog.ACCEPTANCE_PROFILES.values()
    assert paper.params is None and paper.distribution == "drafter"
    assert k26.distribution == "drafter-k2.6" and catalog.profile_of_distribution("drafter-k2.6") is k26
    assert catalog.profile_of_distribution("drafter") is None
    assert dict(k26.targets) == {8: 4.5, 16: 5.3, 32: 6.4}


def test_the_k26_parameters_reproduce_their_targets():
    """The calibration's round trip: what calibrate fitted (stored in the catalog) gives back the reported
    tau at the fit's depth (15: block 16), within the fit's worst residual (2%) and a margin."""
    k26 = catalog.ACCEPTANCE_PROFILES["k2.6-reported"]
    targets = dict(k26.targets)
    evaluator = Evaluator(tuple(targets), depth=15, requests=128)
    fitted, _chain = evaluator(check_params(dict(k26.params)))
    for budget, tau in targets.items():
        assert fitted[budget] == pytest.approx(tau, rel=0.03), budget


def test_the_k26_trace_takes_the_catalogs_parameters():
    configured = {"confident_fraction": 0.9}  # the configured drafter applies to drafter, not to a profile's
    trace = generate(TraceSpec("drafter-k2.6", 2, 4, 8, seed=0), drafter=configured)
    k26 = dict(catalog.ACCEPTANCE_PROFILES["k2.6-reported"].params)
    assert trace.metadata["drafter_top1_spread"] == pytest.approx(k26["top1_spread"])
    assert trace.metadata["drafter_confident_fraction"] == pytest.approx(k26["confident_fraction"])
    other = generate(TraceSpec("drafter", 2, 4, 8, seed=0), drafter=configured)
    assert other.metadata["drafter_confident_fraction"] == pytest.approx(0.9)


def test_a_profile_is_a_checked_configuration_choice():
    with open(REPO_ROOT / "config" / "config.yaml") as handle:
        config = yaml.safe_load(handle)
    assert check_config(copy.deepcopy(config))["acceptance_profiles"] == ["paper", "k2.6-reported"]
    with pytest.raises(ValueError, match=r"config: acceptance_profiles\[0\]: 'k3' is not one of"):
        check_config({**copy.deepcopy(config), "acceptance_profiles": ["k3"]})


@pytest.mark.parametrize("profile", list(catalog.ACCEPTANCE_PROFILES))
@pytest.mark.parametrize("depth", [7, 15])
def test_the_chains_tau_never_exceeds_the_trees_at_the_same_verified_tokens(profile, depth):
    taus, chain = round_tau(profile, depth, [depth])
    assert 1.0 < chain <= taus[depth] <= depth + 1


def test_the_chains_tau_against_its_references():
    """The paper profile's block-16 chain is the paper's DFlash 7.79 within 2 %; the k2.6 profile's block-8
    chain lies in the K2.5-DFlash card's range (3.7-5.5) and below the service's 4.5 at N = 8."""
    _, paper = round_tau(catalog.PAPER_PROFILE, 15, [15])
    assert paper == pytest.approx(7.79, rel=0.02)
    taus, k26 = round_tau(catalog.K26_PROFILE, 7, [7, 8])
    assert 3.7 <= k26 <= min(5.5, taus[8]) and taus[8] == pytest.approx(4.5, rel=0.03)


def test_round_tau_refuses_an_unknown_profile():
    with pytest.raises(ValueError, match="unknown acceptance profile 'nope'"):
        round_tau("nope", 7, [7])
