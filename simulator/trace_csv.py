"""Reading a trace file: plain or gzip CSV rows checked against their header, typed cells, and the
one error every trace and load reader raises (``TraceFormatError``).

What this module is for: the file-level half of every loader (``simulator.traces``,
``simulator.generic_trace``, ``simulator.trace_profiles``, ``simulator.load``), so that a bad file is
reported the same way everywhere -- by path, 1-based line and column.
Nouns: a *row* is one data line as ``{column: text}``; a *cell* is one column's text, parsed to a type.
What it must never do: know what a column means (the loaders do), or guess a file's compression from
its name.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["TraceFormatError"]


class TraceFormatError(ValueError):
    """A trace file the loader cannot use; names the file, the 1-based line and the column."""

    def __init__(self, path: str | Path, line: int | None, column: str | None, message: str):
        self.path = str(path)
        self.line = line
        self.column = column
        where = self.path if line is None else f"{self.path}:{line}"
        col = f" column {column!r}:" if column else ""
        super().__init__(f"{where}:{col} {message}")


def _open_text(path: str | Path) -> io.TextIOBase:
    """Open plain or gzip CSV (by magic bytes, not by name)."""
    p = Path(path)
    with p.open("rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8", newline="")
    return p.open("r", encoding="utf-8", newline="")


def _dict_rows(
    path: str | Path, required: Sequence[str], allowed: Sequence[str] | None = None
) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line number, row)`` for every data row; the header must name every ``required`` column
    and, when ``allowed`` is given, no other."""
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(path, 1, None, "empty file (expected a header row)")
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceFormatError(path, 1, missing[0], f"missing column(s) {missing}; header is {header}")
        unknown = [c for c in header if allowed is not None and c not in allowed]
        if unknown:
            raise TraceFormatError(path, 1, unknown[0], f"unknown column(s) {unknown}; known: {list(allowed or ())}")
        for values in reader:
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise TraceFormatError(
                    path, reader.line_num, None, f"expected {len(header)} fields, found {len(values)}"
                )
            yield reader.line_num, dict(zip(header, (v.strip() for v in values), strict=True))


def _parse(row: dict[str, str], column: str, kind: type, path: str | Path, line: int):
    text = row.get(column, "")
    if text == "":
        raise TraceFormatError(path, line, column, "value is missing")
    try:
        if kind is int:
            value = float(text)
            if not value.is_integer():
                raise ValueError
            return int(value)
        value = kind(text)
    except ValueError:
        raise TraceFormatError(path, line, column, f"expected {kind.__name__}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise TraceFormatError(path, line, column, f"expected a finite number, got {text!r}")
    return value

