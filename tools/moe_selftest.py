"""Routed-experts impls on this GPU: one line each, ok or unavailable (with the reason), the small case's
error against the float32 reference, and the time of one full-size K2.6 layer (rank 0 of TP8: 384 experts,
hidden 7168, intermediate 256, top-8), eager and replayed from a CUDA graph (CUDA events, median).

    PYTHONPATH=src:/tmp/site python tools/moe_selftest.py --sglang-files .peers/sglang_files

Exit status 1 where an impl that runs fails its check, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from ddtree_bench.k26 import moe

SMALL = dict(experts=8, hidden=1024, intermediate=256)


def _positive_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"token counts must be positive integers, got {text!r}")
    return values


def _time_ms(torch, fn, iters: int) -> float:
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _small_check(impl: str, files) -> tuple[float, float]:
    """Worst max-abs error relative to max |reference| and worst relative Frobenius error, T in 1/9/64."""
    worst_max, worst_rel = 0.0, 0.0
    weights = moe.make_expert_weights(impl, **SMALL, seed=11, device="cuda")
    for tokens in (1, 9, 64):
        x, ids, tw = moe.random_routing(tokens, SMALL["hidden"], SMALL["experts"], seed=tokens, device="cuda")
        y = moe.routed_experts(impl, weights, x, ids, tw, sglang_files=files).float()
        ref = moe.reference_moe(impl, weights, x, ids, tw)
        worst_max = max(worst_max, ((y - ref).abs().max() / ref.abs().max()).item())
        worst_rel = max(worst_rel, ((y - ref).norm() / ref.norm()).item())
    return worst_max, worst_rel


def _full_size(torch, impl: str, files, tokens_list, iters: int, shape: dict) -> list[str]:
    weights = moe.make_expert_weights(impl, **shape, seed=0, device="cuda")
    parts = [f"weights {weights.nbytes() / 1e9:.2f} GB"]
    for tokens in tokens_list:
        x, ids, tw = moe.random_routing(tokens, shape["hidden"], shape["experts"], seed=tokens, device="cuda")

        def call(x=x, ids=ids, tw=tw, weights=weights):
            return moe.routed_experts(impl, weights, x, ids, tw, sglang_files=files)

        for _ in range(3):
            call()
        torch.cuda.synchronize()
        eager = _time_ms(torch, call, iters)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()
        torch.cuda.current_stream().wait_stream(stream)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            graphed = f"{_time_ms(torch, graph.replay, iters):.3f} ms"
        except Exception as exc:  # report, do not hide: the row says the capture failed and why
            graphed = f"capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
        parts.append(f"T={tokens}: eager {eager:.3f} ms, graph {graphed}")
    del weights
    torch.cuda.empty_cache()
    return parts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sglang-files", default=None, help="folder holding SGLang's extracted files")
    parser.add_argument("--impls", default=",".join(moe.MOE_IMPLS), help="comma-separated impls")
    parser.add_argument("--tokens", type=_positive_list, default=[9, 1025], help="full-size token counts")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per point (median)")
    parser.add_argument("--experts", type=int, default=384)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--intermediate", type=int, default=256)
    args = parser.parse_args(argv)
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = [i for i in impls if i not in moe.MOE_IMPLS]
    if unknown or args.iters < 1:
        print(
            f"error: unknown impl(s) {unknown}; expected {list(moe.MOE_IMPLS)}"
            if unknown
            else "error: --iters must be >= 1",
            file=sys.stderr,
        )
        return 2
    shape = dict(experts=args.experts, hidden=args.hidden, intermediate=args.intermediate)
    failed = False
    for impl in impls:
        reason = moe.moe_unavailable_reason(impl, args.sglang_files)
        if reason is not None:
            print(f"{impl}: unavailable: {reason}", flush=True)
            continue
        import torch  # noqa: PLC0415

        worst_max, worst_rel = _small_check(impl, args.sglang_files)
        ok = worst_max <= 0.03 and worst_rel <= 0.01
        failed |= not ok
        try:
            timing = _full_size(torch, impl, args.sglang_files, args.tokens, args.iters, shape)
        except torch.cuda.OutOfMemoryError:
            timing = ["full size: out of GPU memory"]
            torch.cuda.empty_cache()
        status = "ok" if ok else "WRONG"
        print(
            f"{impl}: {status}; small case max err {worst_max:.2e} of max|ref|, rel {worst_rel:.2e}; "
            + "; ".join(timing)
            + f"; {moe.describe_impl(impl, args.sglang_files)}",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
