"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

Every service command must be one of our console scripts, every ``ARYL_*`` variable a service sets
must be one its program understands with a value its config accepts, the agents must get NVIDIA
GPUs without sharing them, and the image must install the project. The checkers
(``tests/fixtures/compose_checks.py``) each return a list of problems; the last tests feed them broken
input to show they can fail. The two-host layout: ``tests/e2e/test_compose_across_servers.py``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from node_agent.config import AgentConfig
from tests.fixtures.compose_checks import (
    COMPOSE,
    CONFIG_OF,
    DOCKERFILE,
    DOCKERIGNORE,
    ROLE_TARGETS,
    ROOT,
    agent_identity_problems,
    command_problems,
    command_words,
    declared_scripts,
    dependency_problems,
    dockerfile_problems,
    environment,
    environment_problems,
    gpu_reservation_problems,
    load_compose,
    port_binding_problems,
    published_ports,
    services_running,
)
from tests.harness import security_env

# --------------------------------------------------------------------------------------------------
# The real files


COMMANDED = sorted(name for name, svc in load_compose()["services"].items() if "command" in svc)


def test_compose_runs_every_daemon() -> None:
    programs = {command_words(load_compose()["services"][name])[0] for name in COMMANDED}
    assert programs == {"aryl-scheduler", "aryl-agent", "aryl-router", "arylctl"}  # arylctl: the pki service
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
        service = load_compose()["services"][name]
        program = command_words(service)[0]
        target = "scheduler" if program == "arylctl" else ROLE_TARGETS[program]  # pki: the scheduler's image
        assert service["build"]["context"] == ".", f"{name} does not build this Dockerfile"
        assert service["build"]["target"] == target, f"{name} must build the {target} target"
        assert service["image"] == f"aryl-{target}:local"


def test_extras_keep_numba_and_matplotlib_out_of_the_daemons() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = lambda requirements: {re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0] for r in requirements}  # noqa: E731
    assert not names(project["dependencies"]) & {"numba", "llvmlite", "matplotlib"}
    extras = project["optional-dependencies"]
    assert "numba" in names(extras["scheduler"])
    assert {"numba", "matplotlib"} <= names(extras["sim"])
    assert not names(extras["scheduler"]) & {"torch", "matplotlib"}  # the scheduler image stays small
    # make demo / make test install .[dev]: they get everything, torch as its CPU-only build
    assert "aryl[scheduler,sim,dl2]" in extras["dev"] and "torch==2.13.0+cpu" in extras["dev"]


def test_scheduler_without_numba_says_how_to_install_it_in_one_line() -> None:
    hide_numba = (
        "import sys; sys.modules['numba'] = None; from scheduler_service.main import main; "
        "sys.exit(main(['--listen', '127.0.0.1:0', '--database-url', 'sqlite://']))"
    )
    result = subprocess.run([sys.executable, "-c", hide_numba], capture_output=True, text=True, timeout=60,
                            check=False, cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "aryl-scheduler: the scheduler needs numba, which is not installed: pip install 'aryl[scheduler]'"
    ]


def test_agents_stop_their_workers_with_the_container_and_leave_them_time() -> None:
    """A container's end kills every process in it: the agent must not leave its workers for a successor
    but stop them (SIGTERM, the grace period to checkpoint), and compose waits longer than that grace."""
    grace = AgentConfig().agent.stop_grace_s
    for name, svc in services_running(load_compose(), "aryl-agent").items():
        assert environment(svc)["ARYL_AGENT__KEEP_WORKERS_ON_EXIT"] == "false", name
        period = svc["stop_grace_period"]
        assert period.endswith("s") and float(period[:-1]) > grace, (name, period, grace)


def test_no_gpu_and_offline_overrides_fit_the_compose_file() -> None:
    base = load_compose()["services"]
    no_gpu = yaml.safe_load((ROOT / "deploy" / "compose.no-gpu.yml").read_text())["services"]
    offline = yaml.safe_load((ROOT / "deploy" / "compose.offline.yml").read_text())["services"]
    assert set(no_gpu) - set(base) == {"model-server"} and set(offline) <= set(base)
    for name in ("agent-train-1", "agent-infer-1"):
        merged = {**base[name], "environment": {**environment(base[name]), **environment(no_gpu[name])}}
        assert environment(merged)["ARYL_GPUS__BACKEND"] == "fake"
        assert environment_problems(name, merged) == []
    endpoint = environment(no_gpu["agent-infer-1"])["ARYL_AGENT__INFERENCE_ENDPOINT"]
    assert endpoint == "http://model-server:8000" and "--port 8000" in no_gpu["model-server"]["command"]


def healthcheck(role: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """deploy/healthcheck.py (the images' aryl-healthcheck) as the container runs it, with ``env``."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("ARYL_")}
    return subprocess.run([sys.executable, str(ROOT / "deploy" / "healthcheck.py"), role], capture_output=True,
                          text=True, timeout=30, check=False, env={**clean, **env})


def test_every_daemon_runs_with_tls_and_a_token_from_the_pki_volume() -> None:
    """Secure by default: no daemon is configured insecure; each names its certificate, key, CA and token
    (agents and the router their own, by their ids), all in the `pki` volume the `pki` service fills
    (arylctl certs init, before the scheduler starts)."""
    compose = load_compose()
    services = compose["services"]
    assert "pki" in compose["volumes"]
    pki = services["pki"]
    assert command_words(pki)[:3] == ["arylctl", "certs", "init"] and "pki:/var/lib/aryl/pki" in pki["volumes"]
    assert services["scheduler"]["depends_on"]["pki"] == {"condition": "service_completed_successfully"}
    env = environment(services["scheduler"])
    assert not any(key.endswith("__INSECURE") for name in services for key in environment(services[name]))
    for key in ("TLS_CERT", "TLS_KEY", "TLS_CLIENT_CA", "TOKENS_FILE"):
        assert env[f"ARYL_SECURITY__{key}"].startswith("/var/lib/aryl/pki/")
    words = command_words(pki)
    for name, svc in services_running(compose, "aryl-agent").items():
        agent = environment(svc)
        server_id = agent["ARYL_AGENT__HOSTNAME"]
        assert words[words.index(server_id) - 1] == "--agent", name
        assert agent["ARYL_AGENT__TLS_CERT"] == f"/var/lib/aryl/pki/agent-{server_id}.crt", name
        assert agent["ARYL_AGENT__TOKEN_FILE"] == f"/var/lib/aryl/pki/token-{server_id}", name
        assert "pki:/var/lib/aryl/pki:ro" in svc["volumes"], name
    for name, svc in services_running(compose, "aryl-router").items():
        router = environment(svc)
        router_id = router["ARYL_ROUTER__TOKEN_FILE"].rsplit("token-", 1)[1]
        assert words[words.index(router_id) - 1] == "--router", name
        assert router["ARYL_ROUTER__TLS_CERT"] == f"/var/lib/aryl/pki/router-{router_id}.crt", name


def test_compose_healthchecks_are_the_images_own() -> None:
    services = load_compose()["services"]
    assert services["scheduler"]["healthcheck"]["test"] == ["CMD", "aryl-healthcheck", "scheduler"]


def test_scheduler_healthcheck_passes_against_a_real_scheduler(scheduler) -> None:
    # The test scheduler runs with TLS and tokens (the default): the check presents its certificate.
    secure = {key: value for key, value in security_env().items() if key.startswith("ARYL_SECURITY__")}
    port = scheduler.address.rsplit(":", 1)[1]
    healthy = healthcheck("scheduler", {"ARYL_SERVER__LISTEN": f"0.0.0.0:{port}", **secure})
    assert healthy.returncode == 0, healthy.stderr
    plaintext = healthcheck("scheduler", {"ARYL_SERVER__LISTEN": f"0.0.0.0:{port}", "ARYL_SECURITY__INSECURE": "true"})
    assert plaintext.returncode == 1  # a TLS port does not answer plaintext


def test_healthchecks_fail_without_their_daemon() -> None:
    down = {"scheduler": {"ARYL_SERVER__LISTEN": "0.0.0.0:1"}, "router": {"ARYL_ROUTER__LISTEN": "0.0.0.0:1"},
            "agent": {"ARYL_AGENT__LOGS_PORT": "1"}}
    for role, env in down.items():
        result = healthcheck(role, env)
        assert result.returncode == 1, (role, result.stderr)
        assert result.stderr.startswith(f"aryl-healthcheck {role}: ") and result.stderr.count("\n") == 1
    assert healthcheck("nonsense", {}).returncode == 2


def test_agent_healthcheck_passes_against_a_serving_port() -> None:
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        plaintext = {"ARYL_AGENT__LOGS_PORT": str(port), "ARYL_AGENT__INSECURE": "true"}
        assert healthcheck("agent", plaintext).returncode == 0
    finally:
        server.stop(None)


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
        (lambda d: d.replace("python:3.11.13-slim-bookworm", "python:3.11-slim"), "pinned"),
        (lambda d: d.replace("FROM ${BASE_IMAGE} AS runtime", "FROM python:3.12 AS runtime"), "FROM ${BASE_IMAGE}"),
        (lambda d: d.replace("pip wheel", "pip download"), "wheel"),
        (lambda d: d + "\nRUN pip install /src && rm -rf /src\n", "COPY-then-rm"),
        (lambda d: d.replace("FROM core AS agent", "FROM core AS agent\nCOPY . /src"), "whole source tree"),
        (lambda d: d.replace("pip install --no-deps --force-reinstall /wheels/aryl-*.whl", "true"), "built wheel"),
        (lambda d: d.replace("--force-reinstall /wheels/aryl-*.whl", "-e /src"), "built wheel"),
        (lambda d: d.replace('"$(ls /deps/aryl-*.whl)[scheduler]"', "/deps/aryl-*.whl"), "numba"),
        (lambda d: d.replace("pip install /deps/aryl-*.whl", "pip install /deps/aryl-*.whl[sim]"), "simul"),
        (lambda d: d.replace("USER aryl\nEXPOSE 8080", "USER root\nEXPOSE 8080"), "non-root"),
        (lambda d: d.replace('ENTRYPOINT ["tini", "--"]', ""), "tini"),
        (lambda d: d + '\nENTRYPOINT ["aryl-scheduler"]\n', "tini"),
        (lambda d: d.replace('CMD ["aryl-healthcheck", "agent"]', "NONE"), "HEALTHCHECK"),
        (lambda d: d.replace("AS router", "AS proxy"), "no build target 'router'"),
    ],
)
def test_dockerfile_checker_rejects_broken_images(edit: Callable[[str], str], problem: str) -> None:
    dockerfile = DOCKERFILE.read_text()
    assert edit(dockerfile) != dockerfile
    problems = dockerfile_problems(edit(dockerfile), DOCKERIGNORE.read_text())
    assert any(problem in p for p in problems), problems


def test_dockerfile_checker_rejects_an_ignore_file_that_hides_the_sources() -> None:
    problems = dockerfile_problems(DOCKERFILE.read_text(), DOCKERIGNORE.read_text() + "\nnode_agent/\n")
    assert any("node_agent" in p for p in problems), problems


def test_compose_test_script_parses_and_always_tears_down() -> None:
    """`make compose-test` runs deploy/compose-test.sh (too slow and root-only for `make test`, which
    checks its shape here): the scripts parse, and the teardown is an EXIT trap set before the stack starts."""
    script = (ROOT / "deploy" / "compose-test.sh").read_text()
    for path, shell in (("deploy/compose-test.sh", "bash"), ("deploy/postgres/entrypoint.sh", "sh")):
        parsed = subprocess.run([shell, "-n", str(ROOT / path)], capture_output=True, text=True, check=False)
        assert parsed.returncode == 0, (path, parsed.stderr)
    assert script.index("trap teardown EXIT") < script.index(" up -d ")
    assert "down -v --remove-orphans" in script
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^compose-test:.*\n\tbash deploy/compose-test\.sh$", makefile, re.MULTILINE)


# --------------------------------------------------------------------------------------------------
# Monitoring: Prometheus scrapes every daemon's /metrics port; Grafana's dashboard asks for metrics
# that exist.

PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "aryl.json"
METRICS_MODULES = ("scheduler_service/metrics.py", "node_agent/metrics.py", "inference_router/metrics.py")
_METRIC_NAME = re.compile(r"\baryl_[a-z_]+\b")
_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def scrape_targets(config: dict[str, Any]) -> set[str]:
    return {target for job in config["scrape_configs"] for static in job.get("static_configs", [])
            for target in static["targets"]}


def monitoring_problems(compose: dict[str, Any], prometheus: dict[str, Any]) -> list[str]:
    """Every Aryl daemon serves metrics on all its container's interfaces, unpublished, and is
    scraped; the monitoring services pin their images by tag and sit behind the monitoring profile."""
    problems = []
    targets = scrape_targets(prometheus)
    for name, svc in compose["services"].items():
        program = command_words(svc)[:1]
        if not program or program[0] not in CONFIG_OF:
            continue
        env = environment(svc)
        port = str(env.get("ARYL_METRICS__PORT", ""))
        if not port or port == "0":
            problems.append(f"{name}: no ARYL_METRICS__PORT, so Prometheus has nothing to scrape")
            continue
        if env.get("ARYL_METRICS__LISTEN_HOST") != "0.0.0.0":
            problems.append(f"{name}: metrics bound to loopback cannot be scraped from the prometheus container")
        if f"{name}:{port}" not in targets:
            problems.append(f"{name}: {name}:{port} is not a target of {PROMETHEUS.name} ({sorted(targets)})")
        if any(port == container for _, _, container in published_ports(svc, {})):
            problems.append(f"{name}: publishes its metrics port {port} on the host")
    for name in ("prometheus", "grafana"):
        svc = compose["services"].get(name)
        if svc is None:
            problems.append(f"no {name} service")
            continue
        image = svc.get("image", "")
        if ":" not in image or image.endswith(":latest"):
            problems.append(f"{name}: image {image!r} is not pinned by tag")
        if svc.get("profiles") != ["monitoring"]:
            problems.append(f"{name}: must be in the monitoring profile (the default stack needs no image registry)")
        if "healthcheck" not in svc:
            problems.append(f"{name}: no healthcheck")
    return problems


def _datasources(node: Any) -> list[dict[str, Any]]:
    """Every ``datasource`` reference in a dashboard (panels' and their queries')."""
    if isinstance(node, dict):
        found = [node["datasource"]] if isinstance(node.get("datasource"), dict) else []
        return found + [d for value in node.values() for d in _datasources(value)]
    return [d for value in node for d in _datasources(value)] if isinstance(node, list) else []


def dashboard_problems(dashboard: dict[str, Any], known: set[str]) -> list[str]:
    """Each panel query names only metrics the daemons export (histogram and counter suffixes allowed), and
    the dashboard pins no data source: each names the ``datasource`` variable (a Prometheus data source
    chosen when it is imported or opened, the provisioned default otherwise)."""
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    variable = variables.get("datasource", {})
    problems = [] if (variable.get("type"), variable.get("query")) == ("datasource", "prometheus") else [
        "no templating variable 'datasource' of type datasource (query prometheus)"]
    problems += [f"a data source pinned by uid {d.get('uid')!r}, not ${{datasource}}"
                 for d in _datasources(dashboard["panels"]) if d.get("uid") != "${datasource}"]
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for name in _METRIC_NAME.findall(target["expr"]):
                base = next((name.removesuffix(s) for s in _SUFFIXES if name.endswith(s)), name)
                if name not in known and base not in known:
                    problems.append(f"panel {panel['title']!r}: {name} is not exported by any daemon")
    return problems


def exported_metric_names() -> set[str]:
    return {name for module in METRICS_MODULES for name in _METRIC_NAME.findall((ROOT / module).read_text())}


def test_prometheus_scrapes_every_daemon_and_monitoring_is_pinned_and_optional() -> None:
    prometheus = yaml.safe_load(PROMETHEUS.read_text())
    assert monitoring_problems(load_compose(), prometheus) == []


def test_grafana_is_provisioned_with_a_dashboard_of_exported_metrics() -> None:
    compose = load_compose()
    mounts = [str(v).split(":")[0] for v in compose["services"]["grafana"]["volumes"]]
    assert "./deploy/grafana/provisioning" in mounts and "./deploy/grafana/dashboards" in mounts
    datasource = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(queries) >= 15
    for metric in ("aryl_jobs", "aryl_scheduler_job_queueing_seconds_bucket",
                   "aryl_agent_report_latency_seconds_bucket",
                   "aryl_router_requests_total", "aryl_gpus_allocated", "aryl_scheduler_loan_steps_total"):
        assert any(metric in q for q in queries), metric
    assert dashboard_problems(dashboard, exported_metric_names()) == []


def test_monitoring_checkers_find_problems() -> None:
    compose = load_compose()
    prometheus = yaml.safe_load(PROMETHEUS.read_text())
    broken = copy.deepcopy(compose)
    del broken["services"]["router"]["environment"]["ARYL_METRICS__PORT"]
    broken["services"]["grafana"]["image"] = "grafana/grafana:latest"
    broken["services"]["prometheus"].pop("profiles")
    problems = monitoring_problems(broken, prometheus)
    assert any("router: no ARYL_METRICS__PORT" in p for p in problems)
    assert any("not pinned" in p for p in problems) and any("monitoring profile" in p for p in problems)
    unscraped = {"scrape_configs": [{"job_name": "x", "static_configs": [{"targets": ["scheduler:9464"]}]}]}
    assert any("agent-train-1:9465 is not a target" in p for p in monitoring_problems(compose, unscraped))
    fake = {"panels": [{"title": "t", "targets": [{"expr": "rate(aryl_no_such_thing_total[5m])"}]}]}
    assert dashboard_problems(fake, exported_metric_names()) == [
        "no templating variable 'datasource' of type datasource (query prometheus)",
        "panel 't': aryl_no_such_thing_total is not exported by any daemon"]
    pinned = json.loads(DASHBOARD.read_text())
    pinned["panels"][1]["targets"][0]["datasource"] = {"type": "prometheus", "uid": "aryl-prometheus"}
    assert dashboard_problems(pinned, exported_metric_names()) == [
        "a data source pinned by uid 'aryl-prometheus', not ${datasource}"]
