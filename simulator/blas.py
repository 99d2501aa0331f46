"""The BLAS kernels a simulation's floating point runs on, pinned so that a run gives the same output on every
machine of an architecture, not only on the one it was first run on.

Why: scipy's OpenBLAS, which the fits every goodput-model and heterogeneous job makes as it runs call
(``scipy.optimize``'s L-BFGS-B in ``policies.pollux_search.fit_perf_params_lbfgs``), picks its kernels by the
CPU when it loads. Kernels written for different CPUs round differently in the last bits; a fit's last bits
tip a policy's choice between two nearly equal allocations (``sia``'s program), and from there the runs part.
Measured (sia, philly/workload-3, beyond-Sia setting, one code, one input, only the kernels forced): 0.657 h
average JCT under the SkylakeX kernels (an Intel Xeon's pick), 0.672 h under Haswell's (what an AMD EPYC
picks), 0.668 h under Prescott's.

Rule: importing the simulator package loads scipy's BLAS at once with ``OPENBLAS_CORETYPE`` set to the oldest
kernels of the machine's architecture, which every CPU of it runs (``PINNED_CORE``: x86_64 Prescott's -- which
OpenBLAS names Katmai, its table aliasing the two on x86_64 --, aarch64 ARMV8's; another architecture is left to
OpenBLAS), and ``OPENBLAS_NUM_THREADS`` 1 unless set (thousands of tiny fits a run, in which BLAS threads only
contend: 0.6 s a fit instead of 0.03 s on a busy 2-core machine); then puts ``OPENBLAS_CORETYPE`` back as it
was. So only scipy's BLAS is pinned, whatever the machine's own setting (some set ``OPENBLAS_CORETYPE`` for
every process): numpy's (loaded first, as the environment says) and child processes' are not. It takes effect
only where scipy's BLAS has not loaded yet; the simulator's entry points (``python -m simulator...``,
``python -m evaluation``) import the package before anything loads it. ``ARYL_SIM_BLAS_CORE`` names other
kernels to pin, or ``native`` for OpenBLAS's own pick. ``loaded_core`` says which kernels loaded, and the
evaluation's stamps say it. Where scipy uses another BLAS (macOS's Accelerate) nothing is pinned and
``loaded_core`` is None.

The scheduler imports ``simulator.forecast`` (its demand forecast engine), so the service's own fits (``pollux``,
``sia``) run on the same kernels; its numpy, loaded before, keeps the machine's settings.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

PINNED_CORE = {"x86_64": "Prescott", "amd64": "Prescott", "aarch64": "ARMV8"}
_CORENAME_SYMBOLS = ("scipy_openblas_get_corename", "openblas_get_corename")


def pinned_core(environ: Mapping[str, str], machine: str) -> str | None:
    """The kernels to pin scipy's BLAS to on ``machine`` (module doc); None: OpenBLAS's own pick."""
    chosen = environ.get("ARYL_SIM_BLAS_CORE", "").strip()
    if chosen.lower() == "native":
        return None
    return chosen or PINNED_CORE.get(machine.lower())


def pin() -> None:
    """Load scipy's BLAS with the pinned kernels, leaving the environment's ``OPENBLAS_CORETYPE`` as it was
    (module doc). Does nothing without scipy (the scheduler-only install)."""
    env = os.environ
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    core = pinned_core(env, platform.machine())
    if core is None or "scipy.linalg" in sys.modules or loaded_core() is not None:
        return   # nothing to pin, or too late: scipy's BLAS is loaded (scipy alone loads none of it)
    try:
        import numpy  # noqa: F401 -- its own BLAS loads first, as the environment says
    except ImportError:
        return
    before = env.get("OPENBLAS_CORETYPE")
    env["OPENBLAS_CORETYPE"] = core
    try:
        import scipy.linalg  # type: ignore[import-untyped]  # noqa: F401 -- loads scipy's BLAS, read once
    except ImportError:
        pass
    finally:
        if before is None:
            del env["OPENBLAS_CORETYPE"]
        else:
            env["OPENBLAS_CORETYPE"] = before


def loaded_core(maps: Path = Path("/proc/self/maps")) -> str | None:
    """The kernels scipy's OpenBLAS loaded with in this process (``Prescott``, ``Haswell``, ...); None when it
    has not loaded, or the platform does not say (no ``/proc``, another BLAS)."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return None
    paths = {line.split()[-1] for line in lines if "scipy.libs" in line and "openblas" in line.lower()}
    for path in sorted(paths):
        library = ctypes.CDLL(path)   # already mapped: the same handle, nothing loads twice
        for symbol in _CORENAME_SYMBOLS:
            corename = getattr(library, symbol, None)
            if corename is not None:
                corename.restype = ctypes.c_char_p
                name = corename()
                return name.decode() if isinstance(name, bytes) else None
    return None
