# One command each on a fresh clone: `make demo`, `make test`, `make bench`.
# Each creates the virtualenv in .venv and installs Aryl into it when missing or out of date.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench protos evaluation clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/aryl-demo

# Lint, then types, then the tests; the first that fails stops the target (and CI, which runs `make test`).
test: lint
	$(BIN)/python -m pytest -q

# ruff (pyflakes, pycodestyle, import order, bug patterns) and mypy (strict on core/, policies/, solvers/);
# both read their settings from pyproject.toml. `$(BIN)/ruff check --fix` sorts imports and fixes the mechanical rest.
lint: $(STAMP)
	$(BIN)/ruff check --quiet .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# Regenerates docs/evaluation.md from the public traces in ../shared (set SHARED=... elsewhere).
SHARED ?= ../shared
evaluation: $(STAMP)
	$(BIN)/python -m simulator.evaluation --shared $(SHARED)

protos: $(STAMP)
	$(BIN)/python -m protos.generate

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache *.egg-info
