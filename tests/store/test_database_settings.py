"""The scheduler says at start-up when its PostgreSQL server has autovacuum off (``store.db.AUTOVACUUM_OFF``):
without it the tables the scheduler churns fill with dead rows and its reads slow until they time out, as a
one-hour soak on such a server saw. A real ``aryl-scheduler`` process on the test's PostgreSQL database."""

from __future__ import annotations

import os
import subprocess

import sqlalchemy as sa

from scheduler_service.store.db import AUTOVACUUM_OFF, autovacuum_off, create_engine_for
from tests.fixtures.daemons import BIN, serving
from tests.helpers import free_port, terminating, wait_for


def test_a_server_without_autovacuum_is_named_at_start_up_with_the_fix(postgres_url: str) -> None:
    engine = create_engine_for(postgres_url)
    try:
        with engine.connect() as conn:  # the server's setting, read here on its own
            off = conn.execute(sa.text("SELECT setting FROM pg_settings WHERE name = 'autovacuum'")).scalar() == "off"
        assert autovacuum_off(engine) is off
    finally:
        engine.dispose()
    assert autovacuum_off(create_engine_for("sqlite://")) is False  # not a PostgreSQL question

    address = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_SECURITY__")}
    env["ARYL_LOGGING__FORMAT"] = "json"
    proc = subprocess.Popen([str(BIN), "--insecure", "--listen", address, "--database-url", postgres_url],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)

    with terminating(proc) as stop:
        wait_for(lambda: serving(address, plaintext=True), timeout=60, what="the scheduler to serve")
        log = stop().decode()
    assert (AUTOVACUUM_OFF in log) is off, log[-2000:]
    assert "ALTER SYSTEM SET autovacuum = on" in AUTOVACUUM_OFF  # the fix, named
