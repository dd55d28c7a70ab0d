"""What every workflow script shares: the job's output goes to its log file, and a failure ends the job with
one line on stderr (the full traceback stays in the log)."""

import contextlib
import importlib.util
import sys
import traceback
from pathlib import Path

# Where the package is not installed in the job's environment (e.g. a per-rule conda environment), use the
# checkout's own source tree.
SRC = Path(__file__).resolve().parents[2] / "src"
if importlib.util.find_spec("ddtree_bench") is None and SRC.is_dir():
    sys.path.insert(0, str(SRC))


@contextlib.contextmanager
def logged(snakemake):
    log_path = snakemake.log[0] if snakemake.log else None
    if log_path is None:
        yield
        return
    stderr = sys.stderr
    with open(log_path, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            yield
        except Exception as error:
            traceback.print_exc(file=log)
            message = " ".join(str(error).split()) or type(error).__name__
            print(f"ddtree-bench: rule {snakemake.rule}: {type(error).__name__}: {message}", file=stderr)
            print(f"ddtree-bench: details in {log_path}", file=stderr)
            log.flush()
            sys.exit(1)
