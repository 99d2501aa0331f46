"""``arylctl events``: the scheduler's event log, replayed or followed; and ``-w`` (watch), which renders a
list again after each change the event stream reports. A followed stream outlives a scheduler restart: it
reconnects (``Backoff``) and resumes after the last event it printed."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from queue import Empty, SimpleQueue
from typing import Final

import grpc

from aryl_common.backoff import Backoff
from arylctl.args import AddCommand, count
from arylctl.client import ArylClient, ArylError, DeadlineExceeded, Unavailable
from arylctl.output import EXIT_OK, PROG, Output, enum_name, format_table, local_time, printable, short_state
from protos.aryl.v1 import types_pb2

# `events` without --follow: the log has no end marker, so "caught up" means the stream was
# quiet this long (the connection is established before the clock starts). A busy scheduler paces its
# fan-out to streams (``scheduler_service.notify``): 0.5 s returned an empty log under load.
EVENTS_IDLE_S: Final = 2.0
# `events --follow` after losing its stream: the longest wait between reconnection attempts. It
# retries until Ctrl-C: following is meant to outlive a scheduler restart or upgrade.
EVENTS_RECONNECT_MAX_S: Final = 5.0
# How a stream ends when its scheduler goes away (killed, restarted, stopped: its server cancels
# open streams) rather than because the request is wrong.
EVENTS_RECONNECT_CODES: Final = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # the scheduler's watch-stream limit: a place frees up later
})


EVENT_HEADERS: Final = ("ID", "TIME", "KIND", "JOB", "SERVER", "CHANGE", "REASON", "MESSAGE")
# Streamed rows cannot be aligned on the widest cell; these widths fit typical values.
EVENT_STREAM_WIDTHS: Final = (6, 19, 22, 12, 12, 22, 20, 0)


def _change_text(event: types_pb2.Event) -> str:
    if not event.from_state and not event.to_state:
        return ""
    return f"{short_state(event.from_state) or '-'} -> {short_state(event.to_state) or '-'}"


def event_row(event: types_pb2.Event) -> list[object]:
    return [
        event.event_id,
        local_time(event.time),
        enum_name(types_pb2.EventKind, event.kind),
        event.job_id,
        event.server_id,
        _change_text(event),
        event.reason,
        event.message,
    ]


def _stream_line(row: Sequence[object], widths: Sequence[int]) -> str:
    return "  ".join(printable(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()


def cmd_events(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    if args.follow:
        return _follow_events(client, args, out)
    stream = client.watch_events(
        after_event_id=args.since, job_id=args.job, server_id=args.server_id, idle_timeout=EVENTS_IDLE_S
    )
    with stream:
        events = list(stream)

    def table() -> str:
        if not events:
            out.note(f"No events after event {args.since}.")
            return ""
        return format_table(EVENT_HEADERS, [event_row(e) for e in events])

    out.emit(events, table)
    return EXIT_OK


def _follow_events(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    """Stream events until Ctrl-C. A lost stream (the scheduler stopped, restarted or went out of
    reach) is reopened after the last event printed, so a restart costs neither duplicates nor
    gaps; one line on stderr says so. A scheduler unreachable at the start is an error (exit 3)."""
    client.wait_until_connected()
    after = args.since
    backoff = Backoff.capped(EVENTS_RECONNECT_MAX_S)
    current = client
    announced = False  # the reconnection line of this outage is printed
    try:
        if out.fmt == "table":
            print(_stream_line(EVENT_HEADERS, EVENT_STREAM_WIDTHS), file=out.stream, flush=True)
        while True:
            opened = time.monotonic()
            try:
                with current.watch_events(after_event_id=after, job_id=args.job, server_id=args.server_id) as stream:
                    for event in stream:
                        backoff.reset()
                        announced = False
                        if out.fmt == "table":
                            print(_stream_line(event_row(event), EVENT_STREAM_WIDTHS), file=out.stream, flush=True)
                        else:
                            out.emit_stream_item(event)
                        after = event.event_id
                lost = "the scheduler ended the stream"
            except ArylError as exc:
                if exc.code not in EVENTS_RECONNECT_CODES:
                    raise
                lost = f"{exc.message} ({exc.code.name})"
            if time.monotonic() - opened > EVENTS_RECONNECT_MAX_S:
                announced = False  # the stream was up: this is a new outage
            if not announced:
                out.note(f"{PROG}: lost the event stream from {current.address} ({lost}); reconnecting, "
                         f"resuming after event {after} (Ctrl-C to stop)")
                announced = True
            current = _reconnect(current, backoff)
    except KeyboardInterrupt:
        pass  # --follow ends with Ctrl-C; that is success
    finally:
        if current is not client:
            current.close()
    return EXIT_OK


def _reconnect(current: ArylClient, backoff: Backoff) -> ArylClient:
    """A connected client to the same address, after as many backed-off attempts as it takes.

    Each attempt is a new client: a fresh connection now, not gRPC's own reconnection schedule."""
    while True:
        time.sleep(backoff.next_delay())
        current.close()
        current = ArylClient(current.address, timeout=current.timeout)
        try:
            current.wait_until_connected()
        except (Unavailable, DeadlineExceeded):
            continue
        return current


# `-w`: events that arrive within this long of each other are one change, rendered once (a
# scheduling cycle writes several events in one transaction).
WATCH_SETTLE_S: Final = 0.2
_STREAM_END: Final = object()


def watch(client: ArylClient, out: Output, render: Callable[[ArylClient, bool], None]) -> int:
    """``-w``: render now, then again after each change the event stream reports, until Ctrl-C
    (exit 0). A lost stream (a scheduler restart) is reopened as ``events --follow`` does, and the
    list rendered again once it is back, since changes may have happened meanwhile."""
    client.wait_until_connected()
    backoff = Backoff.capped(EVENTS_RECONNECT_MAX_S)
    current = client
    first = True
    try:
        while True:
            try:
                # Opened before the list is read, so that a change made after that read is not missed.
                with current.watch_events() as stream:
                    render(current, first)
                    first = False
                    for _ in _changes(stream):
                        backoff.reset()
                        render(current, first)
                lost = "the scheduler ended the stream"
            except ArylError as exc:
                if exc.code not in EVENTS_RECONNECT_CODES:
                    raise
                lost = f"{exc.message} ({exc.code.name})"
            out.note(f"{PROG}: lost the event stream from {current.address} ({lost}); reconnecting (Ctrl-C to stop)")
            current = _reconnect(current, backoff)
    except KeyboardInterrupt:
        pass  # -w ends with Ctrl-C; that is success
    finally:
        if current is not client:
            current.close()
    return EXIT_OK


def _changes(stream: Iterable[types_pb2.Event]) -> Iterator[None]:
    """One item per burst of events (events within ``WATCH_SETTLE_S`` of each other); ends with
    the stream, raising its error. A reader thread lets the wait for the burst's end time out."""
    queue: SimpleQueue[object] = SimpleQueue()

    def pump() -> None:
        try:
            for event in stream:
                queue.put(event)
        except ArylError as exc:
            queue.put(exc)
        finally:
            queue.put(_STREAM_END)

    threading.Thread(target=pump, name="arylctl-watch", daemon=True).start()
    while True:
        item = queue.get()
        while isinstance(item, types_pb2.Event):
            try:
                item = queue.get(timeout=WATCH_SETTLE_S)
            except Empty:
                item = None
        if isinstance(item, ArylError):
            raise item
        if item is _STREAM_END:
            return
        yield None


def add_events_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``events [--job ID] [--server-id ID] [-f] [--since ID]``."""
    events = add(
        "events",
        cmd_events,
        "show the event log",
        epilog=(
            "Replays the events after --since (default 0: the whole log). Without --follow it stops once "
            f"the log has been quiet for {EVENTS_IDLE_S:g}s (caught up); with --follow it keeps streaming "
            "new events until Ctrl-C (-o json then prints one JSON object per line, -o yaml one document "
            "per event). A followed stream that loses its scheduler (a restart) says so on stderr and "
            f"reconnects, waiting up to {EVENTS_RECONNECT_MAX_S:g}s between attempts, until Ctrl-C; it "
            "resumes after the last event it printed, so nothing is printed twice or skipped."
        ),
    )
    events.add_argument("--job", default="", metavar="ID", help="only this job's events")
    events.add_argument("--server-id", default="", metavar="ID", help="only this server's events")
    events.add_argument("-f", "--follow", action="store_true", help="keep streaming new events (reconnecting)")
    events.add_argument("--since", type=count, default=0, metavar="EVENT_ID", help="replay events after this id")
