"""High availability with fencing (``docs/ha.md``), on a real PostgreSQL database: the leader lease and
its fence (``app.lease``, ``store.lease``), two schedulers on one database (one leads, the standby
redirects clients to it and takes over), and an agent's epoch fence across restarts.

The process-level cases (kill -9 under load, SIGSTOP past the lease) are in ``tests/chaos/test_ha.py``.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from aryl_common.backoff import Backoff
from aryl_common.channels import LEADER_METADATA_KEY, SchedulerAddresses, leader_hint, scheduler_addresses
from arylctl.client import ArylClient, Unavailable
from inference_router.scheduler_link import Retryable, SchedulerLink
from node_agent.agent import Agent
from node_agent.config import AgentSection
from node_agent.desired import DesiredStateTracker, Verdict
from node_agent.epoch_file import EpochFile, EpochFileError
from node_agent.gpus import FakeBackend
from protos.aryl.v1 import scheduler_pb2, types_pb2
from scheduler_service.app.lease import Leadership, NotLeader
from scheduler_service.app.term import Term
from scheduler_service.clock import SystemClock
from scheduler_service.config import HaConfig
from scheduler_service.server import ServerHandle, serve_in_background
from scheduler_service.store import lease as lease_store
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.store.transactions import Transactions
from tests.fixtures.tcp_relay import TcpRelay
from tests.harness import (
    AS_ITSELF,
    FakeScheduler,
    client_security,
    desired_state,
    job_spec,
    scheduler_config,
    scheduler_stub,
)
from tests.helpers import wait_for

CLOCK = SystemClock()


@pytest.fixture
def ha_db(postgres_url: str) -> str:
    """The session's migrated PostgreSQL database, emptied (its lease row too: ``take`` puts it back)."""
    return postgres_url


@dataclass
class Contender:
    """One scheduler's lease and its fenced transactions, without the rest of the service."""

    lead: Leadership
    db: Transactions
    engine: sa.Engine

    def write_event(self, message: str) -> None:
        """A write of the application's kind: one event row, through the fenced transactions."""
        self.db.write(lambda session: StateChanges(CLOCK).event(session, "HA_TEST", reason="TEST", message=message))


@pytest.fixture
def contenders(ha_db: str) -> Iterator[dict[str, Contender]]:
    made: dict[str, Contender] = {}
    for me in ("10.0.0.1:50051", "10.0.0.2:50051"):
        engine = create_engine_for(ha_db, pool_size=2)
        sessions = session_factory(engine)
        db = Transactions(sessions, publish=lambda states: None)
        term = Term(db, StateChanges(CLOCK), CLOCK)
        lead = Leadership(Transactions(sessions, publish=lambda states: None), StateChanges(CLOCK), CLOCK, term,
                          me=me, lease_s=1.0, renew_s=0.25)
        term.fence_writes(lead.fence)
        made[me] = Contender(lead, db, engine)
    yield made
    for contender in made.values():
        contender.engine.dispose()


def events(url: str, kind: str = "HA_TEST") -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.scalars(sa.text("SELECT message FROM events WHERE kind = :k ORDER BY id"), {"k": kind}))
    finally:
        engine.dispose()


def leading(handle: ServerHandle) -> bool:
    """Whether the scheduler of ``handle`` leads now (it runs with HA on: it has a leadership)."""
    leadership = handle.service.leadership
    assert leadership is not None
    return leadership.leading


def test_one_contender_leads_and_a_deposed_leaders_next_write_is_refused(
    contenders: dict[str, Contender], ha_db: str
) -> None:
    a, b = contenders.values()
    a.lead.step()
    b.lead.step()
    assert a.lead.leading and not b.lead.leading
    assert b.lead.leader == a.lead.me  # the standby knows whom to send clients to
    a.write_event("a, leading")
    with pytest.raises(NotLeader, match=re.escape("standby: the leader is at 10.0.0.1:50051")):
        b.write_event("b, standby")

    # A is paused (no renewal; as after SIGSTOP) past its lease: B takes over, in a higher epoch.
    time.sleep(1.1)
    b.lead.step()
    assert b.lead.leading and b.lead.epoch > a.lead.epoch
    assert a.lead.leading  # A has not noticed: only the fence stands between it and the database
    with pytest.raises(NotLeader, match=re.escape("the leader is at 10.0.0.2:50051")):
        a.write_event("a, deposed")
    assert not a.lead.leading  # its refused write made it step down
    b.write_event("b, leading")
    assert events(ha_db) == ["a, leading", "b, leading"]
    starts = events(ha_db, "SCHEDULER_STARTED")
    assert len(starts) == 2 and "10.0.0.1:50051 let its lease lapse" in starts[1]


def test_renewal_keeps_the_lease_and_a_lapsed_lease_starts_a_new_term(contenders: dict[str, Contender]) -> None:
    a, b = contenders.values()
    a.lead.step()
    first = a.lead.epoch
    for _ in range(6):  # 1.5 s of renewals every 0.25 s: past the 1 s lease
        time.sleep(0.25)
        a.lead.step()
        b.lead.step()
    assert a.lead.leading and not b.lead.leading and a.lead.epoch == first
    time.sleep(1.1)
    # Too late to renew (its own deadline passed): it steps down, and as nobody took over it leads again,
    # in a new term; the old term's lease cannot be renewed any more.
    a.lead.step()
    assert a.lead.leading and a.lead.epoch > first
    assert not a.db.read(lambda session: lease_store.renew(session, me=a.lead.me, epoch=first, lease_s=1))


def test_takeover_waits_for_a_write_that_passed_the_fence(contenders: dict[str, Contender], ha_db: str) -> None:
    """A write that passed the fence commits before a standby can lead: the fence's row lock holds the
    takeover back, however long the commit takes (here past the lease)."""
    a, b = contenders.values()
    a.lead.step()
    with Session(a.engine) as session, session.begin():
        StateChanges(CLOCK).event(session, "HA_TEST", reason="TEST", message="slow commit")
        session.flush()
        a.lead.fence(session)
        time.sleep(1.1)  # the lease lapses meanwhile
        taker = threading.Thread(target=b.lead.step)
        taker.start()
        taker.join(timeout=0.5)
        assert taker.is_alive() and not b.lead.leading  # waiting for this transaction's lock
    taker.join(timeout=5)
    assert b.lead.leading
    assert events(ha_db) == ["slow commit"]


def test_a_restart_on_the_same_address_takes_its_own_lease_at_once(contenders: dict[str, Contender]) -> None:
    a, _ = contenders.values()
    a.lead.step()
    first = a.lead.epoch
    # The same address again (a restarted process: it holds the address's port, so the old one is gone).
    again = Leadership(a.lead._db, StateChanges(CLOCK), CLOCK, Term(a.db, StateChanges(CLOCK), CLOCK),
                       me=a.lead.me, lease_s=1.0, renew_s=0.25)
    again.step()
    assert again.leading and again.epoch > first


def test_ha_settings_are_checked() -> None:
    assert HaConfig().lease_s == 8.0 and HaConfig().renew_s == 2.0
    with pytest.raises(ValueError, match=r"at most half of ha\.lease_s"):
        HaConfig(lease_s=3, renew_s=2)


# --------------------------------------------------------------------------------------------------
# Two schedulers on one database


def test_two_schedulers_one_leads_the_standby_redirects_and_takes_over_on_a_clean_stop(ha_db: str) -> None:
    config = scheduler_config(ha_db, ha={"lease_s": 2.0, "renew_s": 0.5})
    first = serve_in_background(config)
    second = serve_in_background(config)
    try:
        assert first.service.leadership is not None and second.service.leadership is not None
        assert first.service.leadership.leading and not second.service.leadership.leading
        channel, stub = scheduler_stub(second.address)
        with channel, pytest.raises(grpc.RpcError) as refused:
            stub.GetCluster(scheduler_pb2.GetClusterRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"the leader is at {first.address}; retry there" in (refused.value.details() or "")
        assert leader_hint(refused.value) == first.address
        hint: object = (LEADER_METADATA_KEY, first.address)  # grpc's stubs type every metadata value as bytes
        assert hint in list(refused.value.trailing_metadata() or ())

        # A client given both addresses, the standby first, follows the leader.
        with ArylClient(f"{second.address},{first.address}", timeout=5) as client:
            job = client.submit_job(job_spec("ha-1"))
            epoch = client.get_cluster().scheduler_epoch
            assert epoch == first.service.leadership.epoch

            # So does a router's link: the standby's refusal is Retryable, and the next call reaches the leader.
            async def report_demand() -> None:
                async with SchedulerLink(f"{second.address},{first.address}", source="r1", rpc_timeout_s=5,
                                         max_backoff_s=1, security=client_security()) as link:
                    with pytest.raises(Retryable, match="standby"):
                        await link.report_demand(0, 1.0)
                    await link.report_demand(0, 1.0)

            asyncio.run(report_demand())

            started = time.monotonic()
            first.stop()  # releases the lease: the standby leads at its next look, not after the lease
            wait_for(lambda: leading(second), timeout=5, what="the standby to lead")
            took = time.monotonic() - started
            assert took < 2.0, f"clean hand-over took {took:.2f}s"
            # The same client: its leader is gone, the next address leads now.
            assert client.get_job(job.job_id).job.job_id == job.job_id
            assert client.get_cluster().scheduler_epoch > epoch
    finally:
        second.stop()
        first.stop()


# --------------------------------------------------------------------------------------------------
# Clients' addresses


def test_addresses_follow_the_named_leader_else_go_round() -> None:
    assert scheduler_addresses(" a:1, b:2,,a:1 ") == ["a:1", "b:2"]
    addresses = SchedulerAddresses("a:1,b:2")
    assert addresses.current == "a:1"
    assert addresses.after_failure(RuntimeError("down")) == "b:2"
    assert addresses.after_failure(RuntimeError("down")) == "a:1"
    addresses.current = "c:3"  # a leader a standby named, not in the list, fails in turn: back to the list
    assert addresses.after_failure(RuntimeError("down")) == "a:1"


# --------------------------------------------------------------------------------------------------
# Agents: the newest epoch survives a restart


def test_epoch_file_keeps_the_fence_across_trackers(tmp_path: Path) -> None:
    epochs = EpochFile(tmp_path)
    assert epochs.load() == 0
    tracker = DesiredStateTracker(newest_epoch=epochs.load(), on_newer_epoch=epochs.save)
    assert tracker.offer(desired_state(1, epoch=7)) is Verdict.ACCEPTED
    assert epochs.load() == 7
    restarted = DesiredStateTracker(newest_epoch=epochs.load(), on_newer_epoch=epochs.save)
    assert not restarted.observe_epoch(6)
    assert restarted.offer(desired_state(9, epoch=6)) is Verdict.STALE_EPOCH
    (tmp_path / "scheduler-epoch").write_text("garbage")
    with pytest.raises(EpochFileError, match="not a scheduler epoch"):
        epochs.load()


def run_agent(address: str, work_dir: Path) -> tuple[Agent, threading.Thread]:
    config = AgentSection(scheduler_address=address, hostname="ha-node", rpc_timeout_s=2.0,
                          reconnect_max_backoff_s=0.2, work_dir=str(work_dir), reconcile_interval_s=0.05,
                          insecure=True)  # the fake AgentService listens in plaintext
    agent = Agent(config, FakeBackend("ha-node", count=2), backoff=Backoff(0.2, initial_s=0.02), version="test",
                  users=AS_ITSELF)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    return agent, thread


def stop_agent(agent: Agent, thread: threading.Thread) -> None:
    agent.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_a_restarted_agent_refuses_an_older_epoch_and_moves_to_the_next_scheduler(tmp_path: Path) -> None:
    newer, older, newest = FakeScheduler(epoch=5), FakeScheduler(epoch=3), FakeScheduler(epoch=6)
    try:
        agent, thread = run_agent(f"127.0.0.1:{newer.port}", tmp_path / "agent")
        wait_for(lambda: newer.service.reports, what="a report at epoch 5")
        stop_agent(agent, thread)
        assert (tmp_path / "agent" / "scheduler-epoch").read_text().strip() == "5"

        # Restarted, pointed at a deposed scheduler (epoch 3) first: refused, and it moves on.
        agent, thread = run_agent(f"127.0.0.1:{older.port},127.0.0.1:{newest.port}", tmp_path / "agent")
        try:
            wait_for(lambda: newest.service.reports, what="a report to the scheduler of epoch 6")
            assert older.service.registrations and not older.service.reports and not older.service.streams_opened
            assert newest.service.reports[-1].scheduler_epoch == 6
            older.service.push(desired_state(1, epoch=3, server_id="ha-node"))
            newest.service.push(desired_state(1, epoch=6, server_id="ha-node"))
            wait_for(lambda: agent.desired.latest is not None, what="the epoch-6 desired state")
            assert agent.desired.latest is not None and agent.desired.latest.scheduler_epoch == 6
        finally:
            stop_agent(agent, thread)
        assert (tmp_path / "agent" / "scheduler-epoch").read_text().strip() == "6"
    finally:
        for fake in (newer, older, newest):
            fake.stop()


def test_a_leader_that_loses_the_database_steps_down_and_the_standby_takes_over(ha_db: str) -> None:
    url = make_url(ha_db)
    proxy = TcpRelay((url.host or "127.0.0.1", url.port or 5432))
    through_proxy = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    ha = {"lease_s": 2.0, "renew_s": 0.5}
    first = serve_in_background(scheduler_config(through_proxy, ha=ha))
    second = serve_in_background(scheduler_config(ha_db, ha=ha))
    try:
        assert first.service.leadership is not None and second.service.leadership is not None
        assert first.service.leadership.leading and not second.service.leadership.leading
        lost_at = time.monotonic()
        proxy.close()
        wait_for(lambda: leading(second), timeout=15, interval=0.05, what="the standby to lead")
        took = time.monotonic() - lost_at
        print(f"takeover after the leader lost the database: {took:.2f}s (lease 2s, renew 0.5s)")
        assert took < 2.0 + 0.5 + 2.0  # lease + a look + slack
        wait_for(lambda: not leading(first), timeout=5, what="the cut-off leader to step down")
        assert second.service.leadership.epoch > first.service.leadership.epoch
    finally:
        second.stop()
        first.stop()
        proxy.close()


def test_a_stream_on_a_leader_that_steps_down_ends_unavailable(ha_db: str) -> None:
    leader = serve_in_background(scheduler_config(ha_db, ha={"lease_s": 2.0, "renew_s": 0.5}))
    try:
        assert leader.service.leadership is not None
        epoch = leader.service.leadership.epoch
        channel, stub = scheduler_stub(leader.address)
        with channel:
            stream = stub.WatchEvents(scheduler_pb2.WatchEventsRequest(after_event_id=0), timeout=20)
            assert next(stream).kind == types_pb2.EVENT_KIND_SCHEDULER_STARTED
            engine = sa.create_engine(ha_db)
            try:
                with engine.begin() as conn:  # the lease lapses under it: its next renewal finds out
                    conn.execute(sa.text("UPDATE leader_lease SET expires_at = 0"))
            finally:
                engine.dispose()
            with pytest.raises(grpc.RpcError) as ended:
                for _ in stream:
                    pass
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value
        # Nobody else took the lease: the same scheduler leads again, in a new term.
        wait_for(lambda: leading(leader), timeout=5, what="a new term")
        assert leader.service.leadership.epoch > epoch
    finally:
        leader.stop()


def test_a_client_given_the_standby_alone_fails_over_to_it_when_the_leader_it_was_sent_to_dies(ha_db: str) -> None:
    """Issue 37, item 5: given one address (a standby), the client followed its hint to the leader and, that
    leader gone, stayed with it; it must come back to the address it was given (now leading) at once."""
    config = scheduler_config(ha_db, ha={"lease_s": 2.0, "renew_s": 0.5})
    first = serve_in_background(config)
    second = serve_in_background(config)
    try:
        assert first.service.leadership is not None and second.service.leadership is not None
        assert first.service.leadership.leading and not second.service.leadership.leading
        with ArylClient(second.address, timeout=5) as client:
            job = client.submit_job(job_spec("ha-follow"))  # via the standby's hint, at the leader
            epoch = client.get_cluster().scheduler_epoch
            assert epoch == first.service.leadership.epoch

            first.stop()
            wait_for(lambda: leading(second), timeout=30, what="the standby to lead")
            # The next call, not one a minute later: the dead leader is left for the address given.
            assert client.get_job(job.job_id).job.job_id == job.job_id
            assert client.get_cluster().scheduler_epoch > epoch
    finally:
        second.stop()
        first.stop()


def test_a_standby_naming_a_leader_that_just_failed_is_not_followed_back_to_it(ha_db: str) -> None:
    """While the standby has not taken over yet it still names the dead leader: the client does not bounce
    back there (it hears UNAVAILABLE, from the standby), and once the standby leads, it is answered."""
    config = scheduler_config(ha_db, ha={"lease_s": 3.0, "renew_s": 0.5})
    first = serve_in_background(config)
    second = serve_in_background(config)
    try:
        assert first.service.leadership is not None and second.service.leadership is not None
        with ArylClient(second.address, timeout=5) as client:
            client.get_cluster()  # now at the leader
            assert client._addresses.current == first.address
            first.service.leadership.release = lambda: None  # type: ignore[method-assign]  # dies: the lease lapses
            first.stop()
            with pytest.raises(Unavailable) as refused:
                client.get_cluster()
            if not second.service.leadership.leading:
                assert "is a standby" in refused.value.message  # the standby's answer, not a dead address's
            assert client._addresses.current == second.address
            wait_for(lambda: leading(second), timeout=30, what="the standby to lead")
            assert client.get_cluster().scheduler_epoch > 0
            assert client._addresses.current == second.address
    finally:
        second.stop()
        first.stop()
