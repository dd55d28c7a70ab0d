"""The round's stacks: each one-kernel swap differs from its SGLang stack in that kernel only; SGLang's verify
mask has its worker's layout; SGLang's accept file is found beside its DDTree file; the chain's CPU walk
accepts the longest agreeing prefix; on the GPU (skipped without one) SGLang's Triton accept equals the CPU
walk, SGLang's Triton and FA3 tree attention equal the float32 reference, FA3's layer makes the fork's
launches plus one gather, the drafter's merged top-K is its plain top-K, SGLang's commit and ours move the
same rows, and every stack's and the chain's whole round is exact and accepts what the CPU walk accepts."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import make_topk
from model_shapes import SMALL_DRAFTER, SMALL_TARGET

from ddtree_bench import catalog
from ddtree_bench.builders import get_builder
from ddtree_bench.cuda.loader import gpu_unavailable_reason
from ddtree_bench.ops import sglang_verify

GPU_REASON = gpu_unavailable_reason()
REPO = Path(__file__).resolve().parents[2]
#: SGLang's DDTree fork files (its utils file, triton_ops/ddtree.py beside it): config/h200-sources.yaml
SGLANG_SOURCE = Path(os.environ.get("DDTREE_SGLANG_SOURCE", REPO / ".sglang"))
SGLANG_FILES = Path(os.environ.get("DDTREE_SGLANG_FILES", REPO / ".peers" / "sglang_files"))
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")


def _have_fork() -> bool:
    try:
        sglang_verify.find_accept_file(SGLANG_SOURCE)
    except ValueError:
        return False
    return True


needs_fork = pytest.mark.skipif(not _have_fork(), reason=f"SGLang's DDTree fork files not at {SGLANG_SOURCE}")
needs_files = pytest.mark.skipif(
    not SGLANG_FILES.is_dir(), reason=f"the sglang wheel's extracted files are not at {SGLANG_FILES}"
)


def test_every_swap_differs_from_its_base_in_its_kernel_only():
    stacks = catalog.STACKS
    ours = {"build": catalog.GPU_BUILDER, "attention": catalog.OURS, "accept": catalog.OURS}
    assert {s.name for s in stacks.values() if s.base is None} == {"sglang-fa3", "sglang-triton", "ours"}
    for stack in stacks.values():
        if stack.base is None:
            continue
        base = stacks[stack.base]
        for kernel in catalog.STACK_KERNELS:
            want = ours[kernel] if kernel == stack.swap else getattr(base, kernel)
            assert getattr(stack, kernel) == want, (stack.name, kernel)
    assert all(getattr(stacks["ours"], k) == v for k, v in ours.items())
    assert not stacks["ours"].sglang_mask and stacks["sglang-fa3+attention"].sglang_mask is False
    assert stacks["sglang-triton+build"].sglang_mask


def test_sglang_verify_mask_has_the_workers_layout():
    torch = pytest.importorskip("torch", reason="the mask is torch ops (PyTorch not installed)")
    lp, ids = make_topk("bf16", 3, 6, 16, seed=4)
    trees = get_builder("reference").build(lp, ids, 9)
    prefix = [0, 5, 12]
    mask = sglang_verify.VerifyMask(prefix, 10, "cpu")
    mask.buffer.fill_(False)
    mask.build(torch.from_numpy(trees.visibility))
    flat = mask.buffer.numpy()
    for b, s in enumerate(prefix):
        block = flat[int(mask.indptr[b]) : int(mask.indptr[b + 1])].reshape(10, s + 10)
        assert block[:, :s].all()
        assert np.array_equal(block[:, s:], trees.visibility[b])
        assert np.array_equal(mask.tree_part()[b].numpy(), trees.visibility[b])
    assert int(mask.indptr[-1]) == sum(10 * (s + 10) for s in prefix) == flat.size


def test_the_accept_file_is_found_beside_the_ddtree_file(tmp_path):
    utils = tmp_path / "python/sglang/srt/speculative/dflash_ddtree_utils.py"
    utils.parent.mkdir(parents=True)
    utils.write_text("def build_ddtree_tree_from_topk(a, b, c):\n    pass\n")
    with pytest.raises(ValueError, match="no triton_ops/ddtree.py beside it"):
        sglang_verify.find_accept_file(tmp_path)
    (utils.parent / "triton_ops").mkdir()
    (utils.parent / "triton_ops" / "ddtree.py").write_text("")
    assert sglang_verify.find_accept_file(tmp_path) == (utils.parent / "triton_ops" / "ddtree.py").resolve()


# --------------------------------------------------------------------------------------------------- GPU


def _device_trees(torch, budget, batch=3, depth=6, seed=0):
    lp, ids = make_topk("bf16", batch, depth, 32, seed=seed)
    trees = get_builder("reference").build(lp, ids, budget)
    return trees, {
        name: torch.as_tensor(np.ascontiguousarray(getattr(trees, name)), device="cuda")
        for name in ("node_token_ids", "retrieve_next_token", "retrieve_next_sibling", "visibility")
    }


@needs_gpu
@needs_fork
@pytest.mark.parametrize("budget", [1, 8, 63, 200])
def test_sglang_triton_accept_equals_the_cpu_walk(budget):
    import torch  # noqa: PLC0415

    from ddtree_bench.ops.accept import accept_cpu  # noqa: PLC0415

    trees, dev = _device_trees(torch, budget, seed=budget)
    rng = np.random.default_rng(budget)
    # targets that follow the tree for a while: each node's target is one of its children's tokens, or not
    target = rng.integers(0, 1000, size=(3, budget + 1))
    for b in range(3):
        for child in range(1, int(trees.node_count[b]) + 1):
            parent = int(trees.parents[b, child])
            if rng.random() < 0.6:
                target[b, parent] = trees.node_token_ids[b, child - 1]
    fork = sglang_verify.ForkTrees(3, budget + 1, dev["visibility"].clone(), [0, 0, 0], "cuda")
    fork.tokens[:, 1:].copy_(dev["node_token_ids"])
    fork.next_token.copy_(dev["retrieve_next_token"])
    fork.next_sibling.copy_(dev["retrieve_next_sibling"])
    accept = sglang_verify.TritonAccept(SGLANG_SOURCE, fork)
    accept.launch(torch.as_tensor(target, device="cuda"))
    got = accept.result()
    want = accept_cpu(trees, target)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b)
    assert (got[1] > 1).any()


def _attention_inputs(torch, budget, prefix):
    trees, dev = _device_trees(torch, budget, seed=budget + 7)
    batch, heads = 3, 8
    gen = torch.Generator(device="cuda").manual_seed(budget)
    q = torch.randn((batch, budget + 1, heads, 576), generator=gen, device="cuda").to(torch.bfloat16)
    kv = torch.randn((batch, max(prefix) + budget + 1, 576), generator=gen, device="cuda").to(torch.bfloat16)
    out = torch.zeros((batch, budget + 1, heads, 512), device="cuda", dtype=torch.bfloat16)
    mask = sglang_verify.VerifyMask(prefix, budget + 1, "cuda")
    mask.build(dev["visibility"])
    return trees, q, kv, out, mask


@needs_gpu
@needs_files
@pytest.mark.parametrize("impl", ["triton", "fa3"])
@pytest.mark.parametrize("budget", [8, 63])
def test_sglang_tree_attention_equals_the_reference(impl, budget):
    import torch  # noqa: PLC0415

    from ddtree_bench.ops.attention import reference_attention  # noqa: PLC0415

    prefix = np.array([300, 300, 300])
    trees, q, kv, out, mask = _attention_inputs(torch, budget, prefix)
    try:
        if impl == "triton":
            from ddtree_bench.ops.attention_peers import (  # noqa: PLC0415
                PeerUnavailable,
                load_sglang_extend_attention,
            )

            try:
                attention = sglang_verify.TritonAttention(*load_sglang_extend_attention(SGLANG_FILES))
            except PeerUnavailable as exc:
                pytest.skip(str(exc))
            prepared = attention.prepare(q, kv, prefix, mask, out)
        else:
            attention = sglang_verify.Fa3Attention(SGLANG_FILES)
            width = int(trees.node_depths.max()) + 1
            prepared = attention.prepare(q, kv, prefix, mask, out, width=width)
    except sglang_verify.SglangUnavailable as exc:
        pytest.skip(str(exc))
    prepared.launch()
    torch.cuda.synchronize()
    want = reference_attention(q, kv, prefix, trees.visibility)
    error = float((out.float() - want).norm() / want.norm())
    assert error < 1e-2, error


def _small_round(stacks, budget: int, prefix: int, seed: int):
    """A captured ``StackRound`` of ``stacks`` on the small shapes (bf16 experts), SGLang's code here."""
    from ddtree_bench.k26.round import RoundOptions  # noqa: PLC0415
    from ddtree_bench.k26.stack import StackRound  # noqa: PLC0415
    from ddtree_bench.k26.target import TargetWeights  # noqa: PLC0415
    from ddtree_bench.ops.accept import GpuAccept  # noqa: PLC0415
    from ddtree_bench.ops.attention import VerifyAttention  # noqa: PLC0415

    runner = StackRound(
        TargetWeights(SMALL_TARGET, moe_impl="bf16-grouped-mm", seed=seed),
        SMALL_DRAFTER,
        RoundOptions(batch=2, budget=budget, prefix=prefix, block_size=8, follow_budget=False, topk=16),
        stacks=stacks,
        sglang={
            "builder": {"source": str(SGLANG_SOURCE)},
            "accept": str(SGLANG_SOURCE),
            "attention_files": str(SGLANG_FILES),
            "files": str(SGLANG_FILES),
        },
        max_seconds=30.0,
        attention=VerifyAttention(),
        accept=GpuAccept(),
    )
    runner.capture()
    return runner


@needs_gpu
@needs_fork
@needs_files
def test_every_stack_round_is_exact_and_accepts_as_the_cpu_walk():
    runner = _small_round(catalog.stack_names(), budget=24, prefix=100, seed=2)
    lp, ids = (t.cpu().numpy() for t in (runner.drafter.top_log_probs, runner.drafter.top_token_ids))
    want = get_builder("reference").build(lp, ids, 24)
    for stack in runner.stacks:
        runner.prepare_stack(stack)
        runner.run_stack(stack)
        assert runner.check(stack), stack.name
        trees = runner.trees.to_host()
        assert np.array_equal(trees.parents, want.parents), stack.name
        assert np.array_equal(trees.node_token_ids, want.node_token_ids), stack.name
        for part in runner.parts_of(stack).values():  # the same round part by part
            part()
        assert runner.check(stack), stack.name


@needs_gpu
@needs_fork
@needs_files
def test_the_round_stage_times_every_stack_and_the_chain_and_says_they_are_exact():
    from ddtree_bench.stages import round as round_stage  # noqa: PLC0415

    names = tuple(catalog.stack_names())
    job = round_stage.Job(
        batch=2,
        prefix=100,
        budgets=(7, 8),
        tree_budgets=(8,),
        builders=(),
        builder_options={catalog.SGLANG: {"source": str(SGLANG_SOURCE)}},
        shape=SMALL_TARGET,
        drafter_shape=SMALL_DRAFTER,
        forward_impl="bf16-grouped-mm",
        block_size=8,
        follow_budget=False,
        topk=16,
        timing={"warmup": 0, "repeats": 2, "min_repeats": 2, "max_repeats": 2, "min_seconds": 0.0},
        machine="m",
        sglang_files=str(SGLANG_FILES),
        stacks={
            "stacks": names,
            "max_seconds": 30.0,
            "attention_files": str(SGLANG_FILES),
            "chain_blocks": (8,),
            "warmup": 1,
            "repeats": 2,
            "repeat_budgets": (8,),
            "repeat_runs": 2,
            "comm": {"world_size": 8, "bus_bandwidth_gbps": 370.0, "latency_us": 15.0},
        },
    )
    frames = round_stage.run(job)
    rows = frames[8]
    assert set(rows["stage"]) == {"stack"} and set(rows["status"]) == {"ok"}, rows["status_reason"].tolist()
    assert set(rows["impl"]) == set(names) and rows["correct"].all()
    for name in names:
        mine = rows[rows["impl"] == name]
        timings = set(mine["timing"])
        parts = {
            "wall",
            "sum-of-parts",
            "part-draft",
            "part-build",
            "part-forward",
            "part-accept",
            "part-commit",
        }
        assert parts | {"estimate-allreduce", "estimate-gather", "run2:wall"} <= timings
        assert mine["note"].str.len().min() > 0 and mine["launches"].min() >= 1
        timed = mine[(mine["timing"] == "wall") & (mine["phase"] == "timed")]
        assert len(timed) == 2 and (mine[(mine["timing"] == "wall")]["phase"] == "warmup").sum() == 1
        probes = {"build-gc-off", "build-in-situ", "build-in-situ-back-to-back"}  # SGLang's own round only
        assert probes <= timings if name == catalog.SGLANG_ROUND else not probes & timings, name
    chain = frames[7]
    assert set(chain["impl"]) == {catalog.CHAIN} and set(chain["status"]) == {"ok"}, chain["status_reason"]
    assert chain["correct"].all() and (chain["depth"] == 7).all()
    assert {"wall", "part-forward", "part-accept", "estimate-allreduce"} <= set(chain["timing"])


def test_the_chain_walk_accepts_the_longest_agreeing_prefix():
    candidates = np.array([[5, 1, 2, 3], [5, 1, 2, 3], [5, 9, 2, 3]])
    target = np.array([[1, 2, 3, 7], [1, 2, 8, 7], [1, 2, 3, 7]])
    accepted, bonus = sglang_verify.chain_accept_cpu(candidates, target)
    assert accepted.tolist() == [3, 2, 0] and bonus.tolist() == [7, 8, 1]
    with pytest.raises(ValueError, match="must be \\[B, block\\] alike"):
        sglang_verify.chain_accept_cpu(candidates, target[:, :3])


@needs_gpu
@needs_files
@pytest.mark.parametrize("budget", [8, 63])
def test_fa3_layer_makes_the_forks_launches_plus_one_gather(budget):
    """The fork's layer: the prefix pass, the tree pass, two LSE transposes, the merge; ours adds the gather
    (fa3-fwd has no paged KV). FA3's own calls may launch more than one kernel each: counted apart."""
    import torch  # noqa: PLC0415

    prefix = np.array([300, 300, 300])
    trees, q, kv, out, mask = _attention_inputs(torch, budget, prefix)
    try:
        attention = sglang_verify.Fa3Attention(SGLANG_FILES)
    except sglang_verify.SglangUnavailable as exc:
        pytest.skip(str(exc))
    prepared = attention.prepare(q, kv, prefix, mask, out, width=int(trees.node_depths.max()) + 1)
    layer = sglang_verify.launches(torch, prepared.launch)
    fn, meta, shared = attention.fn, attention.metadata, prepared.shared
    common = {"softmax_scale": 192**-0.5, "causal": False, "num_splits": 0, "return_softmax_lse": True}

    def prefix_pass():
        fn(
            q=prepared.q_rope,
            k_cache=prepared.k_cache,
            v_cache=prepared.v_cache,
            qv=prepared.q_nope,
            cache_seqlens=meta.cache_seqlens,
            cu_seqlens_q=shared["cu_seqlens_q"],
            max_seqlen_q=budget + 1,
            **common,
        )

    def tree_pass():
        gathered = shared["gathered"]
        fn(
            q=prepared.q_rope,
            k_cache=gathered[..., 512:],
            v_cache=gathered[..., :512],
            qv=prepared.q_nope,
            cache_seqlens=meta.expand_seqlens,
            cu_seqlens_q=shared["cu_seqlens_q_expand"],
            max_seqlen_q=1,
            **common,
        )

    fa3 = sglang_verify.launches(torch, prefix_pass) + sglang_verify.launches(torch, tree_pass)
    fork = fa3 + 2 + 1  # + two softmax_lse.T.contiguous() + merge_state
    assert layer == fork + 1, (layer, fa3)


@needs_gpu
def test_the_drafters_merged_top_k_is_its_plain_top_k():
    import torch  # noqa: PLC0415

    from ddtree_bench.k26.draft import DraftShard  # noqa: PLC0415

    drafter = DraftShard(
        SMALL_DRAFTER, batch=2, block=8, context=50, k=16, vocab_shard=SMALL_TARGET.vocab_shard
    )
    drafter.run()
    logits = (drafter.drafted @ drafter.lm_head).float()
    values, _ = torch.topk(logits, 16, dim=-1)
    want = (values - torch.logsumexp(logits, -1, keepdim=True)).view(2, 7, 16)
    assert torch.equal(drafter.top_log_probs, want)  # the merge changes no value (ties may swap ids)
    picked = torch.gather(logits, 1, drafter.top_token_ids.view(14, 16))
    assert (
        torch.equal(picked, values)
        and (drafter.top_token_ids.view(14, 16).sort(-1).values.diff(dim=-1) > 0).all()
    )
    drafter.head_greedy()
    best = torch.gather(drafter.drafted @ drafter.lm_head, 1, drafter.draft_tokens.view(14, 1))
    assert torch.equal(best.squeeze(1), (drafter.drafted @ drafter.lm_head).max(-1).values)


@needs_gpu
@needs_fork
@needs_files
def test_sglangs_commit_and_ours_move_the_same_rows():
    """SGLang's accept and commit (the fork's format), and ours (converted by ``from_ours``), on the same
    round: the same latent rows end at the same places and the same bonus tokens come out."""
    import torch  # noqa: PLC0415

    runner = _small_round(["sglang-fa3"], budget=12, prefix=40, seed=3)
    runner.graphs["draft"].replay()
    runner.graphs["build-bool"].replay()
    runner._fork_from_ours()
    runner.target.forward()
    # a target that follows the tree: each node's token where its parent is, so paths get accepted
    trees = runner.trees.to_host()
    target = np.zeros((2, 13), np.int64)
    for b in range(2):
        for child in range(1, int(trees.node_count[b]) + 1):
            target[b, int(trees.parents[b, child])] = trees.node_token_ids[b, child - 1]
    runner.target_tokens.copy_(torch.as_tensor(target, device="cuda"))
    runner.sglang_accept.launch(runner.target_tokens)
    runner.accept.launch(runner.d_target, runner.trees, runner.accept_out, stream=runner._stream())
    before = [kv.clone() for kv in runner.target.kv]
    runner._commit_sglang()
    theirs = ([kv.clone() for kv in runner.target.kv], runner.commit.bonus.clone())
    for kv, old in zip(runner.target.kv, before, strict=True):
        kv.copy_(old)
    runner._commit_ours()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(theirs[0], runner.target.kv, strict=True))
    assert torch.equal(theirs[1], runner.commit.bonus)
    assert int(runner.sglang_accept.commit_lens.min()) > 1  # paths were accepted and moved


@needs_gpu
@needs_files
def test_the_chain_round_is_exact():
    from ddtree_bench.k26.chain import ChainRound  # noqa: PLC0415
    from ddtree_bench.k26.target import TargetWeights  # noqa: PLC0415

    weights = TargetWeights(SMALL_TARGET, moe_impl="bf16-grouped-mm", seed=4)
    runner = ChainRound(weights, SMALL_DRAFTER, batch=3, block=8, prefix=100, sglang_files=str(SGLANG_FILES))
    runner.capture()
    runner.run_round()
    assert runner.check()
    # a target that agrees with the drafted tokens up to a point per request
    import torch  # noqa: PLC0415

    candidates = runner.accept.candidates
    target = torch.roll(candidates, -1, dims=1)
    target[0, 3] = -1
    runner.target_tokens.copy_(target)
    runner.accept.launch(runner.target_tokens)
    accepted, _ = runner.accept.result()
    assert accepted[0] == 3 and runner.check()
    if runner.graphs["round"] is not None:
        runner.run_graph()
        assert runner.check()
