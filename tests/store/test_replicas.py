"""The registry of scheduler replicas (``store.replicas``, ``app.replicas``) on SQLite and PostgreSQL: a beat
makes or renews a replica's row by the database's clock, a replica silent past the staleness is not live, a
clean stop removes it; and the leader's choice of the push process an agent watches: live standbys only, the
same one at every registration, spread over them, and only the servers of a replica that joins or leaves move."""

from __future__ import annotations

import sqlalchemy as sa

from scheduler_service.app.replicas import Replicas, choose_push_address
from scheduler_service.clock import SystemClock
from scheduler_service.store import replicas as store
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.store.replicas import ReplicaView
from scheduler_service.store.transactions import Transactions


def _db(url: str) -> tuple[sa.Engine, Transactions]:
    engine = create_engine_for(url)
    return engine, Transactions(session_factory(engine), publish=lambda states: None)


def _age(engine: sa.Engine, address: str, seconds: float) -> None:
    """Move ``address``'s first and last beats ``seconds`` into the past."""
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE scheduler_replicas SET heartbeat_at = heartbeat_at - :s, "
                             "started_at = started_at - :s WHERE address = :a"),
                     {"s": seconds, "a": address})


def test_beats_renew_a_row_and_a_silent_replica_drops_out(database_url: str) -> None:
    engine, db = _db(database_url)
    try:
        push = {"a:1": "a:2", "b:1": ""}
        a = Replicas(db, SystemClock(), me="a:1", push_address=lambda: push["a:1"], stale_s=5.0)
        b = Replicas(db, SystemClock(), me="b:1", push_address=lambda: push["b:1"], stale_s=5.0)
        a.beat()
        assert [(r.address, r.push_address) for r in a.live()] == [("a:1", "a:2")]
        b.beat()
        assert [(r.address, r.push_address) for r in b.live()] == [("a:1", "a:2"), ("b:1", "")]
        assert all(0 <= r.age_s < 5 for r in b.live())

        push["b:1"] = "b:2"  # its push process serves now: the next beat says so
        _age(engine, "b:1", 3.0)
        b.beat()
        (row, live) = next((r, live) for r, live in b.known() if r.address == "b:1")
        assert live and row.push_address == "b:2" and row.age_s < 1.0 and row.up_s >= 3.0  # started then, beat now

        _age(engine, "b:1", 6.0)  # silent past the staleness: not live, still listed
        a.beat()
        assert [r.address for r in a.live()] == ["a:1"]
        assert [(r.address, live) for r, live in a.known()] == [("a:1", True), ("b:1", False)]  # still listed
        b.beat()  # back
        a.beat()
        assert [r.address for r in a.live()] == ["a:1", "b:1"]

        b.leave()  # a clean stop
        a.beat()
        assert [r.address for r, _ in a.known()] == ["a:1"]
        with session_factory(engine)() as session:
            assert [r.address for r in store.listed(session)] == ["a:1"]
    finally:
        engine.dispose()


def _replica(address: str) -> ReplicaView:
    return ReplicaView(address, f"{address}-push", 0.0, 0.0)


def test_the_leader_names_a_live_standby_s_process_stably_and_spread_evenly() -> None:
    leader, b, c, d = _replica("a:1"), _replica("b:1"), _replica("c:1"), _replica("d:1")
    servers = [f"gpu-{i}" for i in range(3000)]
    # No standby (or none with a push process): nothing named, the agent watches the leader's own process.
    assert choose_push_address("gpu-1", [leader], leader="a:1") is None
    assert choose_push_address("gpu-1", [leader, ReplicaView("b:1", "", 0.0, 0.0)], leader="a:1") is None

    three = {s: choose_push_address(s, [leader, b, c, d], leader="a:1") for s in servers}
    assert set(three.values()) == {"b:1-push", "c:1-push", "d:1-push"}  # never the leader's
    counts = [list(three.values()).count(p) for p in ("b:1-push", "c:1-push", "d:1-push")]
    assert min(counts) > 0.28 * len(servers), counts  # about a third each
    # The same answer whatever the order the replicas are listed in (a registration again: its stream stays).
    assert all(choose_push_address(s, [d, c, leader, b], leader="a:1") == three[s] for s in servers)

    # d drops out: only d's servers move; the others keep their process.
    two = {s: choose_push_address(s, [leader, b, c], leader="a:1") for s in servers}
    assert all(two[s] == three[s] for s in servers if three[s] != "d:1-push")
    assert all(two[s] in ("b:1-push", "c:1-push") for s in servers)
