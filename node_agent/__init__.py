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
worker processes), ``shim`` (the per-worker parent process), ``contract`` (what a training program
sees; importable without Aryl), ``logs`` (the worker-log service), ``agent`` (the control loop),
``main`` (the ``aryl-agent`` command). Backoff, the channel to the scheduler, signal handling,
config loading and logging are ``aryl_common``'s.

The agent reports and obeys; it never decides placement, loans, restarts or health verdicts.
"""
