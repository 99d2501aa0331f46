"""Benchmark: reclaim-to-serving latency when workers acknowledge their checkpoint, vs the grace wait.

Real parts, as ``bench_reclaim``: the scheduler as a child process on PostgreSQL, two real
``aryl-agent`` daemons (one training server, one inference server, fake GPUs), and
``examples/train.py`` as an elastic job that grows onto the loaned server. Its workers, on SIGTERM,
take ``CHECKPOINT_S`` to save and then hang in their teardown (``--linger``: what NCCL or data-loader
processes do), so only SIGKILL ends them. Two runs of the same reclaim:

- *acknowledging*: the workers acknowledge the saved checkpoint (``node_agent.contract``); the agent
  SIGKILLs them ``ack_exit_window_s`` (1 s) after the ack;
- *not acknowledging* (``--no-ack``, a job written before acknowledgements): the agent waits out the
  whole ``GRACE_S`` grace period, then SIGKILLs.

Each iteration measures from the inference demand signal to the server listed SERVING again (the
scheduler returns it only after the agent reported the workers gone). Prints both medians (the
acknowledged figure, with the grace-wait one as its reference) and the maxima.
"""

from __future__ import annotations

import logging
import statistics

from benchmarks import emit_figure
from benchmarks.bench_reclaim import PROTECTION, SETTINGS, _reclaim_latencies, reclaim_cluster
from benchmarks.harness import BenchContext, Benchmark

log = logging.getLogger("aryl.bench")

GRACE_S = 6.0
CHECKPOINT_S = 0.5
LINGER_S = 3600.0  # the teardown that never ends by itself
ACK_SETTINGS = {**SETTINGS, "ARYL_SCHEDULING__DEFAULT_GRACE_PERIOD_S": str(GRACE_S)}


def checkpoint_ack_latency(ctx: BenchContext) -> None:
    iterations = 1 if ctx.sizes.submit_jobs < 1000 else 3  # quick: a smoke test
    hanging = ("--linger", str(LINGER_S))
    with reclaim_cluster(ctx, ACK_SETTINGS) as address:
        acked = _reclaim_latencies(address, iterations, CHECKPOINT_S, hanging)
        waited = _reclaim_latencies(address, iterations, CHECKPOINT_S, (*hanging, "--no-ack"))
    log.info("reclaim to serving, workers hanging after their checkpoint: acknowledging %s s, not %s s",
             [round(x, 2) for x in acked], [round(x, 2) for x in waited])
    common = {"iterations": iterations, "grace_period_s": GRACE_S, "worker_checkpoint_s": CHECKPOINT_S, **PROTECTION}
    emit_figure("reclaim_latency_checkpoint_ack_median", statistics.median(acked), "s", **common,
                reference_name="reclaim_latency_grace_wait_median", reference_value=statistics.median(waited),
                reference_unit="s")
    emit_figure("reclaim_latency_checkpoint_ack_max", max(acked), "s", **common,
                reference_name="reclaim_latency_grace_wait_max", reference_value=max(waited), reference_unit="s")


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("checkpoint_ack_latency", checkpoint_ack_latency,
              f"reclaim -> serving with workers acknowledging their checkpoint vs waiting out a {GRACE_S:g} s grace"),
)
