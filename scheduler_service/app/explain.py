"""Explain a job (``ExplainJob``, ``arylctl explain``): why it waits, runs or ran as it does, as one plain value.

The answer is composed of what the other use cases read: the job, a summary and one entry per decision
(``Jobs.explain``), its deadline outlook (``Deadlines.outlooks``), its anti-thrashing window by the
policy's parameters (``core.protection.explain``), and a line on its queue (``Queues.describe``).

Never: talk gRPC (``api.convert`` translates the answer), decide who may see the job (``api.auth``
does, before the call), or find the policy's parameters by itself: the caller passes them, as it
passes the time the window is judged at.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from scheduler_service.app.deadlines import Deadlines, job_view
from scheduler_service.app.jobs import Jobs
from scheduler_service.app.queues import Queues
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.predict import DeadlineOutlook
from scheduler_service.core.protection import explain as explain_protection
from scheduler_service.records import EventInfo, JobInfo


@dataclass(frozen=True, slots=True)
class JobExplanation:
    """One job explained. ``protection``: what protects it from disruption now ("" when nothing does);
    ``queue_status``: one line on its queue ("" for a queue deleted since)."""

    job: JobInfo
    summary: str
    decisions: tuple[EventInfo, ...]  # one entry per decision (``Jobs.explain``)
    outlook: DeadlineOutlook
    protection: str
    disruptions_last_hour: int
    queue_status: str


class JobExplainer:
    """The ``ExplainJob`` use case, over the use cases it reads through (each read its own transaction)."""

    def __init__(self, jobs: Jobs, deadlines: Deadlines, queues: Queues) -> None:
        self._jobs = jobs
        self._deadlines = deadlines
        self._queues = queues

    def explain(self, job_id: int, *, now: float, params: PolicyParams) -> JobExplanation:
        """Job ``job_id`` explained (NotFound when there is none); its protection window judged at
        ``now`` by ``params``, the configured policy's parameters."""
        explained = self._jobs.explain(job_id)
        job = explained.job
        outlook = self._deadlines.outlooks([job])[job.id]
        protection, disruptions = explain_protection(
            dataclasses.replace(job_view(job), disruptions=job.disruptions), now, params)
        return JobExplanation(
            job=job, summary=explained.summary, decisions=explained.decisions, outlook=outlook,
            protection=protection, disruptions_last_hour=disruptions, queue_status=self._queues.describe(job.queue),
        )
