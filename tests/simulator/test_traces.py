"""Trace loaders and inference load (simulator/traces.py, generic_trace.py, trace_profiles.py, trace_csv.py, load.py).

Small synthetic files of the real shapes are written to tmp_path; the tests at the end run on the real
traces in ``../shared`` (or ``$ARYL_SHARED_DIR``) and skip cleanly when those are absent.
"""

from __future__ import annotations

import gzip
import math
import os
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from simulator.generic_trace import load_generic_csv
from simulator.load import demand_from_rate, diurnal_demand, load_request_times_rate, load_servegen_rate
from simulator.model import TraceJob
from simulator.trace_csv import TraceFormatError
from simulator.trace_profiles import POLLUX_APPLICATIONS, load_pollux_profile
from simulator.traces import JobMapping, busiest_window, gang_shape, job_gpu_seconds, load_philly, load_pollux_workload

SHARED = Path(os.environ.get("ARYL_SHARED_DIR") or Path(__file__).resolve().parents[2].parent / "shared")


# ------------------------------------------------------------------------------------------------
# builders of small files with the real shapes
# ------------------------------------------------------------------------------------------------


def write(path: Path, text: str, *, gz: bool = False) -> Path:
    if gz:
        with gzip.open(path, "wt", encoding="utf-8", newline="") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def philly_csv(rows: list[tuple[str, float, int, str]]) -> str:
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    lines += [f"{ts},{d},{g},{d * g},{vc}" for ts, d, g, vc in rows]
    return "\n".join(lines) + "\n"


def many_philly_rows(n: int, *, gpus=(1, 1, 1, 2, 4, 8, 16)) -> list[tuple[str, float, int, str]]:
    # Formatted below without a zone, as Philly's log writes its times.
    start = datetime(2017, 10, 10, 0, 0, 5, tzinfo=UTC)
    return [
        ((start + timedelta(seconds=37 * i)).strftime("%Y-%m-%d %H:%M:%S"), 60.0 + 13 * i,
         gpus[i % len(gpus)], "vc1" if i % 3 else "vc2")
        for i in range(n)
    ]


def fake_profile(root: Path, name: str, *, alpha: float = 0.1, epochs: int = 3) -> None:
    """A Pollux-shaped profile folder: step time grows with nodes (sync) and local batch."""
    d = root / name
    d.mkdir(parents=True)
    bszs = (4, 8, 16, 32)
    lines = ["placement,local_bsz,step_time,sync_time"]
    for r in range(1, 17):
        full, rest = divmod(r, 4)
        placement = "".join(map(str, sorted([4] * full + ([rest] if rest else []))))
        nodes = len(placement)
        for b in bszs:
            sync = 0.01 + alpha * 0.05 * (nodes - 1)
            lines.append(f"{placement},{b},{0.01 * b + sync},{sync}")
    (d / "placements.csv").write_text("\n".join(lines) + "\n")
    lines = ["num_nodes,num_replicas,local_bsz,step_time,sync_time"]
    for r in (24, 32):
        for b in bszs:
            sync = 0.01 + alpha * 0.05 * (r // 4 - 1)
            lines.append(f"{r // 4},{r},{b},{0.01 * b + sync},{sync}")
    (d / "scalability.csv").write_text("\n".join(lines) + "\n")
    for batch in (4, 16, 64, 256):
        rows = ["progress,iteration,metric,grad_sqr,grad_var"]
        for e in range(1, epochs + 1):
            its = e * 1000 * 4 / batch * (1 + batch / 1024)  # larger batch: a little more data
            rows.append(f"{e * 1000.0},{its},{0.5},{1.0},{1.0}")
        (d / f"validation-{batch}.csv").write_text("\n".join(rows) + "\n")


@pytest.fixture
def profiles_dir(tmp_path: Path) -> Path:
    root = tmp_path / "profiles"
    for name in POLLUX_APPLICATIONS:
        fake_profile(root, name)
    return root


def assert_points_sound(job: TraceJob) -> None:
    workers = [w for w, _ in job.throughput]
    speeds = [s for _, s in job.throughput]
    assert workers == list(range(job.min_workers, job.max_workers + 1)), "one point per worker count"
    assert all(s > 0 for s in speeds)
    assert all(b >= a for a, b in pairwise(speeds)), f"speed must not fall: {job.throughput}"
    assert job.work > 0 and job.runtime_at(job.min_workers) > 0


# ------------------------------------------------------------------------------------------------
# Philly
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_philly_parses_plain_and_gzip(tmp_path: Path, gz: bool) -> None:
    rows = [("2017-10-10 00:01:55", 73.0, 1, "11cb48"), ("2017-10-10 00:11:55", 66.0, 4, "11cb48"),
            ("2017-10-10 00:21:30", 735.0, 16, "ed69ec"), ("2017-10-10 00:21:30", 10.0, 12, "ed69ec")]
    path = write(tmp_path / ("p.csv.gz" if gz else "p.csv"), philly_csv(rows), gz=gz)
    jobs = load_philly(path, mapping=JobMapping(elastic_share=0.0))
    assert [j.job_id for j in jobs] == [1, 2, 3, 4]
    assert [j.submit_time for j in jobs] == [0.0, 600.0, 1175.0, 1175.0]
    assert [(j.gpus_per_worker, j.min_workers) for j in jobs] == [(1, 1), (4, 1), (8, 2), (6, 2)]
    assert all(j.max_workers == j.min_workers for j in jobs)
    # duration is the run time at the traced size
    assert [j.runtime_at(j.min_workers) for j in jobs] == [73.0, 66.0, 735.0, 10.0]
    assert [j.name for j in jobs] == ["philly-20171010T000155-11cb48", "philly-20171010T001155-11cb48",
                                      "philly-20171010T002130-ed69ec", "philly-20171010T002130-ed69ec-2"]
    midnight = load_philly(path, mapping=JobMapping(), time_origin="midnight")
    assert midnight[0].submit_time == 115.0


def test_philly_limit_and_filters(tmp_path: Path) -> None:
    rows = [("2017-10-10 00:00:00", 30.0, 1, "a"), ("2017-10-10 00:00:10", 100.0, 1, "a"),
            ("2017-10-10 00:00:20", 2000.0, 64, "a"), ("2017-10-10 00:00:30", 500.0, 2, "a")]
    path = write(tmp_path / "p.csv", philly_csv(rows))
    assert len(load_philly(path, mapping=JobMapping(), limit=2)) == 2
    kept = load_philly(path, mapping=JobMapping(), min_duration_s=60, max_gpu_time_s=100_000)
    assert [j.runtime_at(j.min_workers) for j in kept] == [100.0, 500.0]
    assert [j.job_id for j in kept] == [1, 2]


def test_philly_rejects_bad_rows_naming_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path / "p.csv", philly_csv([("2017-10-10 00:00:00", 30.0, 1, "a")])
                 + "2017-10-10 00:00:01,abc,1,1,a\n")
    with pytest.raises(TraceFormatError, match=r"p\.csv:3: column 'duration'") as err:
        load_philly(path, mapping=JobMapping())
    assert (err.value.line, err.value.column) == (3, "duration")
    unsorted = write(tmp_path / "u.csv", philly_csv([("2017-10-10 00:00:09", 30.0, 1, "a"),
                                                     ("2017-10-10 00:00:01", 30.0, 1, "a")]))
    with pytest.raises(TraceFormatError, match="not sorted"):
        load_philly(unsorted, mapping=JobMapping())


def test_gang_shape_is_one_worker_per_server() -> None:
    assert gang_shape(1, 8) == (1, 1)
    assert gang_shape(4, 8) == (4, 1)
    assert gang_shape(8, 8) == (8, 1)
    assert gang_shape(16, 8) == (8, 2)
    assert gang_shape(12, 8) == (6, 2)
    assert gang_shape(24, 8) == (8, 3)
    assert gang_shape(128, 8) == (8, 16)
    assert gang_shape(11, 8) == (1, 11)  # a prime above a server: single-GPU workers
    assert gang_shape(6, 4) == (3, 2)


def test_mapping_is_deterministic_and_seeded(tmp_path: Path) -> None:
    path = write(tmp_path / "p.csv", philly_csv(many_philly_rows(400)))
    a = load_philly(path, mapping=JobMapping(seed=7))
    b = load_philly(path, mapping=JobMapping(seed=7))
    c = load_philly(path, mapping=JobMapping(seed=8))
    assert a == b
    assert [j.max_workers > j.min_workers for j in a] != [j.max_workers > j.min_workers for j in c]
    # a job's draw is keyed by its name: cutting the trace does not change the others' choices
    assert load_philly(path, mapping=JobMapping(seed=7), limit=50) == a[:50]


def test_elastic_share_close_to_requested_on_1000_jobs(tmp_path: Path) -> None:
    path = write(tmp_path / "p.csv", philly_csv(many_philly_rows(1000, gpus=(1,))))
    for share in (0.1, 0.5, 0.9):
        jobs = load_philly(path, mapping=JobMapping(seed=3, elastic_share=share))
        elastic = sum(j.max_workers > j.min_workers for j in jobs)
        assert abs(elastic / 1000 - share) < 0.05, (share, elastic)
    assert all(j.max_workers == j.min_workers for j in load_philly(path, mapping=JobMapping(elastic_share=0)))


def test_elastic_range_scale_and_cap(tmp_path: Path) -> None:
    rows = [("2017-10-10 00:00:00", 100.0, 1, "a"), ("2017-10-10 00:00:01", 100.0, 16, "a"),
            ("2017-10-10 00:00:02", 100.0, 64, "a")]
    path = write(tmp_path / "p.csv", philly_csv(rows))
    jobs = load_philly(path, mapping=JobMapping(elastic_share=1.0, max_scale=3, max_gpus_per_job=32))
    assert [(j.gpus_per_worker, j.min_workers, j.max_workers) for j in jobs] == [(1, 1, 3), (8, 2, 4), (8, 8, 8)]
    for job in jobs:
        assert_points_sound(job)
        assert job.throughput[0][1] == 1.0  # relative speed: 1.0 at the traced size


def test_amdahl_curve_matches_the_core_formula(tmp_path: Path) -> None:
    path = write(tmp_path / "p.csv", philly_csv([("2017-10-10 00:00:00", 100.0, 2, "a")]))
    (job,) = load_philly(path, mapping=JobMapping(elastic_share=1.0, max_scale=4, amdahl_alpha=0.1))
    s = lambda n: n / (1 + 0.1 * (n - 1))  # noqa: E731
    expected: object = tuple((w, pytest.approx(s(2 * w) / s(2))) for w in range(1, 5))  # approx: equal to floats
    assert job.throughput == expected
    assert job.work == 100.0


def test_philly_with_profiles_pollux_gputime_rule(tmp_path: Path, profiles_dir: Path) -> None:
    hours = [0.5, 5, 50, 500]
    rows = [(f"2017-10-10 00:00:0{i}", h * 3600, 1, "a") for i, h in enumerate(hours)]
    path = write(tmp_path / "p.csv", philly_csv(rows))
    mapping = JobMapping(throughput_model="pollux-gputime", elastic_share=1.0)
    jobs = load_philly(path, mapping=mapping, profiles_dir=profiles_dir)
    assert jobs[0].model in ("cifar10", "ncf") and jobs[1].model in ("deepspeech2", "bert")
    assert [j.model for j in jobs[2:]] == ["yolov3", "imagenet"]
    for job in jobs:
        assert_points_sound(job)
        assert job.runtime_at(job.min_workers) == pytest.approx(job.work)
    with pytest.raises(ValueError, match="profiles_dir"):
        load_philly(path, mapping=mapping)


def test_pollux_random_spreads_over_profile_names(tmp_path: Path, profiles_dir: Path) -> None:
    path = write(tmp_path / "p.csv", philly_csv(many_philly_rows(300, gpus=(1, 2))))
    mapping = JobMapping(throughput_model="pollux-random", profile_names=("bert", "imagenet"), seed=1)
    models = Counter(j.model for j in load_philly(path, mapping=mapping, profiles_dir=profiles_dir))
    assert set(models) == {"bert", "imagenet"} and min(models.values()) > 100


def test_job_mapping_validates() -> None:
    with pytest.raises(ValueError, match="elastic_share"):
        JobMapping(elastic_share=1.5)
    with pytest.raises(ValueError, match="throughput_model"):
        JobMapping(throughput_model="resnet")
    with pytest.raises(ValueError, match="max_scale"):
        JobMapping(max_scale=0)


# ------------------------------------------------------------------------------------------------
# Pollux profiles and workloads
# ------------------------------------------------------------------------------------------------


def test_profile_goodput_rules(profiles_dir: Path) -> None:
    p = load_pollux_profile(profiles_dir, "cifar10")
    assert (p.init_batch_size, p.max_batch_size, p.min_local_bsz, p.max_local_bsz) == (4, 256, 4, 32)
    assert p.epochs == 3 and p.max_replicas == 32
    # samples to finish = final iteration * batch, linear in batch between validated sizes
    assert p.samples_to_finish(4) == pytest.approx(3 * 1000 * 4 * (1 + 4 / 1024))
    assert p.samples_to_finish(10) > p.samples_to_finish(4)
    # one GPU at batch 4: one step of local batch 4 (0.04 s + 0.01 s sync)
    assert p.goodput(1, 4) == pytest.approx(4 / 0.05)
    # batch 4 on 2 GPUs would go below the smallest local batch: the batch grows to 8
    grown = 8 / (0.04 + 0.01) * p.samples_to_finish(4) / p.samples_to_finish(8)
    assert p.goodput(2, 4) == pytest.approx(grown)
    # beyond the largest batch, or beyond the measured GPU counts: not runnable
    assert p.goodput(128, 4) is None and p.goodput(33, 4) is None
    # between measured counts (16 and 24) the step time is interpolated
    assert p.goodput(20, 80) is not None
    # gradient accumulation: local 64 > max_local 32 -> 2 micro-steps of 32
    step = 0.32 + 0.01
    assert p.goodput(1, 64) == pytest.approx(64 / (step + (step - 0.01)))


@pytest.mark.parametrize("gz", [False, True])
def test_pollux_workload_parses(tmp_path: Path, profiles_dir: Path, gz: bool) -> None:
    text = ("name,time,application,num_replicas,batch_size\n"
            "cifar10-0,107,cifar10,1,4\nbert-2,90,bert,2,8\nncf-1,200,ncf,4,16\n")
    path = write(tmp_path / ("w.csv.gz" if gz else "w.csv"), text, gz=gz)
    jobs = load_pollux_workload(path, profiles_dir=profiles_dir, mapping=JobMapping(elastic_share=1.0))
    assert [j.name for j in jobs] == ["bert-2", "cifar10-0", "ncf-1"]  # ordered by time
    assert [j.job_id for j in jobs] == [1, 2, 3]
    shapes = [(j.gpus_per_worker, j.min_workers, j.model) for j in jobs]
    assert shapes == [(1, 2, "bert"), (1, 1, "cifar10"), (1, 4, "ncf")]
    cifar = jobs[1]
    profile = load_pollux_profile(profiles_dir, "cifar10")
    assert cifar.work == pytest.approx(profile.samples_to_finish(4))
    first: object = (1, pytest.approx(profile.goodput(1, 4)))  # approx: equal to a float
    assert cifar.throughput[0] == first
    for job in jobs:
        assert_points_sound(job)
        assert job.max_workers <= job.min_workers * 4


def test_pollux_workload_errors(tmp_path: Path, profiles_dir: Path) -> None:
    path = write(tmp_path / "w.csv", "name,time,application,num_replicas,batch_size\na,1,resnet,1,4\n")
    with pytest.raises(TraceFormatError, match=r"w\.csv:2: column 'application'"):
        load_pollux_workload(path, profiles_dir=profiles_dir, mapping=JobMapping())
    path = write(tmp_path / "w.csv", "name,time,application,num_replicas,batch_size\na,1,bert,64,4\n")
    with pytest.raises(TraceFormatError, match="cannot run 64 GPUs"):
        load_pollux_workload(path, profiles_dir=profiles_dir, mapping=JobMapping())
    path = write(tmp_path / "w.csv", "name,time,application,num_replicas\na,1,bert,1\n")
    with pytest.raises(TraceFormatError, match="batch_size"):
        load_pollux_workload(path, profiles_dir=profiles_dir, mapping=JobMapping())


# ------------------------------------------------------------------------------------------------
# generic CSV
# ------------------------------------------------------------------------------------------------

HEADER = "submit_time,gpus_per_worker,min_workers,max_workers,duration_s,work,model,throughput,deadline_s,priority,name"
GENERIC = f"""{HEADER}
100,2,1,4,3600,,,,,,
0,1,2,2,,500,,2:10,1000,5,declared
50,1,1,3,,900,mine,1:10;3:25,,,pts
"""


@pytest.mark.parametrize("gz", [False, True])
def test_generic_csv_parses(tmp_path: Path, gz: bool) -> None:
    path = write(tmp_path / ("g.csv.gz" if gz else "g.csv"), GENERIC, gz=gz)
    jobs = load_generic_csv(path, mapping=JobMapping(amdahl_alpha=0.0))
    assert [j.name for j in jobs] == ["declared", "pts", "job-2"]  # by submit time; default name = line
    declared, pts, amdahl = jobs
    assert (declared.min_workers, declared.max_workers, declared.work) == (2, 2, 500.0)
    assert (declared.deadline, declared.priority) == (1000.0, 5)
    assert declared.runtime_at(2) == 50.0
    assert pts.throughput == ((1, 10.0), (2, 17.5), (3, 25.0)) and pts.model == "mine"
    assert (amdahl.gpus_per_worker, amdahl.min_workers, amdahl.max_workers, amdahl.model) == (2, 1, 4, "amdahl")
    assert amdahl.throughput == ((1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0))  # alpha = 0: linear
    assert amdahl.runtime_at(1) == 3600.0
    for job in jobs:
        assert_points_sound(job)


def test_generic_csv_minimal_columns_and_mapping(tmp_path: Path, profiles_dir: Path) -> None:
    text = "submit_time,gpus_per_worker,min_workers,duration_s,model\n" + "".join(
        f"{i},1,1,{100 + i},bert\n" for i in range(200))
    path = write(tmp_path / "g.csv", text)
    jobs = load_generic_csv(path, mapping=JobMapping(elastic_share=0.5, seed=2), profiles_dir=profiles_dir)
    assert all(j.model == "bert" for j in jobs)
    assert 0 < sum(j.max_workers > j.min_workers for j in jobs) < 200  # the mapping decides elasticity
    for job in jobs:
        assert_points_sound(job)
    with pytest.raises(TraceFormatError, match=r"g\.csv:2: column 'model'.*profiles_dir"):
        load_generic_csv(path)


@pytest.mark.parametrize(
    ("row", "line", "column"),
    [
        ("x,1,1,,10,,,,,,", 3, "submit_time"),
        ("-1,1,1,,10,,,,,,", 3, "submit_time"),
        ("0,0,1,,10,,,,,,", 3, "gpus_per_worker"),
        ("0,1,1.5,,10,,,,,,", 3, "min_workers"),
        ("0,1,3,2,10,,,,,,", 3, "max_workers"),
        ("0,1,1,,,,,,,,", 3, "duration_s"),
        ("0,1,1,,10,5,,,,,", 3, "work"),
        ("0,1,1,,,5,,,,,", 3, "work"),
        ("0,1,1,,-10,,,,,,", 3, "duration_s"),
        ("0,1,1,2,10,,,1:5,,,", 3, "throughput"),
        ("0,1,1,,10,,,1-5,,,", 3, "throughput"),
        ("5,1,1,,10,,,,5,,", 3, "deadline_s"),
        ("0,1,1,,10,,,,,high,", 3, "priority"),
        ("0,1,1,,10,,,,,,dup", 3, "name"),
        ("0,1,1,,10,,,,,", 3, None),
    ],
)
def test_generic_csv_errors_name_line_and_column(tmp_path: Path, row: str, line: int, column: str | None) -> None:
    path = write(tmp_path / "g.csv", f"{HEADER}\n0,1,1,,10,,,,,,dup\n{row}\n")
    with pytest.raises(TraceFormatError) as err:
        load_generic_csv(path)
    assert (err.value.line, err.value.column) == (line, column)
    assert str(err.value).startswith(f"{path}:{line}:")
    if column:
        assert f"column {column!r}" in str(err.value)


def test_generic_csv_header_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "g.csv", "submit_time,gpus_per_worker,min_workers,duraton_s\n0,1,1,5\n")
    with pytest.raises(TraceFormatError, match="unknown column") as err:
        load_generic_csv(path)
    assert (err.value.line, err.value.column) == (1, "duraton_s")
    path = write(tmp_path / "g.csv", "submit_time,min_workers,duration_s\n0,1,5\n")
    with pytest.raises(TraceFormatError, match="missing column") as err:
        load_generic_csv(path)
    assert err.value.column == "gpus_per_worker"


# ------------------------------------------------------------------------------------------------
# windows
# ------------------------------------------------------------------------------------------------


def test_busiest_window_by_gpu_time_and_jobs() -> None:
    def job(i: int, t: float, gpu_s: float) -> TraceJob:
        return TraceJob(job_id=i, name=f"j{i}", submit_time=t, gpus_per_worker=1, min_workers=1,
                        max_workers=1, work=gpu_s, throughput=((1, 1.0),))

    day = 86400.0
    jobs = [job(1, 0, 10), job(2, 0.5 * day, 10), job(3, 0.7 * day, 10), job(4, 2 * day, 500), job(5, 5 * day, 1)]
    w = busiest_window(jobs, days=1)
    assert (w.start_s, w.weight, [j.name for j in w.jobs]) == (2 * day, 500.0, ["j4"])
    assert w.jobs[0].submit_time == 0.0 and w.jobs[0].job_id == 1
    w = busiest_window(jobs, days=1, by="jobs")
    assert [j.name for j in w.jobs] == ["j1", "j2", "j3"]
    w = busiest_window(jobs, days=1, by="jobs", align_s=day)
    assert (w.start_s, [j.name for j in w.jobs]) == (0.0, ["j1", "j2", "j3"])
    assert job_gpu_seconds(jobs[3]) == 500.0


# ------------------------------------------------------------------------------------------------
# inference load
# ------------------------------------------------------------------------------------------------


def servegen_csv(rates: dict[str, list[tuple[float, int]]]) -> str:
    lines = ["category,model,t_sec,total_rate_rps,active_clients"]
    for model, values in rates.items():
        lines += [f"language,{model},{600 * i},{r},{c}" for i, (r, c) in enumerate(values)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("gz", [False, True])
def test_servegen_rate_loads_and_fills_gaps(tmp_path: Path, gz: bool) -> None:
    text = servegen_csv({"m-small": [(100, 3), (0, 0), (300, 4), (400, 2)], "m-large": [(5, 1)]})
    path = write(tmp_path / ("r.csv.gz" if gz else "r.csv"), text, gz=gz)
    assert load_servegen_rate(path) == [(0.0, 100.0), (600.0, 200.0), (1200.0, 300.0), (1800.0, 400.0)]
    assert load_servegen_rate(path, fill_gaps=False)[1] == (600.0, 0.0)
    assert load_servegen_rate(path, model="m-large") == [(0.0, 5.0)]
    with pytest.raises(ValueError, match="available"):
        load_servegen_rate(path, model="m-huge")


@pytest.mark.parametrize("gz", [False, True])
def test_a_request_trace_is_binned_from_its_first_midnight(tmp_path: Path, gz: bool) -> None:
    # The Alibaba GenAI trace's shape: one row per request, its time in gmt_create. Day 0 starts at the midnight
    # before the first request; 10-minute bins; empty bins are rate 0 (idle, not a gap).
    rows = ["2024-11-15 16:57:50", "2024-11-16 00:00:00", "2024-11-16 00:09:59", "2024-11-16 00:25:00",
            "2024-11-16 00:25:01", "2024-11-16 00:29:00"]
    text = "gmt_create,predict_type,predict_status,exec_time_seconds\n" + "".join(
        f"{t},TXT_2_IMG,SUCCEED,30.0\n" for t in rows)
    path = write(tmp_path / ("r.csv.gz" if gz else "r.csv"), text, gz=gz)
    whole = load_request_times_rate(path)
    assert whole[0] == (0.0, 0.0) and len(whole) == 144 + 3  # 2024-11-15 00:00 .. the bin of 2024-11-16 00:29
    assert whole[16 * 6 + 5] == (60600.0, 1 / 600)       # 16:57:50 falls in 16:50-17:00
    # From day 1: 00:00 and 00:09:59 in bin 0, none in bin 1, three in bin 2.
    assert load_request_times_rate(path, start_day=1) == [(0.0, 2 / 600), (600.0, 0.0), (1200.0, 3 / 600)]
    assert load_request_times_rate(path, start_day=1, bin_s=1800.0) == [(0.0, 5 / 1800)]
    with pytest.raises(ValueError, match="no requests from day 5"):
        load_request_times_rate(path, start_day=5)
    bad = write(tmp_path / "bad.csv", "gmt_create\n2024-11-15T16:57:50\n")
    with pytest.raises(TraceFormatError, match="YYYY-MM-DD HH:MM:SS"):
        load_request_times_rate(bad)
    with pytest.raises(TraceFormatError, match="missing column 'gmt_create'"):
        load_request_times_rate(write(tmp_path / "none.csv", "time\n1\n"))


def test_the_need_before_the_clip_is_kept() -> None:
    series = [(0.0, 0.0), (600.0, 1000.0)]
    points = demand_from_rate(series, inference_servers=5, per_server_rps=30.0, headroom=0.2)
    # 1000 * 1.2 / 30 = 40 servers wanted, 5 asked for (the whole cluster); 0 -> 1 (min_servers) both ways.
    assert [(p.servers_needed, p.servers_wanted) for p in points] == [(1, 1), (5, 40)]


def test_demand_ceil_headroom_and_clipping() -> None:
    series = [(0.0, 0.0), (600.0, 95.0), (1200.0, 100.0), (1800.0, 1000.0)]
    points = demand_from_rate(series, inference_servers=5, per_server_rps=30.0, headroom=0.2)
    # 0 -> clipped up to 1; 95 * 1.2 / 30 = 3.8 -> 4; 100 * 1.2 / 30 = 4 exactly; 1000 -> clipped to 5
    assert [p.servers_needed for p in points] == [1, 4, 4, 5]
    assert [p.time for p in points] == [0.0, 600.0, 1200.0, 1800.0]
    assert [p.rate_rps for p in points] == [0.0, 95.0, 100.0, 1000.0]
    assert demand_from_rate(series, inference_servers=5, per_server_rps=30.0, min_servers=0)[0].servers_needed == 0


def test_demand_scaled_so_peak_needs_whole_cluster() -> None:
    series = [(600.0 * i, r) for i, r in enumerate([10.0, 37.3, 81.7, 100.3, 55.0])]
    for n in (1, 7, 16, 100):
        points = demand_from_rate(series, inference_servers=n, headroom=0.25)
        assert max(p.servers_needed for p in points) == n
        assert points[3].servers_needed == n
        assert points[0].servers_needed == max(1, math.ceil(10.0 / 100.3 * n - 1e-9))
    half = demand_from_rate(series, inference_servers=10, peak_utilisation=0.5)
    assert max(p.servers_needed for p in half) == 5
    q = demand_from_rate(series, inference_servers=10, peak_quantile=0.75)
    assert [p.servers_needed for p in q].count(10) == 2  # the 75th percentile and the max both clip at 10


def test_demand_repeats_to_cover_duration_and_starts_anywhere() -> None:
    day = [(600.0 * i, float(i + 1)) for i in range(144)]  # one day
    points = demand_from_rate(day, inference_servers=144, per_server_rps=1.0, headroom=0.0, duration_s=2.5 * 86400)
    assert len(points) == 360
    assert [p.time for p in points] == [600.0 * i for i in range(360)]
    assert points[144].rate_rps == 1.0 and points[143].rate_rps == 144.0  # daily repeat
    once = demand_from_rate(day, inference_servers=144, per_server_rps=1.0)
    assert len(once) == 144
    shifted = demand_from_rate(day, inference_servers=144, per_server_rps=1.0, start_s=900.0, duration_s=1800.0)
    assert [(p.time, p.rate_rps) for p in shifted] == [(0.0, 2.0), (300.0, 3.0), (900.0, 4.0), (1500.0, 5.0)]


def test_diurnal_curve_shape() -> None:
    points = diurnal_demand(inference_servers=20, days=3, low=0.2, high=1.0, noise=0.0, seed=0, peak_s=20 * 3600)
    assert len(points) == 3 * 144 and points[1].time - points[0].time == 600.0
    by_time = {p.time: p.servers_needed for p in points}
    assert by_time[20 * 3600] == 20 and by_time[86400 + 20 * 3600] == 20  # high at the peak hour
    assert by_time[8 * 3600] == 4  # low half a day later: ceil(0.2 * 20)
    assert all(4 <= p.servers_needed <= 20 for p in points)
    noisy = diurnal_demand(inference_servers=20, days=1, noise=0.1, seed=1)
    assert noisy == diurnal_demand(inference_servers=20, days=1, noise=0.1, seed=1)
    assert noisy != diurnal_demand(inference_servers=20, days=1, noise=0.1, seed=2)
    assert all(1 <= p.servers_needed <= 20 for p in noisy)


# ------------------------------------------------------------------------------------------------
# the real traces in ../shared (skipped when absent)
# ------------------------------------------------------------------------------------------------


def shared_path(relative: str) -> Path:
    path = SHARED / relative
    if not path.exists():
        pytest.skip(f"{path} not present (set ARYL_SHARED_DIR)")
    return path


PROFILES = "traces/pollux-throughput-profiles"


def test_real_philly_15_days() -> None:
    path = shared_path("traces/philly-pollux/philly_jobs_15d_2017-10-10.csv.gz")
    started = time.perf_counter()
    jobs = load_philly(path, mapping=JobMapping(seed=0, elastic_share=0.5), time_origin="midnight")
    elapsed = time.perf_counter() - started
    assert len(jobs) == 28_554
    assert elapsed < 10, f"loading took {elapsed:.1f} s"
    assert 0 <= jobs[0].submit_time < 3600 and jobs[-1].submit_time < 15 * 86400
    assert abs(sum(j.max_workers > j.min_workers for j in jobs) / len(jobs) - 0.5) < 0.02
    # README: about 586 GPUs busy on average over the window
    assert sum(job_gpu_seconds(j) for j in jobs) / (15 * 86400) == pytest.approx(586, abs=1)
    for job in jobs[:2000]:
        assert_points_sound(job)


def test_real_philly_with_pollux_profiles() -> None:
    path = shared_path("traces/philly-pollux/philly_jobs_15d_2017-10-10.csv.gz")
    profiles = shared_path(PROFILES)
    mapping = JobMapping(throughput_model="pollux-gputime", elastic_share=1.0)
    jobs = load_philly(path, mapping=mapping, profiles_dir=profiles, limit=3000)
    assert {j.model for j in jobs} <= set(POLLUX_APPLICATIONS)
    for job in jobs:
        assert_points_sound(job)
        assert job.runtime_at(job.min_workers) == pytest.approx(job.work)


def test_real_philly_busiest_window_is_the_15_day_file() -> None:
    full = shared_path("traces/philly-pollux/philly_jobs.csv.gz")
    cut = shared_path("traces/philly-pollux/philly_jobs_15d_2017-10-10.csv.gz")
    mapping = JobMapping(seed=5)
    jobs = load_philly(full, mapping=mapping, time_origin="midnight")
    window = busiest_window(jobs, days=15, by="jobs", align_s=86400)
    assert window.jobs == load_philly(cut, mapping=mapping, time_origin="midnight")


@pytest.mark.parametrize("folder", ["workloads", "workloads-realistic", "workloads-0.5", "workloads-2.0"])
def test_real_pollux_workloads_load(folder: str) -> None:
    root = shared_path(f"pollux-data/{folder}")
    profiles = shared_path(PROFILES)
    files = sorted(root.glob("workload-*.csv"))
    assert files
    for path in files:
        jobs = load_pollux_workload(path, profiles_dir=profiles, mapping=JobMapping(elastic_share=1.0))
        assert len(jobs) in (80, 160, 240, 320)
        for job in jobs:
            assert_points_sound(job)


def test_real_pollux_profiles_match_pollux_simulator_single_gpu() -> None:
    """Reference: the Pollux simulator's Tiresias runs of workloads-realistic (pollux-data/reference-
    runs). The fastest of its 487 1-GPU cifar10 jobs at batch 128 took 4,030 s, a 30-s start delay
    included."""
    profile = load_pollux_profile(shared_path(PROFILES), "cifar10")
    goodput = profile.goodput(1, 128)
    assert goodput is not None
    runtime = profile.samples_to_finish(128) / goodput
    assert runtime == pytest.approx(4028, rel=0.01)


def test_real_servegen_m_small() -> None:
    path = shared_path("traces/servegen-llm-load/servegen_total_rate_10min.csv")
    series = load_servegen_rate(path, category="language", model="m-small")
    assert len(series) == 2016 and series[-1][0] == 1_209_000.0
    assert min(r for _, r in series) > 0  # the 37 empty windows are filled
    points = demand_from_rate(series, inference_servers=16, duration_s=20 * 86400)
    assert max(p.servers_needed for p in points) == 16
    assert points[-1].time < 20 * 86400 <= points[-1].time + 600
