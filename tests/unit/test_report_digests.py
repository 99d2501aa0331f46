"""``app.memory.ReportDigests``: a digest is kept only if nothing forgot its server while the report
behind it was recorded. A cycle's commit that changed the server announces that just after its commit;
a report recorded meanwhile, whose transaction did not see the change, must not leave a digest that
answers the next reports from memory with the old desired generation."""

from __future__ import annotations

import threading

from scheduler_service.app.memory import ReportDigest, ReportDigests


def digest(desired: int) -> ReportDigest:
    return ReportDigest(epoch=1, observed_generation=desired, desired_generation=desired, health=(), written_at=0.0)


def test_a_digest_is_kept_unless_its_server_was_forgotten_while_its_report_was_recorded() -> None:
    digests = ReportDigests()
    since = digests.since("gpu-1")  # the report's transaction begins
    assert digests.put("gpu-1", digest(5), since) and digests.get("gpu-1") == digest(5)

    since = digests.since("gpu-1")
    digests.forget(["gpu-1"])  # a commit changed gpu-1 (desired generation 6) and announced it meanwhile
    assert not digests.put("gpu-1", digest(5), since) and digests.get("gpu-1") is None  # the next report: full

    since = digests.since("gpu-1")  # that next report sees generation 6
    digests.forget(["gpu-2"])  # another server's change does not matter
    assert digests.put("gpu-1", digest(6), since) and digests.get("gpu-1") == digest(6)


def test_forgets_from_other_threads_are_never_lost() -> None:
    digests = ReportDigests()
    marks = [digests.since("gpu-1")]
    def forget_often() -> None:
        for _ in range(1000):
            digests.forget(["gpu-1"])

    threads = [threading.Thread(target=forget_often) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not digests.put("gpu-1", digest(1), marks[0])
    assert digests.put("gpu-1", digest(1), digests.since("gpu-1"))
