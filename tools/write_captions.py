"""Write Snakemake's report captions of the figures (workflow/report/<figure>.rst) from the catalog's titles
and captions (src/ddtree_bench/catalog.py, where each caption is written once); tests/report/test_captions.py
checks that the committed files are what this writes.

    python tools/write_captions.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ddtree_bench.report.captions import CAPTIONS_DIR, write_captions


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=CAPTIONS_DIR, help="where the caption files go")
    args = parser.parse_args(argv)
    changed = write_captions(args.folder)
    print(f"{len(changed)} caption file(s) rewritten" + "".join(f"\n  {path}" for path in changed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
