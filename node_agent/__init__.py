"""Aryl node agent: one daemon per GPU server, the scheduler's hands on that server.

Nouns: the *server* is the machine (its hostname is its id); its *GPUs* come from a GPU backend
(NVML, or fake GPUs for try-outs); the *desired state* is what the scheduler wants running there,
fenced by *scheduler epoch* and ordered by *generation*; a *session* is one registration and the
status reports and desired-state stream that follow it.

A *worker* is one process of a training job, identified by (job, rank, incarnation); the agent
runs each under a *shim* that records its exit, keeps *worker records* in a *state file* so a
restarted agent adopts running workers, and serves worker *logs* to the scheduler.

Modules: ``config`` (typed settings), ``gpus`` (inventory and health), ``desired`` (which desired
states to accept), ``workers`` (worker records, on-disk layout), ``supervisor`` (starts and stops
worker processes; how a stop proceeds: ``stopping``), ``launch`` (what a worker starts with: its shim
copy, environment, working directory and log), ``shim`` (the per-worker parent process), ``contract``
(what a training program sees; importable without Aryl), ``logs`` (the worker-log service), ``agent``
(the control loop), ``main`` (the ``aryl-agent`` command). Backoff, the channel to the scheduler,
signal handling, config loading and logging are ``aryl_common``'s.

The agent reports and obeys; it never decides placement, loans, restarts or health verdicts.
"""

import os

# gRPC's fork handlers off, before anything imports grpc: a worker that switches uid is spawned with
# fork() (CPython uses vfork only without user/group/extra_groups), and gRPC's pthread_atfork handlers
# then run in the agent and in the child between fork and exec, where they can crash the child (the
# shim "killed by signal SIGSEGV/SIGABRT" before it starts) and break the agent's own channels. The
# agent never forks a process that goes on using gRPC, so it never needs them. Set, not defaulted.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
