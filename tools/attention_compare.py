"""Our verify attention's kernels side by side on a GPU: the plan the pipeline runs, the seesaw kernel at
64-row tiles alone, and the previous default (64-row kernel with one warpgroup's S and the other's loads,
beside the 72-row tiles), on the same inputs.

Each is checked against the float32 reference first (max abs error; requests of different prefix lengths,
padding past every request's keys filled with NaN), then timed (CUDA events queued behind a spin kernel,
warm, medians of 21, the variants taking turns call by call). TFLOP/s count the visible keys, as the
pipeline does.

    PYTHONPATH=src:tests/support python tools/attention_compare.py [--trees KIND] [--baseline DIR ...] \
        [--baseline-plan DIR ...] [BxNxS ...]

--trees: the trees' inputs, "peaked" (default: confident early positions, deep chains) or "drafter" (the
pipeline's drafter distribution, depth 16, as the step grid's trees).

Each --baseline DIR adds the seesaw kernel built from another copy of kernels/verify_attn (e.g. an earlier
revision's, from `git archive REV kernels/verify_attn`), on the same inputs: an A/B of a kernel change.
Each --baseline-plan DIR adds the plan run by that copy's kernels (every kernel of the call, the combine
included; the same plan): an A/B of a change to any of them.

Needs an sm_90 GPU, nvcc, CuPy, PyTorch and the tests' input helpers (tests/support/gpu_inputs.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gpu_inputs import random_case, topk_inputs

from ddtree_bench.builders import get_builder
from ddtree_bench.cuda import loader as cuda
from ddtree_bench.ops.attention import (
    VerifyAttention,
    attention_flops,
    reference_attention,
    visible_keys,
)
from ddtree_bench.stages.attention import backend_name
from ddtree_bench.timing.gpu import EventTimer
from ddtree_bench.traces import TraceSpec, generate
from ddtree_bench.tree import packed_visibility

HEADS = 8
DEFAULT = [
    "1x8x32768",
    "8x8x32768",
    "64x8x32768",
    "1x64x32768",
    "8x64x32768",
    "64x64x32768",
    "8x256x32768",
    "1x1024x32768",
    "64x1024x4096",
    "8x1024x4096",
    "1x1024x4096",
    "64x256x4096",
]
VARIANTS = {
    "plan": {},
    "seesaw-64": {"wide_rows": False},
    "previous": {"seesaw": False},
}


def main(argv: list[str]) -> None:
    import cupy as cp  # noqa: PLC0415
    import torch  # noqa: PLC0415

    attention = {name: VerifyAttention(path="wgmma", **kw) for name, kw in VARIANTS.items()}
    trees_kind = "peaked"
    if argv[:1] == ["--trees"]:
        if len(argv) < 2 or argv[1] not in ("peaked", "drafter"):
            raise SystemExit("attention_compare: --trees takes peaked or drafter")
        trees_kind, argv = argv[1], argv[2:]
    while argv[:1] in (["--baseline"], ["--baseline-plan"]):
        if len(argv) < 2 or not (Path(argv[1]) / "verify_attn.cu").is_file():
            raise SystemExit(f"attention_compare: {argv[0]} needs a folder with verify_attn.cu")
        fatbin = cuda.cached_fatbin(Path(argv[1]) / "verify_attn.cu", ("sm_90",))
        if argv[0] == "--baseline":
            attention[f"seesaw-64 @ {argv[1]}"] = VerifyAttention(
                fatbin=fatbin, path="wgmma", wide_rows=False
            )
        else:
            attention[f"plan @ {argv[1]}"] = VerifyAttention(fatbin=fatbin, path="wgmma")
        argv = argv[2:]

    util = cp.RawModule(path=str(cuda.cached_fatbin(cuda.BENCH_UTIL_SOURCE)))
    timer = EventTimer(cp.cuda.get_current_stream(), util.get_function("ddtree_spin_kernel"))

    def medians_us(fns: dict, reps=21) -> dict:
        # the variants take turns, one call each a round: drift of the clocks is shared alike
        for fn in fns.values():
            for _ in range(3):
                fn()
        samples = {name: [] for name in fns}
        for _ in range(reps):
            for name, fn in fns.items():
                samples[name].append(timer(fn) * 1e6)
        return {name: float(np.median(s)) for name, s in samples.items()}

    for case in argv or DEFAULT:
        batch, budget, prefix = (int(x) for x in case.split("x"))
        if trees_kind == "drafter":
            trace = generate(TraceSpec("drafter", batch, 16, min(budget, 1024), seed=0))
            logits, ids = trace.top_log_probs, trace.top_token_ids
        else:
            logits, ids = topk_inputs("peaked", batch, 16, budget, seed=1)
        trees = get_builder("native").build(logits, ids, budget)
        bits_host = packed_visibility(trees.visibility)
        bits = torch.as_tensor(bits_host.view(np.int32), device="cuda")
        # prefix lengths S, S - 13, S - 26, ... (tails of every length mod 64), NaN past each request's keys
        lengths = np.array([max(1, prefix - 13 * (b % 5)) for b in range(batch)])
        q, kv, out = random_case(trees, HEADS, lengths, pad=40)
        check = range(min(batch, 3))
        ref = reference_attention(q, kv, lengths, trees.visibility, requests=check)
        flops = attention_flops(visible_keys(lengths, bits_host), HEADS)
        line = f"{trees_kind} B={batch} N={budget} S={prefix}"
        prepared, errors = {}, {}
        for name, att in attention.items():
            prepared[name] = att.prepare(q, kv, lengths, bits, out)
            out.fill_(float("nan"))
            prepared[name].launch()
            errors[name] = float((out[list(check)].float() - ref).abs().max())
        times = medians_us({name: p.launch for name, p in prepared.items()})
        for name, p in prepared.items():
            plan, t = p.plan, times[name]
            line += (
                f" | {name} [{backend_name(p)}; {plan.rows_per_block}x{plan.row_tiles}, {plan.splits} splits]"
                f" {t:.1f} us {flops / t / 1e6:.0f} TFLOP/s err {errors[name]:.4f}"
            )
        print(line, flush=True)
        del q, kv, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
