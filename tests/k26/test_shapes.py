"""One GPU's share of Kimi K2.6 and its drafter: shapes, bytes and FLOPs against hand arithmetic, and the
expected distinct experts E(T) against a routing simulation."""

from __future__ import annotations

import numpy as np
import pytest

from ddtree_bench.k26.shapes import (
    DrafterShape,
    ModelShape,
    distinct_experts,
    expected_experts,
    routing_weights,
    simulate_routing,
)


def test_k26_rank_share_by_hand():
    s = ModelShape()
    assert (s.local_heads, s.expert_slice, s.shared_slice, s.dense_slice, s.vocab_shard) == (
        8,
        256,
        256,
        2304,
        20480,
    )
    # one INT4 expert slice: gate, up, down of 7168 x 256, half a byte a weight plus a bf16 scale per 32
    assert s.expert_slice_bytes() == 3 * 7168 * 256 * (0.5 + 2 / 32) == 3_096_576
    assert s.expert_bytes() == 60 * 384 * 3_096_576  # about 71 GB
    assert 71.3e9 < s.expert_bytes() < 71.4e9
    q_a, q_b, kv_a = 7168 * 1536, 1536 * 8 * 192, 7168 * 576
    kv_b, o_proj, norms = 8 * 512 * (128 + 128), 8 * 128 * 7168, 2 * 7168 + 1536 + 512
    assert s.attention_params() == q_a + q_b + kv_a + kv_b + o_proj + norms
    assert s.dense_mlp_params() == 3 * 7168 * 2304
    assert s.shared_expert_params() == 3 * 7168 * 256
    assert s.router_params() == 7168 * 384
    assert s.lm_head_params() == 20480 * 7168 + 7168
    expected_bf16 = 2 * (
        61 * s.attention_params()
        + 1 * s.dense_mlp_params()
        + 60 * (s.shared_expert_params() + s.router_params())
        + s.lm_head_params()
    )
    assert s.bf16_bytes() == expected_bf16
    assert 4.4e9 < s.bf16_bytes() < 4.7e9  # "about 4.5 GB"
    # the latent cache: 1152 bytes per token per layer
    assert s.kv_cache_bytes(1, 1) == 61 * 1152
    assert s.kv_cache_bytes(64, 32768 + 1025) > 141e9  # batch 64 at S = 32768 cannot fit one H200


def test_part_bytes_and_flops_by_hand():
    s = ModelShape()
    t = 9
    touched = 50.0
    parts = s.part_bytes(t, experts_touched=touched)
    assert parts["moe"] == 60 * (
        50 * s.expert_slice_bytes() + 2 * (s.shared_expert_params() + s.router_params())
    )
    assert parts["dense"] == 2 * (61 * s.attention_params() + s.dense_mlp_params())
    assert parts["lm-head"] == 2 * s.lm_head_params()
    flops = s.part_flops(t)
    routed = 8 * 3 * 7168 * 256
    assert flops["moe"] == 2 * t * 60 * (routed + s.shared_expert_params() + s.router_params())
    assert flops["lm-head"] == 2 * t * s.lm_head_params()
    # the experts' bytes grow with the tokens, then saturate at every expert
    assert s.part_bytes(9)["moe"] < s.part_bytes(65)["moe"] < s.part_bytes(1025)["moe"]
    assert s.part_bytes(4096)["moe"] == pytest.approx(s.part_bytes(100_000)["moe"], rel=1e-6)


@pytest.mark.parametrize(
    ("tokens", "value"),
    [(1, 8.0), (9, 66.3), (17, 115.5), (33, 192.3), (65, 286.3), (129, 358.6), (257, 382.3)],
)
def test_expected_experts_formula(tokens, value):
    assert expected_experts(tokens) == pytest.approx(value, abs=0.05)
    assert expected_experts(tokens) == 384 * (1 - (1 - 8 / 384) ** tokens)


@pytest.mark.parametrize("tokens", [1, 9, 33, 65, 257])
def test_expected_experts_matches_a_routing_simulation(tokens):
    rng = np.random.default_rng(tokens)
    counts = [distinct_experts(simulate_routing(tokens, 384, 8, rng=rng)) for _ in range(300)]
    assert np.mean(counts) == pytest.approx(expected_experts(tokens), rel=0.02)


def test_simulated_routing_draws_distinct_experts_per_token():
    ids = simulate_routing(500, 384, 8, rng=np.random.default_rng(0))
    assert ids.shape == (500, 8) and ids.dtype == np.int32
    assert all(len(set(row)) == 8 for row in ids)
    assert ids.min() >= 0 and ids.max() < 384


def test_skewed_routing_touches_fewer_experts():
    rng = np.random.default_rng(1)
    uniform = np.mean([distinct_experts(simulate_routing(65, 384, 8, rng=rng)) for _ in range(50)])
    skewed = np.mean(
        [
            distinct_experts(simulate_routing(65, 384, 8, rng=rng, routing="skewed", skew=1.0))
            for _ in range(50)
        ]
    )
    assert skewed < 0.8 * uniform
    weights = routing_weights(384, "skewed", 0.0)
    assert np.allclose(weights, 1 / 384)  # skew 0 is uniform


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layers": 0}, "layers must be >= 1"),
        ({"heads": 60}, "heads (60) must divide by tp (8)"),
        ({"dense_layers": 62}, "dense_layers (62) must be <= layers (61)"),
        ({"top_k": 400}, "top_k (400) must be <= experts (384)"),
        ({"hidden": 7000}, "hidden (7000) must divide by group_size (32)"),
        ({"hidden": True}, "hidden must be an integer"),
    ],
)
def test_model_shape_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelShape(**kwargs)


def test_shape_from_config_names_unknown_keys():
    with pytest.raises(ValueError, match="unknown key 'hiden'"):
        ModelShape.from_config({"hiden": 1})
    with pytest.raises(ValueError, match="unknown key 'block'"):
        DrafterShape.from_config({"block": 1})


def test_drafter_share_by_hand():
    d = DrafterShape()
    assert (d.local_heads, d.local_kv_heads) == (8, 1)
    per_layer = 7168 * (8 + 2) * 128 + 8 * 128 * 7168 + 3 * 7168 * 2304 + 2 * 7168
    assert d.layer_params() == per_layer
    assert d.bytes(20480) == 2 * (6 * per_layer + 20480 * 7168)
    flops = d.flops(batch=1, block=16, context=4096, vocab_shard=20480)
    attention = 4 * 16 * (4096 + 16) * 8 * 128
    assert flops == 6 * (2 * 16 * per_layer + attention) + 2 * 16 * 20480 * 7168
    with pytest.raises(ValueError, match="kv_heads"):
        DrafterShape(kv_heads=6)
