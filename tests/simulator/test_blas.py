"""simulator.blas: scipy's BLAS kernels pinned on the simulator's import, whatever the machine's own setting."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.blas import PINNED_CORE, loaded_core, pinned_core

REPO = Path(__file__).resolve().parents[2]
ON_X86_LINUX = sys.platform == "linux" and platform.machine().lower() in ("x86_64", "amd64")


def test_the_pinned_kernels_follow_the_architecture_and_the_setting() -> None:
    assert pinned_core({}, "x86_64") == "Prescott"
    assert pinned_core({}, "AARCH64") == "ARMV8"
    assert pinned_core({}, "ppc64le") is None                       # left to OpenBLAS
    assert pinned_core({"ARYL_SIM_BLAS_CORE": "Nehalem"}, "x86_64") == "Nehalem"
    assert pinned_core({"ARYL_SIM_BLAS_CORE": " native "}, "x86_64") is None
    assert set(PINNED_CORE.values()) == {"Prescott", "ARMV8"}


def _kernels_after_import(env: dict[str, str], first: str = "") -> tuple[str, str]:
    """What a fresh interpreter that imports ``first`` and then the simulator reports: scipy's loaded kernels,
    and the ``OPENBLAS_CORETYPE`` it leaves for its children."""
    code = (f"import os\n{first}\nimport simulator, scipy.optimize\n"
            "from simulator.blas import loaded_core\n"
            "print(loaded_core(), os.environ.get('OPENBLAS_CORETYPE', '-'))\n")
    full = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "ARYL_SIM_BLAS_CORE")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**full, **env}, capture_output=True,
                         text=True, timeout=120, check=True)
    loaded, left = out.stdout.split()
    return loaded, left


@pytest.mark.skipif(not ON_X86_LINUX, reason="the kernels' names are x86_64 OpenBLAS's; /proc is Linux's")
def test_scipy_loads_the_pinned_kernels_over_the_machines_setting_and_leaves_that_setting_to_children() -> None:
    # OpenBLAS names the Prescott kernels Katmai on x86_64 (its table aliases the two).
    assert _kernels_after_import({"OPENBLAS_CORETYPE": "Nehalem"}) == ("Katmai", "Nehalem")
    assert _kernels_after_import({}) == ("Katmai", "-")
    assert _kernels_after_import({"OPENBLAS_CORETYPE": "Nehalem", "ARYL_SIM_BLAS_CORE": "native"}) == \
        ("Nehalem", "Nehalem")
    assert _kernels_after_import({"ARYL_SIM_BLAS_CORE": "Nehalem"}) == ("Nehalem", "-")
    # scipy's package alone loads no BLAS (the scheduler imports it before the simulator): still pinned
    assert _kernels_after_import({"OPENBLAS_CORETYPE": "Nehalem"}, "import scipy") == ("Katmai", "Nehalem")
    # its BLAS loaded first: too late, the machine's setting stands
    assert _kernels_after_import({"OPENBLAS_CORETYPE": "Nehalem"}, "import scipy.linalg") == ("Nehalem", "Nehalem")


def test_no_kernels_are_reported_where_scipys_blas_has_not_loaded(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 00:00 0 /usr/lib/libc.so.6\n")
    assert loaded_core(maps) is None
    assert loaded_core(tmp_path / "absent") is None
