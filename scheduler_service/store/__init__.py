"""Persistent state: every SQL statement and dialect branch of the service, returning plain values.

- ``db``: the engine and session factory (PostgreSQL in production, SQLite embedded);
- ``models``: the SQLAlchemy models (the schema comes from the Alembic migrations);
- ``transactions``: the units of work (retries, consistent reads, desired states published after commit);
- ``changes``: the writes every use case shares (events, lifecycle-checked state changes, allocations);
- ``rows``: ORM rows -> the plain values of ``scheduler_service.records``;
- ``jobs``, ``agents``, ``desired``, ``inference``, ``liveness``, ``term``, ``views``: each use case's SQL;
- ``snapshot`` and ``applier``: the scheduling cycle's reader and writer (the applier's re-checks read
  ``apply_facts``; it writes pending reasons through ``pending_reasons``).

Never: decide anything (policies do), or hand an ORM row or a session out of the store.
"""
