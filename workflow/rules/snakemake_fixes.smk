"""Work-arounds for Snakemake's own bugs, applied before any rule (each names its upstream issue)."""

from snakemake.script import PythonScript


def quote_script_python():
    """Snakemake runs a ``script:`` job as ``{py_exec} {fname:q}``: the script's path quoted, the Python's
    not (snakemake/snakemake#2645, open). From a clone whose path has a space (the venv's Python is inside
    it) every script job then fails with exit status 127. Jobs run in this process's threads (the local
    executor), so quoting the Python here fixes them all; the script's own quoting stays Snakemake's.
    """
    if getattr(PythonScript, "ddtree_quotes_python", False):
        return
    execute = PythonScript._execute_cmd

    def execute_quoted(self, cmd, **kwargs):
        if "py_exec" in kwargs:
            cmd = cmd.replace("{py_exec}", "{py_exec:q}")
        return execute(self, cmd, **kwargs)

    PythonScript._execute_cmd = execute_quoted
    PythonScript.ddtree_quotes_python = True


quote_script_python()
