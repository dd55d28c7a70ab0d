"""Build SGLang's Marlin-MoE JIT modules for a GPU that is not here (default sm_90a, the H200) and write them
to one folder that a GPU machine loads without compiling (``integrations.sglang.jit``):

    python tools/prebuild_sglang_jit.py --sglang-files .peers/sglang_files -o .jit/sm90

Needs nvcc, torch, apache-tvm-ffi 0.1.11, msgspec and ninja; no GPU. On the GPU machine set
``SGLANG_JIT_PREBUILT=.jit/sm90`` (tools/round_stages.py's ``--sglang-jit``): a module missing there is an
error, never a silent rebuild.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ddtree_bench.cuda.loader import find_nvcc
from ddtree_bench.integrations import sglang
from ddtree_bench.integrations.sglang import jit


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang-files", required=True, help="the sglang wheel's extracted files")
    parser.add_argument("-o", "--out", type=Path, required=True)
    parser.add_argument("--arch", default="9.0", help="compute capability, e.g. 9.0 (sm_90a) or 12.0")
    parser.add_argument("--jobs", type=int, default=None, help="parallel nvcc jobs")
    parser.add_argument("--only", help="comma-separated indices into the module list (default: all)")
    args = parser.parse_args(argv)
    try:
        major, minor = (int(part) for part in args.arch.split("."))
        reason = sglang.jit_reason(find_nvcc())
        if reason is not None:
            raise ValueError(reason)
        sglang.install_sglang_files(args.sglang_files)
    except (ValueError, sglang.SglangUnavailable) as error:
        print(f"prebuild_sglang_jit: {error}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    only = None if args.only is None else {int(i) for i in args.only.split(",")}
    built = jit.prebuild(args.out, arch=(major, minor), jobs=args.jobs, only=only)
    for path in built:
        print(f"{path} ({path.stat().st_size / 2**20:.1f} MiB)")
    print(f"{len(built)} modules in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
