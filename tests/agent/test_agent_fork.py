"""An agent spawns a worker that switches uid with fork(), never running gRPC's fork handlers.

CPython's subprocess uses vfork only when no user/group/extra_groups is given, so a worker that
runs as its owner's uid is started with a real fork() from the agent, a process with live gRPC
threads. With gRPC's fork support on (grpcio's default), its pthread_atfork handlers ran in the
agent and in the child before exec and could kill the child (seen as the worker's shim "killed by
signal SIGSEGV", or SIGABRT, before it started) and break the agent's channels.
``node_agent`` turns them off before grpc is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A process that imports the agent as aryl-agent does (node_agent first), keeps gRPC busy in threads
# and spawns with user= (the fork path, as for a worker that switches uid; its own uid needs no root).
PROGRAM = """
import node_agent.main
import os, subprocess, threading, time
from concurrent import futures
import grpc
from grpc._cython import cygrpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

server = grpc.server(futures.ThreadPoolExecutor(2))
health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
done = threading.Event()
def call():
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    while not done.is_set():
        stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
threads = [threading.Thread(target=call) for _ in range(2)]
for thread in threads:
    thread.start()
codes = [subprocess.Popen(["/bin/true"], user=os.getuid(), start_new_session=True).wait() for _ in range(60)]
done.set()
for thread in threads:
    thread.join()
print("fork support", cygrpc.is_fork_support_enabled(), "exit codes", sorted(set(codes)), flush=True)
"""


def test_a_uid_switching_spawn_runs_no_grpc_fork_handler() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env.update(GRPC_ENABLE_FORK_SUPPORT="true")  # even one set on: the agent turns it off
    result = subprocess.run([sys.executable, "-c", PROGRAM], check=False, cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "fork support False exit codes [0]" in result.stdout, result.stdout + result.stderr[-2000:]
    assert "fork_posix" not in result.stderr, result.stderr[-2000:]  # gRPC logs its handlers' work there
