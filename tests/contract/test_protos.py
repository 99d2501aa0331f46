"""The committed stubs are exactly what `python -m protos.generate` produces from protos/."""

from __future__ import annotations

from pathlib import Path

from protos.generate import PROTO_DIR, REPO_ROOT, generate


def test_generated_stubs_are_up_to_date(tmp_path: Path) -> None:
    fresh = {p.name: p.read_text() for p in generate(tmp_path)}
    committed = {p.name: p.read_text() for p in (REPO_ROOT / PROTO_DIR).glob("*_pb2*.py*")}
    assert fresh, "protoc produced nothing"
    stale = sorted(name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name))
    assert not stale, f"generated stubs are stale, run `make protos`: {stale}"


def test_stubs_import_as_a_package() -> None:
    from protos.aryl.v1 import agent_pb2_grpc, inference_pb2_grpc, scheduler_pb2_grpc

    assert callable(scheduler_pb2_grpc.SchedulerServiceStub)
    assert callable(agent_pb2_grpc.AgentServiceStub)
    assert callable(inference_pb2_grpc.InferenceServiceStub)
