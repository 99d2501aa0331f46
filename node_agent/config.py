"""The node agent's typed configuration: defaults < config file < ``ARYL_*`` environment < CLI flags.

Same conventions as the scheduler and the router (one loader, ``aryl_common.config``): sections,
environment variables ``ARYL_<SECTION>__<KEY>`` (e.g. ``ARYL_AGENT__SCHEDULER_ADDRESS``), unknown
keys are errors, and nothing else in the agent reads the environment. Command-line flags are
applied last, by ``load_agent_config(path, overrides)``, so ``--scheduler`` beats
``ARYL_AGENT__SCHEDULER_ADDRESS``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from aryl_common.config import (
    ArylSettings,
    ConfigSection,
    LoggingConfig,
    apply_overrides,
    load_settings,
)
from aryl_common.metrics import MetricsConfig
from aryl_common.security import ClientSecurityFields


class AgentSection(ClientSecurityFields):
    scheduler_address: str = Field(
        "127.0.0.1:50051", min_length=1,
        description="host:port of the scheduler; several schedulers sharing one database comma-separated "
                    "(a:50051,b:50051): the agent follows the leader (docs/ha.md)",
    )
    hostname: str = Field(
        default_factory=socket.gethostname, min_length=1, description="this server's name; becomes its server_id"
    )
    pool: Literal["training", "inference"] = Field("training", description="the pool this server belongs to")
    # A host name or IPv4 address without a port: the agent appends its log port to it, and it is
    # the workers' MASTER_ADDR as it stands ("10.0.0.7:50052" or "::1" would make neither work).
    advertise_address: str = Field(
        "",
        pattern=r"^([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)?$",
        description="host name or IPv4 address (no port) where the scheduler reads this server's worker logs "
        "and other servers' workers reach it (MASTER_ADDR); empty: the hostname (--advertise-address)",
    )
    rpc_timeout_s: float = Field(5.0, gt=0, description="deadline of every unary call to the scheduler")
    reconnect_max_backoff_s: float = Field(10.0, gt=0, description="cap of the reconnect backoff")
    work_dir: str = Field(
        "",
        description="where the agent keeps worker logs, its state file and exit records (and checkpoints unless "
        "checkpoint_root is set); empty: .aryl/agent-<hostname> under the working directory",
    )
    checkpoint_root: str = Field(
        "",
        description="parent of each job's ARYL_CHECKPOINT_DIR (<root>/<job_id>); production points it at a "
        "filesystem shared by all servers so a job resumes wherever it restarts; empty: <work_dir>/checkpoints",
    )
    stop_grace_s: float = Field(
        30.0, ge=0, description="SIGTERM-to-SIGKILL grace for workers whose desired state names no grace period"
    )
    ack_exit_window_s: float = Field(
        1.0, ge=0, description="after a worker acknowledged its stop with a saved checkpoint (node_agent.contract), "
        "how long it may take to exit by itself before SIGKILL to its process group (never beyond its grace period)",
    )
    keep_workers_on_exit: bool = Field(
        False,
        description="on SIGTERM/SIGINT leave the workers running for the next agent to adopt (an agent upgrade "
        "does not interrupt training; --keep-workers); default false: the agent deregisters (the scheduler "
        "shrinks or requeues its jobs at once and places nothing more there) and stops its workers",
    )
    stop_workers_on_exit: bool = Field(
        False,
        description="when the agent stops without leaving (keep_workers_on_exit, or stopped in-process): stop "
        "its workers anyway, with their grace periods",
    )
    reconcile_interval_s: float = Field(
        0.5, gt=0, description="how often the agent checks its worker processes (exits, grace deadlines)"
    )
    logs_port: int = Field(
        0, ge=-1, le=65535, description="port of the worker-log service the scheduler reads; 0: any free port; "
        "-1: do not serve logs"
    )
    logs_listen_host: str = Field("0.0.0.0", min_length=1, description="interface the worker-log service binds")
    inference_endpoint: str = Field(
        "", description="inference servers: base URL of the local model server, passed to the router"
    )
    secrets_file: str = Field(
        "", description="NAME=VALUE lines (mode 0600, the agent's own): a job env value aryl-secret:NAME is replaced "
        "by NAME's value when its worker starts (docs/security.md); empty: such jobs are refused here",
    )

    @property
    def agent_address(self) -> str:
        """What the scheduler is told as this server's address: ``advertise_address`` or the hostname."""
        return self.advertise_address or self.hostname

    @property
    def work_path(self) -> Path:
        """``work_dir``, or its default for this hostname; absolute (workers may run elsewhere)."""
        return Path(self.work_dir or f".aryl/agent-{self.hostname}").resolve()

    @property
    def checkpoint_path(self) -> Path:
        """Parent of the jobs' checkpoint directories: ``checkpoint_root`` or ``<work_dir>/checkpoints``."""
        return Path(self.checkpoint_root).resolve() if self.checkpoint_root else self.work_path / "checkpoints"


class GpusSection(ConfigSection):
    backend: Literal["auto", "nvml", "fake"] = Field(
        "auto", description="auto: NVML when it works, else fake GPUs (try-outs); production sets nvml"
    )
    fake_count: int = Field(4, ge=0, le=64, description="GPUs the fake backend pretends to have")
    fake_model: str = Field("Fake-A100-80GB", min_length=1)
    fake_memory_gb: int = Field(80, gt=0)


class UsersSection(ConfigSection):
    """Who workers run as and what they get (``node_agent.identity``, docs/security.md)."""

    run_as: Literal["agent", "owner"] = Field(
        "owner",
        description="owner (the default): an agent running as root starts each worker as its job owner's mapped "
        "uid/gid and refuses the jobs of owners it cannot map (an agent that is not root cannot switch, and runs "
        "them as itself); agent: every worker as the agent's own uid -- root for a root agent, so an explicit "
        "opt-in for single-user machines",
    )
    map: str = Field("", description="owner to uid/gid: 'alice:1001:1001, bob:1002:1002'")
    map_file: str = Field("", description="file of name:uid:gid lines (# comments); map wins for a name in both")
    use_passwd: bool = Field(False, description="a name in neither map: look it up in the system's users")
    min_uid: int = Field(
        1000, ge=0, description="use_passwd: accounts below this uid (system accounts) are refused unless mapped"
    )
    default_uid: int = Field(-1, ge=-1, description="uid for an unmapped owner; -1: refuse the job")
    default_gid: int = Field(-1, ge=-1, description="gid with default_uid")
    allow_root: bool = Field(False, description="allow jobs of user root and mappings to uid or gid 0")
    allow_loader_env: bool = Field(
        False, description="allow LD_* variables (LD_PRELOAD, LD_LIBRARY_PATH...) in a job's env; else refused"
    )
    pass_env: list[str] = Field(
        default_factory=list, description="names of the agent's environment variables every worker gets too"
    )
    path: str = Field(
        "/usr/local/bin:/usr/bin:/bin", min_length=1,
        description="the workers' PATH (not the submitter's: a command not found exits 127, and the job's message "
        "names this PATH)",
    )
    python: str = Field(
        "", description="interpreter that runs the worker shim (any Python 3; the shim is standard library only); "
        "empty: the agent's own, or, for an agent that runs workers as their owners, one every uid can reach (its "
        "own interpreter's real file, else python3 on path)"
    )


class AgentConfig(ArylSettings):
    """Everything one node agent can be told. One instance, built at start-up."""

    agent: AgentSection = AgentSection()
    gpus: GpusSection = GpusSection()
    users: UsersSection = UsersSection()
    logging: LoggingConfig = LoggingConfig()
    metrics: MetricsConfig = MetricsConfig()  # Prometheus /metrics (node_agent.metrics); off by default


def load_agent_config(
    path: str | os.PathLike[str] | None = None, overrides: dict[str, dict[str, Any]] | None = None
) -> AgentConfig:
    """File (or ``$ARYL_CONFIG``) + environment, then ``overrides`` (the CLI flags) on top."""
    return apply_overrides(load_settings(AgentConfig, path), overrides or {})
