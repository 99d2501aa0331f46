"""A list page reads no bulky fields: the SQL ListJobs' store query sends to PostgreSQL selects neither
``command`` nor ``env`` (up to 256 KiB a job), only the command's stored preview; GetJob still reads
the whole spec. The statements are caught as the driver receives them (``before_cursor_execute``)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from scheduler_service.app import SchedulerApp
from scheduler_service.records import JobFilter, JobSubmission
from scheduler_service.store.db import create_engine_for, session_factory
from tests.harness import ManualClock

pytestmark = pytest.mark.postgres

BULKY = re.compile(r"\bjobs\.(command|env)\b")


@pytest.fixture
def app_and_engine(postgres_url: str) -> Iterator[tuple[SchedulerApp, sa.Engine]]:
    engine = create_engine_for(postgres_url)
    try:
        yield SchedulerApp(session_factory(engine), ManualClock()), engine
    finally:
        engine.dispose()


def statements_of(engine: sa.Engine, call) -> list[str]:
    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        call()
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    return seen


def test_a_list_page_selects_no_command_or_env_but_shows_the_command_preview(app_and_engine) -> None:
    app, engine = app_and_engine
    long_arg = "x" * 10_000
    job = app.jobs.submit(JobSubmission(
        name="big", user="alice", queue="default", command=("python", "train.py", long_arg),
        env={"BIG": "y" * 50_000}, gpus_per_worker=1, min_workers=1, max_workers=1,
    ))

    page: list = []
    statements = statements_of(engine, lambda: page.extend(app.jobs.page(JobFilter())[0]))

    jobs_queries = [s for s in statements if "FROM jobs" in s]
    assert jobs_queries, statements
    assert not [s for s in jobs_queries if BULKY.search(s)], jobs_queries
    [listed] = page
    assert listed.id == job.id and listed.command == ("python", "train.py") and listed.env == {}

    # GetJob is the whole job: there the bulky columns are read.
    statements = statements_of(engine, lambda: app.jobs.get(job.id))
    assert any(BULKY.search(s) for s in statements)
    assert app.jobs.get(job.id)[0].command == ("python", "train.py", long_arg)
