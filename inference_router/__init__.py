"""Aryl inference router -- in this version ONLY a demand reporter; it does not route requests yet.

What it does now: every ``router.report_interval_s`` it calls the scheduler's
``InferenceService.ReportDemand`` with a fixed ``router.servers_needed`` (and an observed request
rate of 0), so the scheduler knows how many inference servers must stay serving and may loan the
rest to training. Calls have deadlines and are retried with backoff; SIGTERM/SIGINT stop it cleanly.

What it does not do yet (a later issue): proxy inference requests to the servers in the serving
pool, measure load, derive ``servers_needed`` from it with headroom and hysteresis, and drain a
server from routing before it is loaned.

Nouns: *demand* is the number of inference servers that must be serving; the *source* names the
reporter in the scheduler's event log.
"""
