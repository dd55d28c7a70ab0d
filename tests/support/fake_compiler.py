"""A fake compiler (nvcc or C++) for the compile cache's tests: a script that answers ``--version`` from a
file and "compiles" by writing which version and flags built the output, logging every call."""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPT = """#!{python}
import pathlib, sys
here = pathlib.Path(__file__).parent
args = sys.argv[1:]
with open(here / "calls.log", "a") as log:
    log.write(" ".join(args) + "\\n")
version = (here / "version.txt").read_text().strip()
if args == ["--version"]:
    print("fake compiler\\n" + version)
    sys.exit(0)
out = args.index("-o")
pathlib.Path(args[out + 1]).write_text(f"built by {{version}} with {{' '.join(args[:out])}}\\n")
"""


class FakeCompiler:
    """The script at ``path``; ``version`` sets what ``--version`` says; ``compiles()`` and ``versions()``
    count its calls."""

    def __init__(self, folder: Path, version: str = "release 12.4"):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "fake-compiler"
        self.path.write_text(SCRIPT.format(python=sys.executable))
        self.path.chmod(0o755)
        self.folder = folder
        self.version = version

    @property
    def version(self) -> str:
        return (self.folder / "version.txt").read_text()

    @version.setter
    def version(self, text: str) -> None:
        (self.folder / "version.txt").write_text(text)

    def calls(self) -> list[str]:
        log = self.folder / "calls.log"
        return log.read_text().splitlines() if log.is_file() else []

    def compiles(self) -> int:
        return sum(call != "--version" for call in self.calls())

    def versions(self) -> int:
        return sum(call == "--version" for call in self.calls())
