"""A source rule that neither ruff nor mypy checks (both run in ``make lint``, before the tests).

A decorator applied twice to one class or function: ``@dataclass`` over ``@dataclass(frozen=True)``
re-processes the class without complaint from either tool (it once got into ``app.py``). Decorators made
to be stacked, with different arguments each time, are exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Made to be stacked: each use adds a case.
# Decorators meant to be stacked: each application adds a case, an example, or (SQLAlchemy) a listener
# for another event, so a repeat is not a mistake.
STACKABLE = frozenset({"pytest.mark.parametrize", "example", "hypothesis.example", "event.listens_for"})


def repeated_decorators(source: str) -> list[tuple[int, str, str]]:
    """``(line, name, decorator)`` for each decorator that appears twice on one definition (compared
    by what is called, so ``@dataclass`` and ``@dataclass(frozen=True)`` are the same decorator)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        seen: set[str] = set()
        for decorator in node.decorator_list:
            called = ast.unparse(decorator.func if isinstance(decorator, ast.Call) else decorator)
            if called in seen and called not in STACKABLE:
                found.append((node.lineno, node.name, called))
            seen.add(called)
    return found


def our_sources() -> list[Path]:
    """Every Python file of the repository except generated stubs (and hidden folders: .venv, caches)."""
    files: list[Path] = []
    for top in REPO.iterdir():
        if top.name.startswith("."):
            continue
        files += top.rglob("*.py") if top.is_dir() else [top] if top.suffix == ".py" else []
    return sorted(path for path in files if "_pb2" not in path.name)


def test_a_decorator_applied_twice_is_found() -> None:
    source = "from dataclasses import dataclass\n\n@dataclass\n@dataclass(frozen=True)\nclass Check:\n    x: int\n"
    assert repeated_decorators(source) == [(5, "Check", "dataclass")]
    stacked = "@pytest.mark.parametrize('a', [1])\n@pytest.mark.parametrize('b', [2])\ndef f(a, b): ..."
    assert repeated_decorators(stacked) == []


def test_no_definition_of_ours_has_a_decorator_twice() -> None:
    sources = our_sources()
    assert REPO / "scheduler_service" / "cycle.py" in sources  # the walk reaches our packages
    repeated = [f"{path.relative_to(REPO)}:{line} {name}: @{called} twice"
                for path in sources for line, name, called in repeated_decorators(path.read_text())]
    assert not repeated, "\n".join(repeated)
