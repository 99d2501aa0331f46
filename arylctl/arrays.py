"""Job array index lists, as ``arylctl submit --array`` takes them (Slurm's ``--array`` syntax).

An index list is comma-separated items, each a single index (``7``), a range (``0-999``, both ends
included) or a range with a step (``0-999:2``: 0, 2, ..., 998). Indices are 0..4,294,967,295 (uint32)
and may not repeat. Slurm's ``%N`` suffix (at most N elements running at once) is refused: the
scheduler has no per-array concurrency limit, and accepting it without enforcing it would mislead.

Pure: no I/O, no gRPC.
"""

from __future__ import annotations

import re

# One SubmitJobs call carries at most this many jobs (the scheduler's MAX_BATCH_JOBS), and an array is
# queued in one call so that it is all or nothing and has one array id.
MAX_ARRAY_SIZE = 10_000
MAX_INDEX = 2**32 - 1

_ITEM = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


class ArraySpecError(ValueError):
    """The index list is malformed; the message says which item and why."""


def parse_array(text: str) -> list[int]:
    """The indices ``text`` names, in the order given (each range ascending)."""
    if not text.strip():
        raise ArraySpecError("--array needs indices, e.g. 0-99, 0-99:2 or 1,3,5")
    if "%" in text:
        raise ArraySpecError(
            f"--array {text!r}: the %N suffix (at most N elements running at once) is not supported: the "
            "scheduler has no per-array concurrency limit; leave it out (the policy runs what fits)")
    indices: list[int] = []
    seen: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        match = _ITEM.fullmatch(item)
        if match is None:
            raise ArraySpecError(f"--array: {item!r} is not an index (7), a range (0-99) or a stepped range (0-99:2)")
        first, last, step = int(match[1]), int(match[2] or match[1]), int(match[3] or 1)
        if last < first:
            raise ArraySpecError(f"--array: range {item!r} ends before it starts")
        if step < 1:
            raise ArraySpecError(f"--array: the step of {item!r} must be at least 1")
        if last > MAX_INDEX:
            raise ArraySpecError(f"--array: {item!r} goes past the largest index, {MAX_INDEX}")
        count = (last - first) // step + 1
        if len(indices) + count > MAX_ARRAY_SIZE:
            raise ArraySpecError(f"--array {text!r} names more than {MAX_ARRAY_SIZE} jobs, the most one array holds")
        for index in range(first, last + 1, step):
            if index in seen:
                raise ArraySpecError(f"--array: index {index} is named twice")
            seen.add(index)
            indices.append(index)
    return indices


def element_key(base: str, index: int) -> str:
    """The idempotency key of one element: the array's key and its index, so resubmitting the same
    array with the same key queues nothing new."""
    return f"{base}.{index}"
