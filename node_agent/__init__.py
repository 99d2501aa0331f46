"""Aryl node agent: one daemon per GPU server, the scheduler's hands on that server.

Nouns: the *server* is the machine (its hostname is its id); its *GPUs* come from a GPU backend
(NVML, or fake GPUs for try-outs); the *desired state* is what the scheduler wants running there,
fenced by *scheduler epoch* and ordered by *generation*; a *session* is one registration and the
status reports and desired-state stream that follow it.

Modules: ``config`` (typed settings), ``gpus`` (inventory and health), ``desired`` (which desired
states to accept), ``agent`` (the control loop), ``daemon`` (backoff, channel, signals),
``main`` (the ``aryl-agent`` command).

The agent reports and obeys; it never decides placement, loans or health verdicts. This version
does not execute worker processes yet: it records the desired state and reports no workers.
"""
