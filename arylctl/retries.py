"""How ``ArylClient`` tries a submission again: the idempotency key it always sends, which failures
are retried and for how long, and what a caller hears of each retry (``SubmitRetry``).

Nouns: a *try* is one SubmitJob(s) call; a scheduler is *reached* once any call of the client got past
connecting (a failure before that cannot have queued anything, so few tries are made); the
*idempotency key* makes a resubmission answer with the job the first try queued. ``arylctl.client``'s
docstring ("Retries") is the user's account of these rules.
What this module must never do: retry any call but a submission, or retry without the same key.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import grpc

from aryl_common.backoff import Backoff
from arylctl.errors import ArylError, DeadlineExceeded, Unavailable

# Tries of one submit_job in all when no scheduler was ever reached (a wrong address, the scheduler not
# running), each with the client's timeout, 0.25-0.5 s then 0.5-1 s apart (jittered).
SUBMIT_ATTEMPTS: Final = 3
# How long submit_job keeps trying once a scheduler was reached (it may have queued the job and died
# before answering): a restart takes ~5 s, a standby's takeover a lease (~10 s). Tries 1-2 s apart.
SUBMIT_RETRY_S: Final = 30.0
SUBMIT_RETRY_MAX_DELAY_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class SubmitRetry:
    """A submission about to be tried again (``submit``'s ``on_retry``): what failed, after how long."""

    idempotency_key: str
    error: ArylError
    tries: int            # made so far
    waited_s: float       # since the first failure
    retry_s: float        # how long the submission is retried in all


def new_idempotency_key() -> str:
    """A fresh random idempotency key (what ``submit_job`` sends when given none)."""
    return secrets.token_hex(16)



# How gRPC words an UNAVAILABLE call that never had a connection (nothing listening, no such host, TLS refused).
_NOT_CONNECTED: Final = ("failed to connect", "resolv", "handshake")


def never_connected(exc: grpc.RpcError) -> bool:
    """Whether the failed call never reached a server (it cannot have been acted on)."""
    if not isinstance(exc, grpc.Call) or exc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = (exc.details() or "").lower()
    return any(words in details for words in _NOT_CONNECTED)


def with_key(error: ArylError, key: str) -> None:
    """``error`` of a submission sent with ``key``: the key set on it, and said in a note."""
    if key and not error.idempotency_key:
        error.idempotency_key = key
        error.add_note(f"idempotency key {key!r}: submitting again with it never queues the job twice")


def submit_with_retries(call: Callable[[], Any], *, key: str, attempts: int | None, retry_s: float,
                        on_retry: Callable[[SubmitRetry], None] | None, reached: threading.Event,
                        closed: threading.Event) -> Any:
    """``call`` (a submission carrying ``key``) with ``ArylClient.submit``'s retries; a failure raises with
    the key. ``reached``: set once a call of the client reached a scheduler; ``closed``: the client closed."""
    if attempts is not None and attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    backoff = Backoff(SUBMIT_RETRY_MAX_DELAY_S, initial_s=0.5)
    first_failure: float | None = None
    tries = 0
    while True:
        tries += 1
        try:
            return call()
        except (Unavailable, DeadlineExceeded) as exc:
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            delay = backoff.next_delay()
            out_of_tries = tries >= (attempts or (math.inf if reached.is_set() else SUBMIT_ATTEMPTS))
            if out_of_tries or closed.is_set() or now + delay - first_failure > retry_s:
                with_key(exc, key)
                raise
            if on_retry is not None:
                on_retry(SubmitRetry(key, exc, tries, now - first_failure, retry_s))
            time.sleep(delay)
        except ArylError as exc:
            with_key(exc, key)
            raise
