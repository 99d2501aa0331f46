"""Issue 37, 9a: an oversized job spec is refused naming the field that made it so, whichever field that
is (an 8 MiB ``working_dir`` used to be blamed on ``spec.command``)."""

from __future__ import annotations

import time

import pytest

from aryl_common.channels import MAX_JOB_SPEC_BYTES
from scheduler_service.api import job_validation
from scheduler_service.errors import InvalidArgument
from tests.harness import job_spec

EIGHT_MIB = 8 * 1024 * 1024


@pytest.mark.parametrize("field", ["working_dir", "name", "priority_class", "user", "queue", "gpu_types", "command",
                                   "env"])
def test_the_refusal_names_the_bulky_field(field: str) -> None:
    spec = job_spec("big", user="ann")
    bulk = "/" + "d" * EIGHT_MIB
    if field == "gpu_types":
        spec.gpu_types.append(bulk)
    elif field == "command":
        spec.command.append(bulk)
    elif field == "env":
        spec.env["BULK"] = bulk
    else:
        setattr(spec, field, bulk)

    began = time.perf_counter()
    with pytest.raises(InvalidArgument) as refused:
        job_validation.job_submission(spec, "", now=time.time())

    assert refused.value.field == f"spec.{field}"
    assert str(MAX_JOB_SPEC_BYTES) in refused.value.reason
    assert time.perf_counter() - began < 5  # refused without work proportional to fields x size
