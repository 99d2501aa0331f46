"""In-process wake-ups from committed changes to the asyncio streams that wait for them.

A ``Signal`` is a version counter: writers (any thread) bump it after commit; readers remember the
version they saw, re-read the database, and wait for a newer one. A missed wake-up only delays a
reader until its poll timeout; it never loses data, because the database is re-read every time.

A ``DesiredStateFeed`` fans the desired state of servers out to the agent streams that watch them:
after a commit, one read serves every touched server together, however many streams wait. An
``EventFeed`` does the same for the event log (WatchEvents: one read of the new entries per change,
recent entries held in memory and filtered per stream), and a ``SharedRead`` for one answer that
many streams watch (WatchServingPool). Streams with nothing new cost no database work; each feed
re-reads at least every ``recheck_s`` while watched (writes by other processes), and nothing when not.

Modules: ``signals`` (``Signal``), ``desired_states`` (``DesiredStateFeed``), ``event_feed``
(``EventFeed``, ``SlowReader``), ``shared_read`` (``SharedRead``) and ``notifier`` (``AsyncNotifier``,
the service's ``Notifier``, which serves them all).

Never: hold domain state of its own beyond the last state read for a watched server, or decide
anything; the database stays the single source of truth.
"""
