"""Aryl inference router (``aryl-router``): the controller of the inference data plane, which turns the
load into the scheduler's demand signal.

Nouns:
- *data plane*: what carries the requests. ``haproxy`` (the default): HAProxy, a child process the router
  starts, programs over its runtime API and reads the load from (``haproxy``); ``python``: the router's own
  asyncio HTTP proxy (``proxy``), opt-in, for hosts without HAProxy.
- *backend*: one inference server the router may send requests to (``server_id``, base URL). Its
  routing state comes from the scheduler's serving pool (``WatchServingPool``): ``SERVING`` gets
  requests, ``DRAINING`` gets none and is reported drained (``ReportDrained``) once nothing is in
  flight there, a server missing from the pool gets nothing. Or from ``router.static_backends``.
- *health*: passive (consecutive transport failures eject a backend: python, for a cool-down; haproxy,
  until an active check passes) and active (a periodic ``GET <endpoint><health_path>``); an unhealthy
  backend keeps its pool state.
- *demand*: the number of inference servers that must be serving -- static (``servers_needed``) or
  measured (``ceil(rate * (1 + headroom) / server_capacity_rps)`` with hysteresis and forecasts).
  The *source* names the reporter in the scheduler's event log.

Modules: ``config`` (typed settings), ``pool`` (backends and their states; the Python proxy's balancing;
no I/O), ``haproxy`` (HAProxy's config, process, runtime API and statistics), ``proxy`` (the Python proxy:
forwarding one request), ``python_plane`` (the Python proxy: routing each request over the pool, health
checks), ``demand`` (rates, latency, the need; pure arithmetic), ``scheduler_link`` (the
gRPC calls), ``router`` (the event loop that wires them), ``stats`` (what ``GET /aryl/stats`` answers),
``main`` (the CLI).

The router never decides loans or reclaims; it routes, measures and reports.
"""
