"""The node agent's typed configuration: defaults < config file < ``ARYL_*`` environment < CLI flags.

Same conventions as the scheduler (``scheduler_service.config``): sections, environment variables
``ARYL_<SECTION>__<KEY>`` (e.g. ``ARYL_AGENT__SCHEDULER_ADDRESS``), unknown keys are errors, and
nothing else in the agent reads the environment. Command-line flags are applied last, by
``load_agent_config(path, overrides)``, so ``--scheduler`` beats ``ARYL_AGENT__SCHEDULER_ADDRESS``.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Literal

from pydantic import Field

from scheduler_service.config import (
    ArylSettings,
    ConfigSection,
    LoggingConfig,
    apply_overrides,
    load_settings,
)


class AgentSection(ConfigSection):
    scheduler_address: str = Field("127.0.0.1:50051", min_length=1, description="host:port of the scheduler")
    hostname: str = Field(
        default_factory=socket.gethostname, min_length=1, description="this server's name; becomes its server_id"
    )
    pool: Literal["training", "inference"] = Field("training", description="the pool this server belongs to")
    advertise_address: str = Field(
        "", description="address workers of other servers use to reach this one (MASTER_ADDR); empty: the hostname"
    )
    rpc_timeout_s: float = Field(5.0, gt=0, description="deadline of every unary call to the scheduler")
    reconnect_max_backoff_s: float = Field(10.0, gt=0, description="cap of the reconnect backoff")

    @property
    def agent_address(self) -> str:
        """What the scheduler is told as this server's address: ``advertise_address`` or the hostname."""
        return self.advertise_address or self.hostname


class GpusSection(ConfigSection):
    backend: Literal["auto", "nvml", "fake"] = Field(
        "auto", description="auto: NVML when it works, else fake GPUs (try-outs); production sets nvml"
    )
    fake_count: int = Field(4, ge=0, le=64, description="GPUs the fake backend pretends to have")
    fake_model: str = Field("Fake-A100-80GB", min_length=1)
    fake_memory_gb: int = Field(80, gt=0)


class AgentConfig(ArylSettings):
    """Everything one node agent can be told. One instance, built at start-up."""

    agent: AgentSection = AgentSection()
    gpus: GpusSection = GpusSection()
    logging: LoggingConfig = LoggingConfig()


def load_agent_config(
    path: str | os.PathLike[str] | None = None, overrides: dict[str, dict[str, Any]] | None = None
) -> AgentConfig:
    """File (or ``$ARYL_CONFIG``) + environment, then ``overrides`` (the CLI flags) on top."""
    return apply_overrides(load_settings(AgentConfig, path), overrides or {})
