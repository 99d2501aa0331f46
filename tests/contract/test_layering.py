"""Which of Aryl's packages may import which, read from the source with ``ast``.

The table is the architecture: the service, the agent, the router and the CLI each stand on
``aryl_common`` (shared plumbing) and ``protos`` (the API), never on one another, so each can be
built, tested and deployed without the others; the simulator drives the service's own core; only
the demo ties everything together. Every import counts, at module level or inside a function.
A new top-level package must be added to the table before its imports are allowed anywhere.

``scheduler_service/core`` is also held to STYLE.md habit 1: no gRPC, SQLAlchemy, NVML, or wall clock.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# package -> the other packages of ours it may import (itself always; third-party always).
ANYTHING = None
ALLOWED: dict[str, frozenset[str] | None] = {
    "aryl_common": frozenset(),
    "protos": frozenset(),
    "scheduler_service": frozenset({"aryl_common", "protos", "migrations"}),
    "migrations": frozenset({"scheduler_service"}),  # env.py reads the ORM models' metadata
    "node_agent": frozenset({"aryl_common", "protos"}),
    "inference_router": frozenset({"aryl_common", "protos"}),
    "arylctl": frozenset({"aryl_common", "protos"}),
    "simulator": frozenset({"scheduler_service", "aryl_common"}),
    "evaluation": frozenset({"simulator", "scheduler_service", "aryl_common"}),  # above the simulator, never below
    "aryl_demo": ANYTHING,
    "aryl_train": frozenset({"node_agent"}),  # a training program's helper: the contract module only
    "benchmarks": ANYTHING,
}
# The one crossing against the table, module by module (docs/architecture.md): the service's forecast
# (ETA and what-if, issue 22) runs the simulator's engine on the live snapshot. ``app.forecast`` declares the
# engine it needs; the composition root wires the simulator's in: no other module of the service imports the
# simulator, and the simulator never imports the service's app, api or store.
CROSSINGS: frozenset[tuple[str, str]] = frozenset({("scheduler_service/server.py", "simulator")})
# Import roots that are ours: every top-level package, plus the test and example trees.
OUR_ROOTS = frozenset(ALLOWED) | {"tests", "examples"}

CORE = REPO / "scheduler_service" / "core"
# Modules the pure decision core must not import (roots; ``time``/``datetime`` are the wall clock).
CORE_FORBIDDEN = frozenset({"grpc", "sqlalchemy", "pynvml", "time", "datetime"})


def top_level_packages(root: Path = REPO) -> set[str]:
    return {p.parent.name for p in root.glob("*/__init__.py")}


def imported_modules(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """``(line, dotted module)`` for every import in ``path``; relative imports resolved from ``root``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module_parts = list(path.relative_to(root).with_suffix("").parts)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: stays inside the package it is written in
                base = module_parts[: len(module_parts) - node.level]
                yield node.lineno, ".".join([*base, node.module] if node.module else base)
            elif node.module:
                yield node.lineno, node.module


def layering_violations(root: Path = REPO, allowed: dict[str, frozenset[str] | None] = ALLOWED) -> list[str]:
    """``path:line: package imports other`` for every import the table does not allow."""
    problems = []
    for package in sorted(top_level_packages(root)):
        permitted = allowed.get(package, frozenset())
        if package not in allowed:
            problems.append(f"{package}/: a top-level package missing from the layering table")
        if permitted is ANYTHING:
            continue
        for path in sorted((root / package).rglob("*.py")):
            for line, module in imported_modules(path, root):
                target = module.split(".")[0]
                if (path.relative_to(root).as_posix(), target) in CROSSINGS:
                    continue
                if target in OUR_ROOTS and target != package and target not in permitted:
                    problems.append(f"{path.relative_to(root)}:{line}: {package} imports {module}")
    return problems


def test_every_package_imports_only_what_the_layering_table_allows() -> None:
    assert {"aryl_common", "scheduler_service", "node_agent", "inference_router", "arylctl"} <= top_level_packages()
    assert layering_violations() == []


def test_the_simulator_never_imports_the_service_s_io_layers() -> None:
    """The crossing (``CROSSINGS``) stays one way at module level: the simulator imports the service's
    core, policies and cycle, never what imports it back (app, api, store, the process)."""
    problems = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for path in sorted((REPO / "simulator").rglob("*.py"))
        for line, module in imported_modules(path, REPO)
        if module.split(".")[:2] in (["scheduler_service", part] for part in ("app", "api", "store", "server"))
    ]
    assert problems == []


def test_a_forbidden_import_is_reported(tmp_path: Path) -> None:
    """The check can fail: a copy of the repository's packages with one forbidden import added."""
    for package in top_level_packages():
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "node_agent" / "agent.py").write_text("import os\nfrom aryl_common.backoff import Backoff\n")
    (tmp_path / "inference_router" / "link.py").write_text("def f():\n    from node_agent.agent import x\n")
    (tmp_path / "aryl_common" / "config.py").write_text("from scheduler_service.core import params\n")
    (tmp_path / "scheduler_service" / "demo.py").write_text("import arylctl.cli\nfrom . import config\n")
    assert sorted(layering_violations(tmp_path)) == [
        "aryl_common/config.py:1: aryl_common imports scheduler_service.core",
        "inference_router/link.py:2: inference_router imports node_agent.agent",
        "scheduler_service/demo.py:1: scheduler_service imports arylctl.cli",
    ]
    (tmp_path / "newpkg").mkdir()
    (tmp_path / "newpkg" / "__init__.py").write_text("")
    assert "newpkg/: a top-level package missing from the layering table" in layering_violations(tmp_path)


@pytest.mark.parametrize(
    "module, must_not_load",
    [
        ("node_agent.config", "scheduler_service"),
        ("node_agent.main", "scheduler_service"),
        ("inference_router.main", "scheduler_service"),
        ("inference_router.main", "node_agent"),
        ("aryl_common.config", "scheduler_service"),
    ],
)
def test_importing_a_daemon_does_not_load_another_package(module: str, must_not_load: str) -> None:
    """What the table says, checked at run time in a fresh interpreter (imports hidden in strings or
    in third-party hooks would slip past the ``ast`` check)."""
    probe = (
        f"import sys, {module}\n"
        f"loaded = sorted(m for m in sys.modules if m == {must_not_load!r} or m.startswith({must_not_load + '.'!r}))\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"importing {module} loaded {result.stdout.strip()}"


def core_violations(core: Path = CORE) -> list[str]:
    return [
        f"{path.relative_to(core.parent.parent)}:{line}: imports {module}"
        for path in sorted(core.rglob("*.py"))
        for line, module in imported_modules(path, core.parent.parent)
        if module.split(".")[0] in CORE_FORBIDDEN
    ]


def test_the_decision_core_imports_no_grpc_database_nvml_or_wall_clock(tmp_path: Path) -> None:
    assert len(list(CORE.glob("*.py"))) > 3
    assert core_violations() == []
    # ... and the check can fail:
    broken = tmp_path / "scheduler_service" / "core"
    broken.mkdir(parents=True)
    (broken / "plan.py").write_text("import time\nfrom datetime import UTC\ndef f():\n    import sqlalchemy.orm\n")
    assert core_violations(broken) == [
        "scheduler_service/core/plan.py:1: imports time",
        "scheduler_service/core/plan.py:2: imports datetime",
        "scheduler_service/core/plan.py:4: imports sqlalchemy.orm",
    ]


# Inside the service: which of its parts may import which (docs/architecture.md has the same table).
# Top-level modules (records, errors, lifecycle, worker_outcomes, ...) are listed by their own name.
SERVICE = REPO / "scheduler_service"
SERVICE_ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset({"lifecycle"}),  # pure: nothing that does I/O or knows the drivers
    "solvers": frozenset(),  # arrays in, arrays out
    "policies": frozenset({"core", "solvers", "lifecycle"}),
    "store": frozenset({"core", "lifecycle", "records", "errors", "worker_outcomes", "kill_points", "audit"}),
    "app": frozenset({"store", "core", "lifecycle", "records", "errors", "kill_points"}),
    "api": frozenset({"app", "core", "lifecycle", "records", "errors", "group_commit", "notify", "audit"}),
}


def service_layering_violations(service: Path = SERVICE) -> list[str]:
    """``path:line: part imports scheduler_service.x`` for every import ``SERVICE_ALLOWED`` forbids."""
    root = service.parent
    problems = []
    for part, permitted in sorted(SERVICE_ALLOWED.items()):
        for path in sorted((service / part).rglob("*.py")):
            for line, module in imported_modules(path, root):
                names = module.split(".")
                if names[0] != service.name or len(names) < 2:
                    continue
                if names[1] != part and names[1] not in permitted:
                    problems.append(f"{path.relative_to(root)}:{line}: {part} imports {module}")
    return problems


def test_the_service_s_parts_import_only_what_their_table_allows() -> None:
    assert service_layering_violations() == []


def test_a_forbidden_import_inside_the_service_is_reported(tmp_path: Path) -> None:
    service = tmp_path / "scheduler_service"
    for part in SERVICE_ALLOWED:
        (service / part).mkdir(parents=True)
        (service / part / "__init__.py").write_text("")
    (service / "core" / "plan.py").write_text("from scheduler_service.store import models\n")
    (service / "api" / "servicers.py").write_text("from scheduler_service.app import jobs\n")
    (service / "app" / "jobs.py").write_text("def f():\n    from scheduler_service.api import convert\n")
    assert service_layering_violations(service) == [
        "scheduler_service/app/jobs.py:2: app imports scheduler_service.api",
        "scheduler_service/core/plan.py:1: core imports scheduler_service.store",
    ]


@pytest.mark.parametrize("package", ["core", "solvers", "policies", "store", "app", "api"])
def test_the_architecture_table_names_every_module_of_the_service_s_packages(package: str) -> None:
    # docs/architecture.md's row of each package, against the package: a module added without a word there fails here.
    row = next(line for line in (REPO / "docs/architecture.md").read_text().splitlines()
               if line.startswith(f"| `{package}/` |"))
    path = REPO / "scheduler_service" / package
    modules = {p.stem for p in path.glob("*.py") if p.stem != "__init__"}
    modules |= {p.name for p in path.iterdir() if (p / "__init__.py").exists()}
    missing = sorted(name for name in modules if f"`{name}`" not in row)
    assert not missing, f"docs/architecture.md's {package} row does not name {', '.join(missing)}"


# Inside tests/: no module imports a test module (tests/harness.py's rule). What two test modules share
# lives in tests/harness.py, tests/helpers.py or tests/fixtures/, never in one of them for the other to import.
TESTS = REPO / "tests"


def is_test_module(module: str) -> bool:
    """``tests.cli.test_cli``, ``tests.chaos.test_ha``: a module of the test tree named ``test_*``."""
    names = module.split(".")
    return names[0] == "tests" and any(name.startswith("test_") for name in names[1:])


def imported_test_modules(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """``(line, test module)`` for every test module ``path`` imports, however spelled: ``import``,
    ``from ... import`` (relative too), or the module taken by name from its package
    (``from tests.cli import test_cli``, ``from . import test_ha``)."""
    for line, module in imported_modules(path, root):
        if is_test_module(module):
            yield line, module
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module_parts = list(path.relative_to(root).with_suffix("").parts)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(module_parts[: len(module_parts) - node.level]) if node.level else ""
            package = ".".join(part for part in (base, node.module) if part)
            if is_test_module(package):
                continue  # reported above, as the module it is
            for alias in node.names:
                if is_test_module(f"{package}.{alias.name}"):
                    yield node.lineno, f"{package}.{alias.name}"


def imports_between_test_modules(tests: Path = TESTS) -> list[str]:
    """``path:line: imports tests.unit.test_x`` for every module under ``tests`` that imports a test module."""
    root = tests.parent
    return [
        f"{path.relative_to(root)}:{line}: imports {module}"
        for path in sorted(tests.rglob("*.py"))
        for line, module in sorted(imported_test_modules(path, root))
    ]


def test_no_test_module_imports_another() -> None:
    assert len(list(TESTS.glob("*/test_*.py"))) > 10 and list((TESTS / "chaos").glob("test_*.py"))
    assert imports_between_test_modules() == []


def test_a_test_module_importing_another_is_reported(tmp_path: Path) -> None:
    """The check can fail: every spelling of the import, in a test module, a chaos test and a fixtures module;
    what test modules may import (the harness, the fixtures, the chaos conftest) is not reported."""
    tests = tmp_path / "tests"
    for package in ("chaos", "fixtures"):
        (tests / package).mkdir(parents=True)
        (tests / package / "__init__.py").write_text("")
    (tests / "test_a.py").write_text("from tests.test_b import x\nimport tests.chaos.test_c\n")
    (tests / "test_b.py").write_text("from tests.fixtures.cli import run\nfrom tests.harness import NOW\n")
    (tests / "chaos" / "test_c.py").write_text(
        "from .test_d import y\nfrom tests.chaos import test_d\ndef f():\n    from tests import test_b\n")
    (tests / "chaos" / "test_d.py").write_text("from tests.chaos.conftest import FULL\nfrom . import invariants\n")
    (tests / "fixtures" / "cli.py").write_text("from tests.test_a import z\n")
    assert imports_between_test_modules(tests) == [
        "tests/chaos/test_c.py:1: imports tests.chaos.test_d",
        "tests/chaos/test_c.py:2: imports tests.chaos.test_d",
        "tests/chaos/test_c.py:4: imports tests.test_b",
        "tests/fixtures/cli.py:1: imports tests.test_a",
        "tests/test_a.py:1: imports tests.test_b",
        "tests/test_a.py:2: imports tests.chaos.test_c",
    ]
