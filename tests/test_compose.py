"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

Every service command must be one of our console scripts, every ``ARYL_*`` variable a service sets
must be one its program understands with a value its config accepts, the agents must get NVIDIA
GPUs without sharing them, and the image must install the project. Each checker returns a list of
problems; the last tests feed them broken input to show they can fail.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from pydantic_settings import BaseSettings

from aryl_common.config import ConfigError, env_var_names
from inference_router.config import RouterConfig, load_router_config
from node_agent.config import AgentConfig, load_agent_config
from scheduler_service.config import SchedulerConfig, load_config

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

# The program a service runs -> the typed config it reads, and how that program loads it (the
# loaders also enforce what is required, e.g. the router's servers_needed).
CONFIG_OF: dict[str, tuple[type[BaseSettings], Callable[[], Any]]] = {
    "aryl-scheduler": (SchedulerConfig, load_config),
    "aryl-agent": (AgentConfig, load_agent_config),
    "aryl-router": (RouterConfig, load_router_config),
}


def load_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def declared_scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def command_words(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(word) for word in command]


def environment(service: dict[str, Any]) -> dict[str, Any]:
    """A service's environment as a dict (compose allows a mapping or a list of NAME=VALUE)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return dict(env)


def services_running(compose: dict[str, Any], program: str) -> dict[str, dict[str, Any]]:
    return {
        name: svc for name, svc in compose["services"].items() if command_words(svc)[:1] == [program]
    }


# --------------------------------------------------------------------------------------------------
# Checkers: each returns the problems it finds (empty: fine)


def command_problems(name: str, service: dict[str, Any], scripts: dict[str, str]) -> list[str]:
    words = command_words(service)
    if not words:
        return [f"{name}: empty command"]
    program = words[0]
    if program not in scripts:
        return [f"{name}: {program!r} is not a console script in pyproject.toml {sorted(scripts)}"]
    found = metadata.entry_points(group="console_scripts").select(name=program)
    if not found:
        return [f"{name}: {program!r} is declared but not installed as an entry point (pip install -e .)"]
    (entry_point,) = found
    if entry_point.value != scripts[program]:
        return [f"{name}: installed {program} -> {entry_point.value}, pyproject says {scripts[program]}"]
    if not callable(entry_point.load()):
        return [f"{name}: {entry_point.value} is not callable"]
    return []


def environment_problems(name: str, service: dict[str, Any]) -> list[str]:
    env = environment(service)
    problems = [
        f"{name}: {key}={value!r} must be a string or number (compose rejects booleans; quote it)"
        for key, value in env.items()
        if isinstance(value, bool) or value is None or not isinstance(value, (str, int, float))
    ]
    aryl = {key: str(value) for key, value in env.items() if key.startswith("ARYL_")}
    if not aryl:
        return problems
    program = command_words(service)[:1]
    if not program or program[0] not in CONFIG_OF:
        return [*problems, f"{name}: sets ARYL_* variables but runs {program}, which has no known config"]
    config_class, load = CONFIG_OF[program[0]]
    unknown = sorted(set(aryl) - env_var_names(config_class))
    if unknown:
        return [*problems, f"{name}: {program[0]} does not understand {unknown}"]
    # Load the program's config exactly as it would start: with only this service's ARYL_* env.
    clean = {key: value for key, value in os.environ.items() if not key.startswith("ARYL_")}
    with mock.patch.dict(os.environ, {**clean, **aryl}, clear=True):
        try:
            load()
        except ConfigError as exc:
            problems.append(f"{name}: {exc}")
    return problems


def gpu_reservation_problems(compose: dict[str, Any]) -> list[str]:
    """Each agent reserves NVIDIA GPUs through NVML, and no two agents on the host share one."""
    problems = []
    claims: dict[str, set[str] | None] = {}  # agent -> device ids; None = all GPUs
    for name, svc in services_running(compose, "aryl-agent").items():
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        nvidia = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])]
        if not nvidia:
            problems.append(f"{name}: no NVIDIA GPU reservation (driver nvidia, capabilities [gpu])")
            continue
        if environment(svc).get("ARYL_GPUS__BACKEND") != "nvml":
            problems.append(f"{name}: must set ARYL_GPUS__BACKEND=nvml so a broken driver cannot yield fake GPUs")
        ids: set[str] | None = set()
        for device in nvidia:
            if device.get("count") == "all":
                ids = None
            elif ids is not None:
                ids |= {str(i) for i in device.get("device_ids", [])}
        claims[name] = ids
    agents = sorted(claims)
    for i, a in enumerate(agents):
        for b in agents[i + 1 :]:
            if claims[a] is None or claims[b] is None or claims[a] & claims[b]:
                problems.append(f"{a} and {b} can see the same GPUs: the scheduler would get one GPU twice")
    return problems


def agent_identity_problems(compose: dict[str, Any]) -> list[str]:
    """Agents on one host need distinct hostnames (the server id), else they are one server."""
    names = {
        name: environment(svc).get("ARYL_AGENT__HOSTNAME") or svc.get("hostname")
        for name, svc in services_running(compose, "aryl-agent").items()
    }
    problems = [f"{svc}: no ARYL_AGENT__HOSTNAME or hostname" for svc, host in names.items() if not host]
    hosts = [h for h in names.values() if h]
    if len(hosts) != len(set(hosts)):
        problems.append(f"agents share a hostname: {names}")
    return problems


def dependency_problems(compose: dict[str, Any]) -> list[str]:
    services = compose["services"]
    scheduler = services.get("scheduler", {})
    problems = []
    if scheduler.get("depends_on", {}).get("postgres", {}).get("condition") != "service_healthy":
        problems.append("scheduler must depend on postgres with condition service_healthy")
    if "healthcheck" not in services.get("postgres", {}):
        problems.append("postgres needs a healthcheck for service_healthy to mean anything")
    return problems


_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` (the default also when VAR is set but empty)."""
    return _VARIABLE.sub(lambda m: env.get(m["name"]) or (m["default"] or ""), value)


def published_ports(service: dict[str, Any], env: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(host address, host port, container port)`` per published port; host address "" when the
    entry names none (Docker then listens on every interface)."""
    bindings = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):  # long syntax
            bindings.append((str(entry.get("host_ip", "")), str(entry.get("published", "")), str(entry["target"])))
            continue
        parts = interpolate(str(entry), env).split("/")[0].rsplit(":", 2)
        host_ip, host_port, target = [""] * (3 - len(parts)) + parts
        bindings.append((host_ip.strip("[]"), host_port, target))
    return bindings


# Who may be reached from outside the host, where, and which variable moves it (see the top of
# docker-compose.yml): the scheduler's unauthenticated control API on loopback, the router (the
# inference clients' front door, with no control over jobs) on every interface; nothing else.
PUBLISHED = {
    "scheduler": ("ARYL_PUBLISH_ADDRESS", "127.0.0.1", "50051"),
    "router": ("ARYL_ROUTER_PUBLISH_ADDRESS", "0.0.0.0", "8080"),
}


def port_binding_problems(compose: dict[str, Any], env: dict[str, str]) -> list[str]:
    problems = []
    for name, svc in compose["services"].items():
        bindings = published_ports(svc, env)
        if name not in PUBLISHED:
            problems += [f"{name}: publishes {b}; only {sorted(PUBLISHED)} may" for b in bindings]
            continue
        variable, default, port = PUBLISHED[name]
        expected = [(env.get(variable) or default, port, port)]
        if bindings != expected:
            problems.append(f"{name}: publishes {bindings}, expected {expected} ({variable}={env.get(variable)!r})")
    return problems


def dockerfile_problems(dockerfile: str, dockerignore: str) -> list[str]:
    lines = [line.strip() for line in dockerfile.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    instructions = [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]
    problems = []
    if ("FROM", "python:3.11-slim") not in instructions:
        problems.append("must build FROM python:3.11-slim")
    if not any(op == "COPY" for op, _ in instructions):
        problems.append("never COPYs the project into the image")
    if not any(op == "RUN" and "pip install" in arg and "-e" not in arg.split() for op, arg in instructions):
        problems.append("no RUN pip install of the project (a regular, non-editable install)")
    users = [arg for op, arg in instructions if op == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append("must switch to a non-root USER")
    if any(op == "ENTRYPOINT" for op, _ in instructions):
        problems.append("must not set an ENTRYPOINT: compose names each service's program")
    ignored = {
        line.strip().rstrip("/") for line in dockerignore.splitlines() if line.strip() and not line.startswith("#")
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]} | {
        pattern.rstrip("*") for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    problems += [f".dockerignore excludes {name}, which pip install needs" for name in sorted(needed & ignored)]
    problems += [f".dockerignore should exclude {name}" for name in (".git", ".venv") if name not in ignored]
    return problems


# --------------------------------------------------------------------------------------------------
# The real files


COMMANDED = sorted(name for name, svc in load_compose()["services"].items() if "command" in svc)


def test_compose_runs_every_daemon() -> None:
    programs = {command_words(load_compose()["services"][name])[0] for name in COMMANDED}
    assert programs == {"aryl-scheduler", "aryl-agent", "aryl-router"}
    assert {"agent-train-1", "agent-infer-1", "router", "scheduler", "postgres"} <= set(load_compose()["services"])


@pytest.mark.parametrize("name", COMMANDED)
def test_command_is_an_installed_console_script(name: str) -> None:
    assert command_problems(name, load_compose()["services"][name], declared_scripts()) == []


@pytest.mark.parametrize("name", COMMANDED)
def test_environment_is_understood_and_valid(name: str) -> None:
    assert environment_problems(name, load_compose()["services"][name]) == []


def test_agents_reserve_their_own_nvidia_gpus() -> None:
    compose = load_compose()
    pools = {environment(svc)["ARYL_AGENT__POOL"] for svc in services_running(compose, "aryl-agent").values()}
    assert pools == {"training", "inference"}
    assert gpu_reservation_problems(compose) == []
    assert agent_identity_problems(compose) == []


def test_scheduler_waits_for_a_healthy_postgres() -> None:
    assert dependency_problems(load_compose()) == []


def test_daemons_point_at_the_services_they_need() -> None:
    compose = load_compose()
    services = compose["services"]
    scheduler_env = environment(services["scheduler"])
    port = scheduler_env["ARYL_SERVER__LISTEN"].rsplit(":", 1)[1]
    assert scheduler_env["ARYL_SERVER__LISTEN"].startswith("0.0.0.0:")  # reachable from other containers
    for name, svc in {**services_running(compose, "aryl-agent"), **services_running(compose, "aryl-router")}.items():
        env = environment(svc)
        address = env.get("ARYL_AGENT__SCHEDULER_ADDRESS") or env.get("ARYL_ROUTER__SCHEDULER_ADDRESS")
        assert address == f"scheduler:{port}", name
    postgres = environment(services["postgres"])
    user, password, db = postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"], postgres["POSTGRES_DB"]
    assert scheduler_env["ARYL_DATABASE__URL"] == f"postgresql+psycopg2://{user}:{password}@postgres:5432/{db}"


def test_scheduler_is_published_on_loopback_and_the_router_for_clients() -> None:
    compose = load_compose()
    assert published_ports(compose["services"]["scheduler"], {}) == [("127.0.0.1", "50051", "50051")]
    assert published_ports(compose["services"]["router"], {}) == [("0.0.0.0", "8080", "8080")]
    assert port_binding_problems(compose, {}) == []
    # The documented variables move each binding, and only its own.
    moved = {"ARYL_PUBLISH_ADDRESS": "10.0.0.5", "ARYL_ROUTER_PUBLISH_ADDRESS": "127.0.0.1"}
    assert published_ports(compose["services"]["scheduler"], moved) == [("10.0.0.5", "50051", "50051")]
    assert published_ports(compose["services"]["router"], moved) == [("127.0.0.1", "8080", "8080")]
    assert port_binding_problems(compose, moved) == []
    assert published_ports(compose["services"]["router"], {"ARYL_PUBLISH_ADDRESS": "10.0.0.5"})[0][0] == "0.0.0.0"
    header = COMPOSE.read_text().split("services:", 1)[0]
    assert "ARYL_PUBLISH_ADDRESS" in header and "ARYL_ROUTER_PUBLISH_ADDRESS" in header


def test_image_installs_the_project() -> None:
    assert DOCKERFILE.exists() and DOCKERIGNORE.exists()
    assert dockerfile_problems(DOCKERFILE.read_text(), DOCKERIGNORE.read_text()) == []
    for name in COMMANDED:
        assert load_compose()["services"][name].get("build") == ".", f"{name} does not build this Dockerfile"


def scheduler_healthcheck_code() -> str:
    test = load_compose()["services"]["scheduler"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], test
    return test[3]


def test_scheduler_healthcheck_passes_against_a_real_scheduler(scheduler) -> None:
    code = scheduler_healthcheck_code()
    assert "127.0.0.1:50051" in code
    healthy = subprocess.run(
        [sys.executable, "-c", code.replace("127.0.0.1:50051", scheduler.address)], capture_output=True, timeout=30,
        check=False,
    )
    assert healthy.returncode == 0, healthy.stderr.decode()[-2000:]


def test_scheduler_healthcheck_fails_without_a_scheduler() -> None:
    down = subprocess.run(
        [sys.executable, "-c", scheduler_healthcheck_code().replace("127.0.0.1:50051", "127.0.0.1:1")],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert down.returncode != 0


# --------------------------------------------------------------------------------------------------
# The checkers catch what they are for


def broken(mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    compose = copy.deepcopy(load_compose())
    mutate(compose)
    return compose


def test_command_checker_rejects_unknown_programs() -> None:
    scripts = declared_scripts()
    assert command_problems("x", {"command": "aryl-schedular"}, scripts)
    assert command_problems("x", {"command": ["python", "-m", "scheduler_service.main"]}, scripts)
    assert command_problems("x", {"command": "aryl-agent"}, {**scripts, "aryl-agent": "elsewhere:main"})
    assert command_problems("x", {"command": "aryl-ghost"}, {**scripts, "aryl-ghost": "ghost:main"})


@pytest.mark.parametrize(
    ("command", "env", "problem"),
    [
        ("aryl-scheduler", {"ARYL_DATABASE__URLL": "sqlite://"}, "does not understand"),  # typo
        ("aryl-scheduler", {"ARYL_AGENT__POOL": "training"}, "does not understand"),  # another program's key
        ("aryl-scheduler", {"ARYL_SERVER__WORKER_THREADS": "0"}, "worker_threads"),  # bad value
        ("aryl-scheduler", {"ARYL_DATABASE__AUTO_MIGRATE": True}, "compose rejects booleans"),
        ("aryl-agent", {"ARYL_AGENT__POOL": "batch"}, "agent.pool"),
        ("aryl-agent", {"ARYL_GPUS__BACKEND": "cuda"}, "gpus.backend"),
        ("aryl-router", {"ARYL_ROUTER__SOURCE": "r"}, "servers_needed is required"),
        ("arylctl", {"ARYL_SERVER__LISTEN": "0.0.0.0:1"}, "no known config"),
    ],
)
def test_environment_checker_rejects_bad_settings(command: str, env: dict[str, Any], problem: str) -> None:
    problems = environment_problems("x", {"command": command, "environment": env})
    assert any(problem in p for p in problems), problems


def test_environment_checker_reads_list_form() -> None:
    assert environment_problems("x", {"command": "aryl-agent", "environment": ["ARYL_AGENT__POOL=inference"]}) == []
    assert environment_problems("x", {"command": "aryl-agent", "environment": ["ARYL_AGENT__POOL=batch"]})


def test_gpu_checker_rejects_missing_or_shared_gpus() -> None:
    def no_reservation(c: dict[str, Any]) -> None:
        del c["services"]["agent-train-1"]["deploy"]

    def both_all(c: dict[str, Any]) -> None:
        for name in ("agent-train-1", "agent-infer-1"):
            c["services"][name]["deploy"]["resources"]["reservations"]["devices"][0] = {
                "driver": "nvidia", "count": "all", "capabilities": ["gpu"]
            }

    def same_ids(c: dict[str, Any]) -> None:
        for name in ("agent-train-1", "agent-infer-1"):
            c["services"][name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] = ["3"]

    def fake_gpus(c: dict[str, Any]) -> None:
        c["services"]["agent-infer-1"]["environment"]["ARYL_GPUS__BACKEND"] = "auto"

    for mutate in (no_reservation, both_all, same_ids, fake_gpus):
        assert gpu_reservation_problems(broken(mutate)), mutate.__name__


def test_identity_checker_rejects_agents_with_one_hostname() -> None:
    def same_host(c: dict[str, Any]) -> None:
        c["services"]["agent-infer-1"]["environment"]["ARYL_AGENT__HOSTNAME"] = "agent-train-1"

    assert agent_identity_problems(broken(same_host))


def test_dependency_checker_rejects_a_scheduler_that_does_not_wait() -> None:
    def started_only(c: dict[str, Any]) -> None:
        c["services"]["scheduler"]["depends_on"]["postgres"]["condition"] = "service_started"

    def no_healthcheck(c: dict[str, Any]) -> None:
        del c["services"]["postgres"]["healthcheck"]

    assert dependency_problems(broken(started_only))
    assert dependency_problems(broken(no_healthcheck))


@pytest.mark.parametrize(
    ("service", "ports"),
    [
        ("scheduler", ["50051:50051"]),  # every interface, implicitly
        ("scheduler", ["0.0.0.0:50051:50051"]),
        ("scheduler", [{"target": 50051, "published": 50051}]),
        ("scheduler", ["${ARYL_PUBLISH_ADDRESS:-0.0.0.0}:50051:50051"]),
        ("router", ["127.0.0.1:8080:8080"]),  # ignores its variable's default
        ("postgres", ["5432:5432"]),
        ("agent-train-1", ["127.0.0.1:50052:50052"]),
    ],
)
def test_port_checker_rejects_other_bindings(service: str, ports: list[Any]) -> None:
    def publish(c: dict[str, Any]) -> None:
        c["services"][service]["ports"] = ports

    assert port_binding_problems(broken(publish), {})


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda d: d.replace("python:3.11-slim", "python:3.12"), "FROM python:3.11-slim"),
        (lambda d: d.replace("pip install /src", "echo skipped /src"), "pip install"),
        (lambda d: d.replace("pip install /src", "pip install -e /src"), "pip install"),
        (lambda d: d.replace("USER aryl", "USER root"), "non-root"),
        (lambda d: d + "\nENTRYPOINT [\"aryl-scheduler\"]\n", "ENTRYPOINT"),
    ],
)
def test_dockerfile_checker_rejects_broken_images(edit: Callable[[str], str], problem: str) -> None:
    problems = dockerfile_problems(edit(DOCKERFILE.read_text()), DOCKERIGNORE.read_text())
    assert any(problem in p for p in problems), problems


def test_dockerfile_checker_rejects_an_ignore_file_that_hides_the_sources() -> None:
    problems = dockerfile_problems(DOCKERFILE.read_text(), DOCKERIGNORE.read_text() + "\nnode_agent/\n")
    assert any("node_agent" in p for p in problems), problems
