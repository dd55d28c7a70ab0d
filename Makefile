# ddtree-bench: `make report` (set up, run the whole pipeline, render report/) and `make test`.
# Needs Python >= 3.11 and a C++ compiler; nvcc is optional (the CUDA kernel is compiled where it is found).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= 1
# Snakemake through `ddtree-bench workflow`: a YAML error in a --configfile (SNAKEMAKE_ARGS) names its file and line
SNAKEMAKE := $(BIN)/ddtree-bench workflow
SNAKEMAKE_ARGS ?=

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

# The whole pipeline on this machine (results/<machine>/) and the report (report/index.html, summary.md).
# Timing jobs never overlap (they take every core Snakemake is given, and one timing_slot), so --cores only
# lets traces, checks and the tree-shape jobs run side by side; native-mt uses all cores regardless.
report: setup
	$(SNAKEMAKE) --cores $(CORES) $(SNAKEMAKE_ARGS) report

# The tiny configuration: the whole pipeline in about 2 minutes on 2 cores (results/smoke/, report in results/smoke/report/).
smoke: setup
	$(SNAKEMAKE) --cores 2 --configfile config/smoke.yaml $(SNAKEMAKE_ARGS) -- report

test: setup-test
	$(BIN)/python -m pytest

lint: setup-test
	$(BIN)/ruff check .
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(SNAKEMAKE) --lint --cores 1 -n

clean-report:
	rm -rf report
