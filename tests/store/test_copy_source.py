"""COPY's input as the store renders it (``store.jobs``): rendered column by column in pieces, it is the
text the rows give one by one, and psycopg2's small reads take it out exactly, each read copying only
what it returns (a job of a 160 KiB command once took minutes to copy in 8 KiB reads).

No database: the text is compared with a row-by-row rendering of the same rows, written here.
"""

from __future__ import annotations

import random
import time

from sqlalchemy.dialects.postgresql import psycopg2 as pg2

from protos.aryl.v1 import types_pb2
from scheduler_service.api import job_validation
from scheduler_service.store import jobs as store_jobs
from scheduler_service.store import models as m

NOW = 1_790_000_000.125
DIALECT = pg2.dialect()


def _rows(count: int, *, long_args: int = 1) -> list[dict[str, object]]:
    rows = []
    for i in range(count):
        spec = types_pb2.JobSpec(
            name=f"job-{i}" if i % 5 else f"back\\slash-{i}", user=f"user-{i % 3}", command=["python", "train.py"],
            gpus_per_worker=1 + i % 2, min_workers=1, max_workers=1 + i % 4,
            env={"T": "a\tb", "NL": f"x\ny{i % 2}"} if i % 3 == 0 else {},
            gpu_types=["A100", "H100"] if i % 7 == 0 else [],
        )
        spec.command.extend(["z" * 4000] * long_args if i % 4 == 0 else [])
        sub = job_validation.job_submission(spec, f"key-{i}" if i % 2 else "", now=NOW)
        rows.append({**store_jobs._JOB_DEFAULTS, **store_jobs._job_row(sub, NOW), "id": i + 1,
                     "array_job_id": None if i % 6 else 1})
    return rows


def _row_by_row(columns: list[str], rows: list[dict[str, object]]) -> str:
    texts = [store_jobs._column_text(m.JOBS.c[c], DIALECT) for c in columns]
    return "".join("\t".join(text(row[c]) for c, text in zip(columns, texts, strict=True)) + "\n" for row in rows)


def test_the_copy_text_rendered_by_column_in_pieces_is_the_rows_text() -> None:
    rows = _rows(2 * store_jobs._COPY_PIECE_ROWS + 37)  # three pieces, the last one short
    columns = list(rows[0])
    pieces = list(store_jobs._copy_lines(columns, rows, DIALECT))
    assert len(pieces) == 3
    assert "".join(pieces) == _row_by_row(columns, rows)


def test_small_reads_take_the_copy_text_out_exactly() -> None:
    chooser = random.Random(7)
    for _ in range(200):
        pieces = ["".join(chooser.choice("ab\n") for _ in range(chooser.randint(0, 40)))
                  for _ in range(chooser.randint(0, 6))]
        source = store_jobs._CopySource(iter(pieces))
        read = []
        while True:
            size = chooser.choice([1, 3, 8, 8192])
            text = source.read(size)
            assert len(text) <= size
            if not text:
                break
            read.append(text)
        assert "".join(read) == "".join(pieces)
        assert source.read(-1) == ""


def test_large_specs_are_read_without_copying_the_rest_of_each_piece_again() -> None:
    rows = _rows(store_jobs._COPY_PIECE_ROWS, long_args=60)  # 240 KB commands, a piece of about 15 MB
    source = store_jobs._CopySource(store_jobs._copy_lines(list(rows[0]), rows, DIALECT))
    started = time.process_time()
    total = 0
    while chunk := source.read(8192):
        total += len(chunk)
    assert total > 15_000_000
    # Linear: a few seconds of CPU at most here; re-copying the rest of the piece at every read took many minutes.
    assert time.process_time() - started < 30
