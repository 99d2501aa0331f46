"""Queue requests checked (CreateQueue, UpdateQueue, DeleteQueue): queue and cohort names, GPU quotas and
borrow limits; every refusal names the field and the reason.

Validation runs before anything touches the database, so a rejected request changes nothing. What this
module must never do: read or write state, or judge a quota against the cluster (``core.quota`` does).
"""

from __future__ import annotations

import re

from scheduler_service.errors import InvalidArgument

# A queue's name: a DNS label (1-63 lowercase letters, digits and '-', starting with a letter).
QUEUE_NAME = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")
MAX_QUEUE_GPUS = 1_000_000


def queue_name(field: str, value: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if not QUEUE_NAME.fullmatch(value):
        raise InvalidArgument(field, f"{value[:70]!r} is not a queue name: 1-63 lowercase letters, digits and '-', "
                                     "starting with a letter and not ending with '-'")
    return value


def cohort_name(field: str, value: str) -> str:
    return queue_name(field, value) if value else ""


def gpu_count(field: str, value: int) -> int:
    """A quota or borrow limit in GPUs: 0 or more."""
    if value < 0 or value > MAX_QUEUE_GPUS:
        raise InvalidArgument(field, f"must be between 0 and {MAX_QUEUE_GPUS} GPUs (got {value}); a negative "
                                     "number is refused")
    return value
