"""How the workflow stops on bad input (configuration, paths, a GPU asked for but absent)."""

import sys


def bad_input(message):
    """Bad input stops the run before any job: one line naming the problem, exit code 2."""
    print(" ".join(str(message).split()), file=sys.stderr)
    sys.exit(2)
