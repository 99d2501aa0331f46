"""The scheduler's token file is read again when it changes (``aryl_common.security.TokenFile``): a
token added is accepted and a token removed is refused without a restart; a changed file that does
not parse leaves the tokens read before in force (a typo locks no one out) and says so once."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import grpc
import pytest

from aryl_common import security
from aryl_common.security import ClientSecurity, Principal, SecurityError, TokenFile, hash_token
from migrations import upgrade
from protos.aryl.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.server import serve_in_background
from tests.harness import pki, scheduler_config, security_section
from tests.helpers import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def write(path: Path, *lines: str) -> None:
    path.write_text("".join(f"{line}\n" for line in lines))
    # A rewrite within one timestamp tick and of the same size would look unchanged: move the mtime on.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_changes_are_read_at_most_once_per_check_interval_and_a_bad_file_keeps_the_last_good_one(
        tmp_path: Path) -> None:
    path, clock = tmp_path / "tokens", Clock()
    problems: list[str] = []
    write(path, "user alice tok-alice")
    tokens = TokenFile(path, check_s=1.0, on_error=problems.append, clock=clock)
    assert dict(tokens.current()) == {hash_token("tok-alice"): Principal("user", "alice")}

    write(path, "user alice tok-alice", f"user bob sha256:{hash_token('tok-bob')}")
    clock.now += 0.5
    assert hash_token("tok-bob") not in tokens.current()  # not looked at again yet
    clock.now += 0.5
    assert tokens.current()[hash_token("tok-bob")] == Principal("user", "bob")

    write(path, "user bob tok-bob", "wizard carol tok-carol")  # line 2 does not parse
    clock.now += 1.0
    assert set(tokens.current()) == {hash_token("tok-alice"), hash_token("tok-bob")}
    clock.now += 1.0
    tokens.current()
    [problem] = problems  # once per change, not at every look
    assert ":2: expected 'ROLE NAME sha256:HEX'" in problem and "read before stay in force" in problem

    write(path, "user bob tok-bob")  # fixed: alice revoked
    clock.now += 1.0
    assert set(tokens.current()) == {hash_token("tok-bob")}


def test_a_bad_token_file_at_start_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    write(path, "user alice")
    with pytest.raises(SecurityError, match=":1: expected"):
        TokenFile(path)


def test_a_running_scheduler_takes_a_new_token_and_drops_a_revoked_one_without_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = pki()
    tokens = tmp_path / "tokens"
    shutil.copy(ca.path("tokens"), tokens)
    # The session's ARYL_SECURITY__* variables outrank a config's values: point this one at the copy.
    monkeypatch.setenv("ARYL_SECURITY__TOKENS_FILE", str(tokens))
    url = f"sqlite:///{tmp_path / 'aryl.db'}"
    upgrade(url)
    handle = serve_in_background(scheduler_config(url, security={**security_section(), "tokens_file": str(tokens)}))

    def answers(token: str) -> grpc.StatusCode:
        creds = ClientSecurity(ca_file=ca.path("ca.crt"), cert_file=ca.path("client.crt"),
                               key_file=ca.path("client.key"), token=token)
        with security.secure_channel(handle.address, creds, []) as channel:
            try:
                scheduler_pb2_grpc.SchedulerServiceStub(channel).GetCluster(scheduler_pb2.GetClusterRequest(),
                                                                            timeout=5)
            except grpc.RpcError as exc:
                return exc.code()
        return grpc.StatusCode.OK

    try:
        assert answers("dana-secret") == grpc.StatusCode.UNAUTHENTICATED
        with tokens.open("a") as out:
            out.write(f"user dana sha256:{hash_token('dana-secret')}\n")
        wait_for(lambda: answers("dana-secret") == grpc.StatusCode.OK, timeout=10, what="the new token accepted")
        alice = ca.token("user:alice")
        assert answers(alice) == grpc.StatusCode.OK
        kept = [line for line in tokens.read_text().splitlines() if not line.startswith("user alice ")]
        write(tokens, *kept)
        wait_for(lambda: answers(alice) == grpc.StatusCode.UNAUTHENTICATED, timeout=10, what="alice's token revoked")
        assert answers("dana-secret") == grpc.StatusCode.OK
    finally:
        handle.stop()
