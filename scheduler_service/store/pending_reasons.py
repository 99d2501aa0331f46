"""The pending reasons a plan records, written in bulk: why each still-PENDING job waits, with a
JOB_PENDING_REASON event each (``store.applier.Applier`` calls these after a plan's actions).

A burst of submissions brings thousands of pending jobs a cycle, so the writes are few statements
whatever their number: on PostgreSQL one (``pending_reasons_in_one_statement``, which also keeps a
reason off a row changed since the snapshot that decided it), elsewhere a SELECT, an UPDATE and an
events INSERT (``pending_reasons_in_bulk``).

Never: decide a reason (the plan did), write a job that is no longer PENDING, or commit (the
caller's transaction does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.core.plan import KeepPending
from scheduler_service.lifecycle import JobState
from scheduler_service.store import models as m

# No row versions known: every reason is written on whatever version the row is.
NO_STAMPS: Mapping[int, str] = {}


def pending_reasons_in_bulk(session: Session, pending: Sequence[KeepPending], now: float) -> None:
    """``Applier._apply_pending`` on any database."""
    jobs = m.JOBS
    still_pending = set(session.scalars(
        sa.select(jobs.c.id)
        .where(jobs.c.id.in_([p.job_id for p in pending]), jobs.c.state == JobState.PENDING)
        .with_for_update()
    ))
    items = [p for p in pending if p.job_id in still_pending]
    if not items:
        return
    session.execute(
        sa.update(jobs)
        .where(jobs.c.id == sa.bindparam("job_id"))
        .values(pending_reason=sa.bindparam("why"), version=jobs.c.version + 1),
        [{"job_id": p.job_id, "why": p.summary} for p in items],
    )
    session.execute(sa.insert(m.EVENTS), [
        dict(time=now, kind="JOB_PENDING_REASON", job_id=p.job_id, server_id=None, from_state="", to_state="",
             reason=p.reason, message=p.message[:2048], details={})
        for p in items
    ])


def pending_reasons_in_one_statement(session: Session, pending: Sequence[KeepPending], now: float,
                                     stamps: Mapping[int, str] = NO_STAMPS) -> list[tuple[int, str, str, str]]:
    """``Applier._apply_pending`` on PostgreSQL: what ``pending_reasons_in_bulk`` writes, in one statement.
    A job with a stamp in ``stamps`` (the row version its reason was decided on) gets it only if its row
    is still that version: a reason decided on a row changed since is left to the next cycle, which
    decides on the change. Returns those jobs as (job, the version read, the new version, the reason)."""
    rows = session.execute(_PENDING_REASONS, dict(
        ids=[p.job_id for p in pending], whys=[p.summary for p in pending],
        reasons=[str.__str__(p.reason) for p in pending], messages=[p.message[:2048] for p in pending],
        seen=[stamps.get(p.job_id) for p in pending], now=now, pending=str.__str__(JobState.PENDING),
    ))
    return [(job_id, seen, stamp, why) for job_id, seen, stamp, why in rows if seen is not None]


# ``pending_reasons_in_one_statement``: only jobs still PENDING are written (the UPDATE's row locks
# re-check it), each with its event, in the plan's order.
_PENDING_REASONS = sa.text("""
WITH t AS (
    SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:whys AS text[]), CAST(:reasons AS text[]),
                         CAST(:messages AS text[]), CAST(:seen AS text[]))
                  WITH ORDINALITY AS t(id, why, reason, message, seen, n)
), written AS (
    UPDATE jobs SET pending_reason = t.why, version = jobs.version + 1
    FROM t WHERE jobs.id = t.id AND jobs.state = :pending AND (t.seen IS NULL OR jobs.xmin::text = t.seen)
    RETURNING jobs.id, t.seen, jobs.xmin::text AS stamp, t.why
), logged AS (
    INSERT INTO events (time, kind, job_id, server_id, from_state, to_state, reason, message, details, actor)
    SELECT :now, 'JOB_PENDING_REASON', t.id, NULL, '', '', t.reason, t.message, '{}'::json, ''
    FROM t JOIN written ON written.id = t.id
    ORDER BY t.n
)
SELECT id, seen, stamp, why FROM written
""")
