"""The API files work for any language: compiled with the include root ``protos`` alone, a client
generated from them (and nothing else of Aryl's) calls a real scheduler and decodes its errors.

Python's own generator stands in for the other languages' here: what it needs -- the .proto files
under ``protos`` and each language's standard ``google.rpc`` types -- is what a Go, Java or Node
client needs (docs/jobs.md, "Using Aryl from another language")."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from importlib import resources
from pathlib import Path
from typing import Literal, get_args

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from protos.generate import API_DIR, INCLUDE_ROOT, compile_protos, proto_files

# A Literal, since FileOptions.HasField takes only the names of its fields.
LanguageOption = Literal[
    "go_package", "java_package", "java_multiple_files", "java_outer_classname", "csharp_namespace"]
LANGUAGE_OPTIONS: tuple[LanguageOption, ...] = get_args(LanguageOption)


def _protos_alone(tmp_path: Path) -> Path:
    """Only the .proto files, copied out of the repository as a user of another language would."""
    root = tmp_path / "protos"
    (root / API_DIR).mkdir(parents=True)
    for path in proto_files():
        shutil.copy(INCLUDE_ROOT / path, root / path)
    return root


def test_protos_compile_with_the_protos_include_root_and_name_their_packages(tmp_path: Path) -> None:
    root = _protos_alone(tmp_path)
    descriptor_set = tmp_path / "aryl.pb"
    args = ["grpc_tools.protoc", f"-I{root}", f"-I{resources.files('grpc_tools') / '_proto'}",
            f"--descriptor_set_out={descriptor_set}", *(str(p) for p in proto_files())]
    assert protoc.main(args) == 0, "protoc -I protos failed"
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes()).file
    assert sorted(f.name for f in files) == sorted(str(p) for p in proto_files())
    for f in files:
        assert f.package == "aryl.v1"
        assert all(dep.startswith(("aryl/v1/", "google/protobuf/")) for dep in f.dependency), f.dependency
        missing = [option for option in LANGUAGE_OPTIONS if not f.options.HasField(option)]
        assert not missing, f"{f.name} lacks {missing}"
        assert f.options.go_package.endswith(";arylv1")
    assert len({f.options.java_outer_classname for f in files}) == len(files), "java outer classes must differ"


def test_a_client_from_the_protos_alone_calls_the_scheduler_and_decodes_a_bad_request(
        scheduler, tmp_path: Path) -> None:
    out = tmp_path / "generated"
    out.mkdir()
    compile_protos(out, include_root=_protos_alone(tmp_path))
    client = textwrap.dedent(f"""
        import os
        import sys
        sys.path.insert(0, {str(out)!r})
        import grpc
        from google.rpc import error_details_pb2, status_pb2
        from aryl.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
        assert scheduler_pb2.__file__.startswith({str(out)!r}), scheduler_pb2.__file__

        # Mutual TLS and a bearer token, with nothing but gRPC's own credentials (docs/security.md).
        def read(name):
            return open(os.environ[name], "rb").read()
        tls = grpc.ssl_channel_credentials(read("ARYL_TLS_CA"), read("ARYL_TLS_KEY"), read("ARYL_TLS_CERT"))
        token = grpc.access_token_call_credentials(os.environ["ARYL_TOKEN"])
        channel = grpc.secure_channel({scheduler.address!r}, grpc.composite_channel_credentials(tls, token))
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        spec = types_pb2.JobSpec(name="train", user="alice", command=["true"], gpus_per_worker=1, min_workers=1)
        job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=20).job
        print("queued", job.job_id, types_pb2.JobState.Name(job.state))
        spec.gpus_per_worker = 0
        try:
            stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=20)
        except grpc.RpcError as error:
            raw = dict(error.trailing_metadata())["grpc-status-details-bin"]
            for detail in status_pb2.Status.FromString(raw).details:
                bad = error_details_pb2.BadRequest()
                if detail.Unpack(bad):
                    for violation in bad.field_violations:
                        print(error.code().name, violation.field, "|", violation.description)
    """)
    result = subprocess.run([sys.executable, "-c", client], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("queued ") and lines[0].endswith(" JOB_STATE_PENDING"), lines
    assert lines[1:] == ["INVALID_ARGUMENT spec.gpus_per_worker | must be between 1 and 64 (got 0)"], lines
