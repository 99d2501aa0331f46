"""A cluster across servers, checked without a Docker engine: the control host (docker-compose.yml with
deploy/compose.control.yml) and one agent per GPU server (deploy/compose.agent.yml), joined by the
bundle ``arylctl certs add --bundle`` makes (issue 36). ``make compose-test`` runs both for real."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import yaml

from arylctl import certs
from arylctl.cli import build_parser
from node_agent.config import AgentConfig
from tests.fixtures.compose_checks import (
    ROOT,
    MissingVariable,
    command_problems,
    command_words,
    declared_scripts,
    environment,
    environment_problems,
    gpu_reservation_problems,
    interpolated,
    load_compose,
    services_running,
)

AGENT_COMPOSE = ROOT / "deploy" / "compose.agent.yml"
CONTROL_COMPOSE = ROOT / "deploy" / "compose.control.yml"
GPU_SERVER = {"ARYL_SERVER_ID": "gpu-7", "ARYL_SCHEDULER_ADDRESS": "10.0.0.5:50051",
              "ARYL_ADVERTISE_ADDRESS": "10.0.0.7"}


def test_a_gpu_server_runs_one_agent_with_every_gpu_on_the_host_network_from_its_bundle(tmp_path: Path) -> None:
    compose = interpolated(yaml.safe_load(AGENT_COMPOSE.read_text()), GPU_SERVER)
    (name, agent), = services_running(compose, "aryl-agent").items()
    assert agent["network_mode"] == "host" and "ports" not in agent  # workers of other servers reach its ports
    assert gpu_reservation_problems(compose) == []
    assert agent["deploy"]["resources"]["reservations"]["devices"][0]["count"] == "all"
    assert environment_problems(name, agent) == []
    assert command_problems(name, agent, declared_scripts()) == []
    env = environment(agent)
    assert (env["ARYL_AGENT__HOSTNAME"], env["ARYL_AGENT__SCHEDULER_ADDRESS"], env["ARYL_AGENT__ADVERTISE_ADDRESS"]) \
        == ("gpu-7", "10.0.0.5:50051", "10.0.0.7")
    assert env["ARYL_AGENT__KEEP_WORKERS_ON_EXIT"] == "false" and env["ARYL_GPUS__BACKEND"] == "nvml"
    assert float(agent["stop_grace_period"].removesuffix("s")) > AgentConfig().agent.stop_grace_s
    assert not any(key.endswith("__INSECURE") for key in env)
    # The files it reads are the bundle's, where the bundle unpacks (pki/ mounted read-only), and agent.env
    # sets what the file requires of it.
    assert "/etc/aryl/pki:/var/lib/aryl/pki:ro" in agent["volumes"]
    pki = tmp_path / "pki"
    certs.init(pki, certs.DevCluster(agents=("gpu-7",)))
    with tarfile.open(fileobj=io.BytesIO(certs.agent_bundle(pki, "gpu-7", "10.0.0.5:50051"))) as tar:
        unpacked = {m.name.removeprefix("pki/") for m in tar.getmembers() if m.name.startswith("pki/")}
        env_file = tar.extractfile("agent.env")
        assert env_file is not None
        agent_env = {key: value for key, value in (line.split("=", 1) for line in env_file.read().decode().split())}
    for key in ("TLS_CA", "TLS_CERT", "TLS_KEY", "TOKEN_FILE"):
        path = env[f"ARYL_AGENT__{key}"]
        assert path.startswith("/var/lib/aryl/pki/") and path.removeprefix("/var/lib/aryl/pki/") in unpacked, key
    assert agent_env == {"ARYL_SERVER_ID": "gpu-7", "ARYL_SCHEDULER_ADDRESS": "10.0.0.5:50051"}
    for variable in GPU_SERVER:  # each one compose refuses the file without, naming it
        with pytest.raises(MissingVariable, match=variable):
            interpolated(yaml.safe_load(AGENT_COMPOSE.read_text()), {**GPU_SERVER, variable: ""})


def test_the_control_host_is_the_compose_file_s_control_services_with_a_certificate_for_its_address() -> None:
    base = load_compose()["services"]
    raw = yaml.safe_load(CONTROL_COMPOSE.read_text())["services"]
    assert set(raw) <= set(base)
    control = interpolated(raw, {"ARYL_SCHEDULER_NAME": "10.0.0.5", "ARYL_PUBLISH_ADDRESS": "10.0.0.5"})
    pki = {**base["pki"], **control["pki"]}
    assert command_problems("pki", pki, declared_scripts()) == []
    words = command_words(pki)
    names = [words[i + 1] for i, word in enumerate(words) if word == "--scheduler-name"]
    assert names == ["scheduler", "localhost", "127.0.0.1", "10.0.0.5"]  # the compose network's, and the GPU servers'
    assert "--agent" not in words and "--router" in words  # agents are issued one by one (certs add --bundle)
    parsed = build_parser().parse_args(words[1:])
    assert parsed.scheduler_name == names
    for variable in ("ARYL_SCHEDULER_NAME", "ARYL_PUBLISH_ADDRESS"):  # without them the GPU servers could not connect
        with pytest.raises(MissingVariable, match=variable):
            interpolated(raw, {"ARYL_SCHEDULER_NAME": "x", "ARYL_PUBLISH_ADDRESS": "y", variable: ""})
