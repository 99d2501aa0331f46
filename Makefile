# One command each on a fresh clone: `make demo`, `make test`, `make bench`.
# Each creates the virtualenv in .venv and installs Aryl into it when missing or out of date.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench protos evaluation clean chaos soak soak-ci compose-test

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/aryl-demo

# Lint, then types, then the tests; the first that fails stops the target (and CI, which runs `make test`).
# The fault-injection cases in tests/chaos run here in their bounded form; `make chaos` runs the full set.
# pytest runs in PYTEST_WORKERS processes (pytest-xdist), a test file per process at a time; each process has
# its own scratch PostgreSQL database (tests/conftest.py). PYTEST_WORKERS=0: one process, as plain `pytest`.
PYTEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile
	$(MAKE) --no-print-directory soak-ci

# Fault injection, full run (100 scheduler kill points, 120 s partitions, ...): tests/chaos with ARYL_CHAOS=full;
# each run's logs stay in chaos-output/ until the next run.
chaos: $(STAMP)
	ARYL_CHAOS=full $(BIN)/python -m pytest -q --basetemp=chaos-output tests/chaos

# One hour at the L-scale fleet; figures and a plot under soak-results/. `soak-ci` is its 5-minute form.
soak: $(STAMP)
	$(BIN)/python -m benchmarks.soak --minutes 60 --out soak-results

soak-ci: $(STAMP)
	$(BIN)/python -m benchmarks.soak --minutes 5 --out soak-results

# The docker-compose stack for real: images built, stack up, a job run, an agent restarted, all torn down.
compose-test: $(STAMP)
	bash deploy/compose-test.sh

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
