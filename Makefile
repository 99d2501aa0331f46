# One command each on a fresh clone: `make demo`, `make test`, `make bench`.
# Each creates the virtualenv in .venv and installs Aryl into it when missing or out of date.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-under-load lint bench bench-under-load protos evaluation clean chaos soak soak-ci compose-test haproxy wrk sia-gate gpu-check

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# HAProxy, the inference router's data plane (Debian's package; docs/operations.md): installed with apt-get where it
# is missing (on PATH or in /usr/sbin), through sudo when not root. Elsewhere install it yourself, or run the router
# with router.data_plane = python.
haproxy:
	@if ! command -v haproxy >/dev/null 2>&1 && ! test -x /usr/sbin/haproxy; then \
		echo "haproxy: not found; installing the Debian package (apt-get install -y haproxy)"; \
		if [ "$$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi; \
		$$sudo apt-get update -q && $$sudo apt-get install -y -q haproxy; \
	fi

# wrk (Debian's package), the load generator of the router_throughput benchmark; the same way.
wrk:
	@if ! command -v wrk >/dev/null 2>&1; then \
		echo "wrk: not found; installing the Debian package (apt-get install -y wrk)"; \
		if [ "$$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi; \
		$$sudo apt-get update -q && $$sudo apt-get install -y -q wrk; \
	fi

demo: $(STAMP) haproxy
	$(BIN)/aryl-demo

# Lint, then types, then the tests; the first that fails stops the target (and CI, which runs `make test`).
# The fault-injection cases in tests/chaos run here in their bounded form; `make chaos` runs the full set.
# pytest runs in PYTEST_WORKERS processes (pytest-xdist), a test file per process at a time; each process has
# its own scratch PostgreSQL database (tests/conftest.py). PYTEST_WORKERS=0: one process, as plain `pytest`.
# Each test fails after 600 s with every thread's stack (pytest-timeout; pyproject.toml). Waits that tests size for an
# idle machine are multiplied by ARYL_TEST_TIMEOUT_FACTOR (default 1; tests/helpers.py): raise it on a loaded one.
PYTEST_WORKERS ?= 2
test: lint haproxy
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile
	$(MAKE) --no-print-directory soak-ci

# The pytest part of `make test` while LOAD_HOGS busy loops (one per core, at the tests' own priority) keep the CPUs
# busy, as CI finds the machine right after work stops; waits and per-test limits stretched by LOAD_FACTOR.
# PYTEST_ARGS narrows it (`make test-under-load PYTEST_ARGS=tests/store/test_store.py`). LOAD_FACTOR: a whole number.
LOAD_HOGS   ?= $(shell nproc 2>/dev/null || echo 2)
LOAD_FACTOR ?= 4
PYTEST_ARGS ?=
test-under-load: $(STAMP) haproxy
	@hogs=""; for _ in $$(seq $(LOAD_HOGS)); do nice -n 0 $(BIN)/python -c 'while True: pass' & hogs="$$hogs $$!"; done; \
	trap 'kill $$hogs 2>/dev/null' EXIT INT TERM; \
	echo "test-under-load: $(LOAD_HOGS) CPU hogs ($$hogs), ARYL_TEST_TIMEOUT_FACTOR=$(LOAD_FACTOR)"; \
	ARYL_TEST_TIMEOUT_FACTOR=$(LOAD_FACTOR) $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile \
		--timeout $$((600 * $(LOAD_FACTOR))) -o faulthandler_timeout=$$((600 * $(LOAD_FACTOR) + 60)) $(PYTEST_ARGS)

# On a server with NVIDIA GPUs and a CUDA build of PyTorch in the venv: the real NVML backend, an agent registering
# the real GPUs and a CUDA training job through a real scheduler (tests/gpu); a missing GPU fails here, where
# `make test` skips these. scripts/device_gpu_check.sh runs the same on a machine without the venv or network.
gpu-check: $(STAMP)
	ARYL_REQUIRE_GPU=1 $(BIN)/python -m pytest tests/gpu -v

# Fault injection, full run (100 scheduler kill points, 120 s partitions, ...): tests/chaos with ARYL_CHAOS=full;
# each run's logs stay in chaos-output/ until the next run.
chaos: $(STAMP)
	ARYL_CHAOS=full $(BIN)/python -m pytest -q --basetemp=chaos-output --timeout 3600 -o faulthandler_timeout=3660 \
		tests/chaos

# One hour at the L-scale fleet; figures and a plot under soak-results/. `soak-ci` is its 5-minute form.
soak: $(STAMP)
	$(BIN)/python -m benchmarks.soak --minutes 60 --out soak-results

soak-ci: $(STAMP)
	$(BIN)/python -m benchmarks.soak --minutes 5 --out soak-results

# The docker-compose stack for real: images built, stack up, a job run, an agent restarted; then the two-host layout
# (a control host and a GPU server as two projects, a job on the remote agent); all torn down.
compose-test: $(STAMP)
	bash deploy/compose-test.sh

# ruff (pyflakes, pycodestyle, import order, bug patterns) and mypy (every package and tests/, strict on core/, policies/, solvers/);
# both read their settings from pyproject.toml. `$(BIN)/ruff check --fix` sorts imports and fixes the mechanical rest.
lint: $(STAMP)
	$(BIN)/ruff check --quiet .
	$(BIN)/mypy

bench: $(STAMP) haproxy wrk
	$(BIN)/python -m benchmarks

# The latency benchmarks twice, quiet and with a CPU hog on every core, side by side (benchmarks/README.md).
bench-under-load: $(STAMP) haproxy wrk
	$(BIN)/python -m benchmarks --under-load

# Regenerates docs/evaluation.md from the public traces in ../shared (set SHARED=... elsewhere).
SHARED ?= ../shared
evaluation: $(STAMP)
	$(BIN)/python -m evaluation --shared $(SHARED)

# The heterogeneous job model's fidelity gate (issue 33): sia and gavel against the Sia authors' simulator, average
# JCT within 5% (simulator/hetero_gate.py). Needs SIA_REF_GIT, a clone of github.com/siasosp23/artifacts (never
# committed: it has no licence); without it, says how to get one.
sia-gate: $(STAMP)
	nice -n 10 $(BIN)/python -m simulator.hetero_gate

protos: $(STAMP)
	$(BIN)/python -m protos.generate

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache *.egg-info
