# ddtree-bench: `make report` (set up, run the whole pipeline, render report/) and `make test`.
# Needs Python >= 3.11 and a C++ compiler; nvcc is optional (the CUDA kernel is compiled where it is found).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= all
# Snakemake through `ddtree-bench workflow`: a YAML error in a --configfile (SNAKEMAKE_ARGS) names its file and
# line; every --configfile adds to those before it (make smoke keeps smoke.yaml); Ctrl-C or SIGTERM stops
# Snakemake and its jobs cleanly, and the same command goes on (docs/configuration.md).
SNAKEMAKE := $(BIN)/ddtree-bench workflow
SNAKEMAKE_ARGS ?=
# The run's progress: a line per stage done and per tenth of the jobs, errors in full (ddtree_bench.progress);
# PROGRESS= gives Snakemake's own block per job.
PROGRESS ?= --logger ddtree
# pytest-xdist workers; each test module's tests run in one worker (--dist loadscope), so its module-scoped
# fixtures (the smoke pipeline's run) run once.
TEST_WORKERS ?= 2
PYTEST_ARGS ?=

.DEFAULT_GOAL := report
.PHONY: report smoke test lint setup setup-test python-version clean-report

python-version:
	@command -v $(PYTHON) >/dev/null 2>&1 || { \
	  echo "ddtree-bench needs Python >= 3.11, but '$(PYTHON)' is not found;" \
	       "run e.g. 'make PYTHON=python3.12 $(MAKECMDGOALS)'" >&2; exit 2; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "ddtree-bench needs Python >= 3.11, but '$(PYTHON)' is $$($(PYTHON) --version 2>&1 | head -1);" \
	       "run e.g. 'make PYTHON=python3.12 $(MAKECMDGOALS)'" >&2; exit 2; }

$(BIN)/python: | python-version
	$(PYTHON) -m venv $(VENV)

# The stamps re-run the install whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --progress-bar off -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --progress-bar off -e '.[test]'
	@touch $@ $(VENV)/.installed

setup: python-version $(VENV)/.installed

setup-test: python-version $(VENV)/.installed-test

# The pipeline on this machine (results/<machine>/) and the report (report/index.html, summary.md): the
# default configuration is sized for a CPU (config/config.yaml); the full grid is
# SNAKEMAKE_ARGS="--configfile config/full.yaml". Timing jobs never overlap (they take every core Snakemake
# is given, and one timing_slot), so --cores only lets traces, checks and the tree-shape jobs run side by
# side; native-mt uses all cores regardless.
report: setup
	$(SNAKEMAKE) --cores $(CORES) $(PROGRESS) $(SNAKEMAKE_ARGS) -- report

# The tiny configuration: the whole pipeline in under a minute on 2 cores (results/smoke/, report in
# results/smoke/report/).
smoke: setup
	$(SNAKEMAKE) --cores 2 $(PROGRESS) --configfile config/smoke.yaml $(SNAKEMAKE_ARGS) -- report

test: setup-test
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

lint: setup-test
	$(BIN)/ruff check .
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(SNAKEMAKE) --lint --cores 1 -n

clean-report:
	rm -rf report
