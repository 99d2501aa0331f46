#!/usr/bin/env bash
# Aryl on a real GPU machine, in about 3 minutes: tests/gpu with ARYL_REQUIRE_GPU=1 (a missing GPU fails, never
# skips). Run from the repository root of a plain checkout on a machine with an NVIDIA GPU, its driver,
# nvidia-smi and a Python with a CUDA build of PyTorch, numpy, numba, pytest and pytest-timeout, but perhaps no
# network and no Aryl installed: Aryl's other runtime dependencies come from .whl/ (wheels for that Python,
# installed into /tmp/site, never into its site-packages), Aryl itself from the checkout (PYTHONPATH).
#
#   bash scripts/device_gpu_check.sh          # everything goes to $OUT/gpu-check.log (OUT: default /tmp/out)
#
# Also kept under $OUT/logs: the scheduler's, agent's and workers' logs of the run. Exit status: pytest's;
# 2 when the wheels do not install, 3 when a module Aryl needs does not import. On your own GPU server with
# the virtualenv, `make gpu-check` runs the same tests.
set -uo pipefail

OUT=${OUT:-/tmp/out}
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}  # the wheels' folder
SITE=${SITE:-/tmp/site}
BASETEMP=${BASETEMP:-/tmp/aryl-gpu-check}
PYTEST_LIMIT_S=${PYTEST_LIMIT_S:-225}  # the whole pytest run; each test has its own limit below this
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"

# Modules the scheduler, the agent and arylctl import, and what the job imports (torch, numba for the solvers).
MODULES="sqlalchemy alembic structlog pydantic pydantic_settings grpc grpc_health grpc_reflection google.protobuf
google.rpc psycopg2 cryptography yaml aiohttp prometheus_client pynvml tqdm numpy numba torch pytest pytest_timeout"

check() {
    echo "== $(date -u +%FT%TZ) aryl device GPU check on $(hostname), in $PWD ($(git rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout'))"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi
        nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,temperature.gpu,driver_version \
            --format=csv
    else
        echo "nvidia-smi: not on PATH"
    fi

    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        echo "== installing $(find "$WHEELS" -name '*.whl' | wc -l) wheels from $WHEELS into $SITE"
        if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
                "$WHEELS"/*.whl; then
            echo "ERROR: the wheels in $WHEELS did not install (pip above says why)"
            return 2
        fi
        export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "== no wheels in $WHEELS: Aryl's dependencies must be installed already"
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    fi
    echo "PYTHONPATH=$PYTHONPATH"

    echo "== versions"
    # shellcheck disable=SC2086  # MODULES is a list of names
    if ! "$PYTHON" - $MODULES <<'EOF'
import importlib, sys
print("python", sys.version.replace("\n", " "), "at", sys.executable)
failed = []
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 -- every failure is listed
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
        continue
    print(f"  {name} {getattr(module, '__version__', '')} ({getattr(module, '__file__', '')})")
try:
    import torch
    print("torch", torch.__version__, "CUDA", torch.version.cuda, "available", torch.cuda.is_available(),
          "devices", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
    import pynvml
    pynvml.nvmlInit()
    print("NVML driver", pynvml.nvmlSystemGetDriverVersion(), "NVML", pynvml.nvmlSystemGetNVMLVersion(),
          "GPUs", pynvml.nvmlDeviceGetCount())
    pynvml.nvmlShutdown()
except Exception as exc:  # noqa: BLE001 -- reported; the tests say what it means
    print(f"torch/NVML: {type(exc).__name__}: {exc}")
if failed:
    print("ERROR: these modules did not import:", *failed, sep="\n  ")
    sys.exit(3)
EOF
    then
        return 3
    fi

    echo "== ARYL_REQUIRE_GPU=1 pytest tests/gpu (at most ${PYTEST_LIMIT_S}s)"
    rm -rf "$BASETEMP"
    local status=0
    ARYL_REQUIRE_GPU=1 NUMBA_CACHE_DIR=/tmp/aryl-numba-cache timeout -s INT -k 20 "$PYTEST_LIMIT_S" \
        "$PYTHON" -m pytest tests/gpu -v -s -p no:cacheprovider --basetemp="$BASETEMP" \
        -o faulthandler_timeout=$((PYTEST_LIMIT_S - 15)) || status=$?
    [ "$status" = 124 ] && echo "ERROR: pytest ran past ${PYTEST_LIMIT_S}s and was interrupted"

    echo "== after the tests"
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
    if [ -d "$BASETEMP" ]; then  # the daemons' and workers' logs (never the checkpoints: hundreds of MB)
        (cd "$BASETEMP" && find . -name '*.log' -size -5M -print0 | xargs -0 -r cp --parents -t "$OUT/logs" 2>/dev/null) \
            || true
    fi
    echo "== $(date -u +%FT%TZ) pytest exit status $status"
    return "$status"
}

mkdir -p "$OUT/logs"
check 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
