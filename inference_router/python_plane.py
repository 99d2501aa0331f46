"""The python data plane's part of the router (``router.data_plane = "python"``): routing each request for
the pool over its backends, with retries (``route_request``), and the active health checks of each backend
(``health_check_loop``). On the ``haproxy`` plane HAProxy does both itself and nothing here runs.

Forwarding one request is ``proxy.forward``'s; which backend may take it is the pool's (``pool.BackendPool``).
Must never change the pool's membership or a backend's routing state (the pool source does) nor report
demand: it only counts requests into the router's meter and counters, which the demand loop reads.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from inference_router.pool import Backend
from inference_router.proxy import Outcome, forward, json_error

if TYPE_CHECKING:
    from inference_router.router import Router


async def route_request(router: Router, request: web.Request) -> web.StreamResponse:
    """One request for the pool, on the python data plane: counted as it arrives, then relayed to a backend
    the pool picks, retried on another only when nothing of it can have reached the last (``proxy``);
    the answer, or the router's own 502/503/504 naming every attempt."""
    assert router._session is not None
    started = router.clock()
    router.meter.record_arrival(started)
    router.requests_arrived += 1
    needed = router.servers_needed_now()
    if needed is not None and router.pool.serving < needed:
        router.requests_short += 1
    router.in_flight += 1
    tried: set[str] = set()
    errors: list[str] = []
    try:
        for _ in range(router.config.max_attempts):
            backend = router.pool.pick(router.clock(), tried)
            if backend is None:
                break
            router.pool.begin(backend)          # no await between pick and begin
            tried.add(backend.server_id)
            if len(tried) > 1:
                router.retries += 1
            try:
                attempt = await forward(router._session, request, backend.url)
            finally:
                router.pool.end(backend)
            if attempt.outcome in (Outcome.OK, Outcome.CLIENT_GONE):
                router.pool.record_success(backend)
                router.meter.record_latency(router.clock(), router.clock() - started)
                assert attempt.response is not None
                return attempt.response
            router.pool.record_failure(backend, router.clock())
            errors.append(f"{backend.server_id}: {attempt.error}")
            router._log.warning("backend request failed", server_id=backend.server_id,
                                outcome=attempt.outcome.value, error=attempt.error)
            if attempt.outcome is Outcome.ABORTED:
                router.responses_failed += 1
                assert attempt.response is not None
                return attempt.response
            if attempt.outcome is Outcome.FAILED:
                router.responses_failed += 1
                if attempt.timed_out:
                    return json_error(504, "backend_timeout",
                                      f"the backend sent nothing for {router.config.request_timeout_s} s; not "
                                      "retried because the backend may have acted on the request", attempts=errors)
                return json_error(502, "backend_failed",
                                  "the backend's connection broke after the request was sent; not retried "
                                  "because the backend may have acted on it", attempts=errors)
        router.responses_failed += 1
        if not tried:
            return json_error(503, "no_backend_available", router.pool.why_none_routable(router.clock()))
        return json_error(502, "backend_unreachable",
                          f"no backend could be reached ({len(tried)} tried)", attempts=errors)
    finally:
        router.in_flight -= 1



async def health_check_loop(router: Router, backend: Backend) -> None:
    """Check ``backend`` every ``health_check_interval_s`` on the python data plane (HAProxy checks its own),
    logging only a change; the pool routes by the result (``Backend.active_ok``). Runs until cancelled."""
    cfg = router.config
    timeout = aiohttp.ClientTimeout(total=cfg.health_check_timeout_s)
    while True:
        assert router._session is not None
        try:
            async with router._session.get(backend.url + cfg.health_path, timeout=timeout) as response:
                await response.read()
                ok, why = 200 <= response.status < 300, f"HTTP {response.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            ok, why = False, type(exc).__name__
        if ok != backend.active_ok:
            (router._log.info if ok else router._log.warning)(
                "backend health check " + ("passes again" if ok else "fails"),
                server_id=backend.server_id, endpoint=backend.endpoint, result=why)
        backend.active_ok = ok
        await asyncio.sleep(cfg.health_check_interval_s)
