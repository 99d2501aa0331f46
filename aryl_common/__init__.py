"""Plumbing shared by Aryl's daemons and clients: backoff, gRPC channels, signal handling, typed
config loading, logging, exit descriptions.

Nouns: a *daemon* is a long-running Aryl program (``aryl-scheduler``, ``aryl-agent``,
``aryl-router``); a *settings* class is one program's whole typed configuration, made of
*sections* (``[agent]``, ``[logging]``), read from a file and ``ARYL_<SECTION>__<KEY>`` environment
variables; a *backoff* spaces out the retries after a failed call to the scheduler; a worker's
*exit status* is its process's return code, negative when a signal killed it (the Popen convention).

Modules: ``backoff``, ``channels`` (the daemons' gRPC channel to the scheduler), ``signals``
(SIGTERM/SIGINT to a clean stop), ``config`` (the file + environment loader every program's
settings build on), ``logs`` (structlog set-up), ``exits`` (one wording for a worker's exit),
``entry`` (how every program ends on a failure: one line on stderr, shared exit statuses, ``--version``).

Everything here is mechanism, never policy: it decides nothing about jobs, servers, loans or
demand, and it imports nothing from Aryl's own packages (``scheduler_service``, ``node_agent``,
``inference_router``, ``arylctl``, ``simulator``), so each of them can import it without
pulling in another (``tests/contract/test_layering.py`` holds that).
"""
