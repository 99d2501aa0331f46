"""event retention: the event log stays append-only, except that events older than a day may be deleted

The housekeeping loop deletes events older than ``events.retention_days`` (``app.retention``). The
append-only guard of 0001 refused every UPDATE and DELETE on ``events``; it now lets a DELETE through
for a row whose ``time`` is more than a day before the database's own clock, and refuses everything
else as before (every UPDATE; any DELETE of the last day's events). The floor is in the schema, not in
a session flag the pruner sets, so no code path (a bug, a wrong setting, a hand-typed statement) can
remove recent history: the part that ``arylctl explain`` and resuming event streams read. Hence
``events.retention_days`` is 0 (keep forever) or at least 2: the second day covers a clock difference
between the scheduler, which stamps events, and the database, which checks them.

Hand-written for both dialects: PostgreSQL replaces the guard's function (the trigger stays);
SQLite, which has no trigger functions, recreates its DELETE trigger with a WHEN clause.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 01:10:00.000000
"""

from __future__ import annotations

from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

# Events younger than this (seconds, by the database's clock) can never be deleted.
RETENTION_FLOOR_S = 86400

_PG_GUARD = """
CREATE OR REPLACE FUNCTION aryl_events_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND OLD.time < extract(epoch FROM now()) - {floor} THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'events is append-only: % refused{detail}', TG_OP;
END;
$$ LANGUAGE plpgsql
"""
_DETAIL = " (only events older than a day may be deleted, by retention)"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_GUARD.format(floor=RETENTION_FLOOR_S, detail=_DETAIL))
    else:
        op.execute("DROP TRIGGER IF EXISTS events_no_delete")
        op.execute(
            "CREATE TRIGGER events_no_delete BEFORE DELETE ON events "
            f"WHEN OLD.time >= CAST(strftime('%s', 'now') AS REAL) - {RETENTION_FLOOR_S} "
            f"BEGIN SELECT RAISE(ABORT, 'events is append-only: DELETE refused{_DETAIL}'); END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            """
            CREATE OR REPLACE FUNCTION aryl_events_append_only() RETURNS trigger AS $$
            BEGIN
                RAISE EXCEPTION 'events is append-only: % refused', TG_OP;
            END;
            $$ LANGUAGE plpgsql
            """
        )
    else:
        op.execute("DROP TRIGGER IF EXISTS events_no_delete")
        op.execute(
            "CREATE TRIGGER events_no_delete BEFORE DELETE ON events "
            "BEGIN SELECT RAISE(ABORT, 'events is append-only: DELETE refused'); END"
        )
