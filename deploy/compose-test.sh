#!/usr/bin/env bash
# `make compose-test`: the docker-compose deployment for real, on a host without GPUs and without an
# image registry. From the repository root:
#
#  1. a Docker engine: the running one, else Debian's (docker.io, docker-compose) installed and
#     `dockerd --storage-driver vfs` started here (and stopped at the end);
#  2. base images from Debian packages, built once and kept between runs: aryl-base:bookworm
#     (debootstrap minbase + python3, venv, tini) and aryl-postgres:bookworm (deploy/postgres);
#  3. the role images from the Dockerfile (BASE_IMAGE=aryl-base:bookworm), pip reaching the index with
#     this host's settings (PIP_INDEX_URL, its CA bundle as the build secret pip_cert);
#  4. the stack: docker-compose.yml + deploy/compose.no-gpu.yml (fake GPUs, a model server) +
#     deploy/compose.offline.yml (that PostgreSQL image), less the NVIDIA device reservations;
#  5. checks: every container healthy under tini; both agents registered; a request through the router
#     reaches the model server; a job runs and completes; a job whose agent container is restarted
#     mid-run is stopped cleanly (checkpoint), restarted and completes from its checkpoint;
#  6. teardown, always (trap): containers, networks, volumes, and the engine if this script started it.
#
# Must run as root (installs packages, starts the engine). Environment: ARYL_COMPOSE_KEEP_ENGINE=1 leaves
# an engine started here running; ARYL_COMPOSE_REBUILD_BASE=1 rebuilds the base images.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PROJECT=arylct
STATE=$(mktemp -d "${TMPDIR:-/tmp}/aryl-compose-test.XXXXXX")
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
BASE_IMAGE=aryl-base:bookworm
PG_IMAGE=aryl-postgres:bookworm
ROOTFS_CACHE=${ARYL_COMPOSE_CACHE:-/var/cache/aryl-compose}
STARTED_ENGINE=
T0=$SECONDS

say() { printf '[compose-test %4ds] %s\n' "$((SECONDS - T0))" "$*"; }
fail() { say "FAILED: $*"; exit 1; }

[ "$(id -u)" = 0 ] || fail "run as root (it installs Debian packages and starts dockerd)"
[ -x "$PYTHON" ] || fail "$PYTHON missing: run it through make compose-test (creates .venv)"

# ---- 1. the engine -----------------------------------------------------------------------------------
apt_install() {
    say "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >"$STATE/apt.log" 2>&1 \
        || { apt-get update -q >>"$STATE/apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" \
             >>"$STATE/apt.log" 2>&1; } || { tail -20 "$STATE/apt.log"; fail "apt-get install $*"; }
}

if ! docker info >/dev/null 2>&1; then
    command -v dockerd >/dev/null || apt_install docker.io
    say "no engine answers: starting dockerd --storage-driver vfs (log: $STATE/dockerd.log)"
    dockerd --storage-driver vfs >"$STATE/dockerd.log" 2>&1 &
    STARTED_ENGINE=$!
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { tail -20 "$STATE/dockerd.log"; fail "dockerd did not start"; }
fi
if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
else
    command -v docker-compose >/dev/null || apt_install docker-compose
    COMPOSE=(docker-compose)
fi
# BuildKit (RUN --mount): buildx where present, else Debian's docker CLI (built-in BuildKit).
if docker buildx version >/dev/null 2>&1; then
    BUILD=(docker buildx build --load)
elif [ -x /usr/bin/docker ]; then
    BUILD=(env DOCKER_BUILDKIT=1 /usr/bin/docker build)
else
    BUILD=(env DOCKER_BUILDKIT=1 docker build)
fi

# ---- teardown, always --------------------------------------------------------------------------------
COMPOSE_FILE_RENDERED=$STATE/compose.yml
teardown() {
    local status=$?
    if [ -s "$COMPOSE_FILE_RENDERED" ]; then
        if [ "$status" != 0 ]; then
            say "logs of the failed run (last 40 lines per service):"
            "${COMPOSE[@]}" -p "$PROJECT" -f "$COMPOSE_FILE_RENDERED" logs --no-color --tail 40 2>&1 | tail -300 || true
        fi
        say "tearing down the stack"
        "${COMPOSE[@]}" -p "$PROJECT" -f "$COMPOSE_FILE_RENDERED" down -v --remove-orphans -t 60 >/dev/null 2>&1 || true
    fi
    if [ -n "$STARTED_ENGINE" ] && [ -z "${ARYL_COMPOSE_KEEP_ENGINE:-}" ]; then
        say "stopping the dockerd this script started"
        kill "$STARTED_ENGINE" 2>/dev/null || true
        wait "$STARTED_ENGINE" 2>/dev/null || true
    fi
    rm -rf "$STATE"
    if [ "$status" = 0 ]; then say "PASSED in $((SECONDS - T0)) s"; else say "FAILED (exit $status) after $((SECONDS - T0)) s"; fi
    exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# ---- 2. base images from Debian packages (cached: built once) -----------------------------------------
if [ -n "${ARYL_COMPOSE_REBUILD_BASE:-}" ] || ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || apt_install debootstrap
    rootfs=$ROOTFS_CACHE/rootfs
    if [ ! -x "$rootfs/usr/bin/python3" ] || [ -n "${ARYL_COMPOSE_REBUILD_BASE:-}" ]; then
        say "debootstrap bookworm (minbase + python3, venv, tini) into $rootfs"
        rm -rf "$rootfs" && mkdir -p "$ROOTFS_CACHE"
        debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates,tini \
            bookworm "$rootfs" http://deb.debian.org/debian >"$STATE/debootstrap.log" 2>&1 \
            || { tail -20 "$STATE/debootstrap.log"; fail "debootstrap"; }
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    fi
    say "importing $BASE_IMAGE"
    tar -C "$rootfs" -c . | docker import --change 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
    docker image rm "$PG_IMAGE" >/dev/null 2>&1 || true
fi
if ! docker image inspect "$PG_IMAGE" >/dev/null 2>&1; then
    say "building $PG_IMAGE from Debian's postgresql package"
    "${BUILD[@]}" -q --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$PG_IMAGE" deploy/postgres >"$STATE/build-pg.log" 2>&1 \
        || { tail -30 "$STATE/build-pg.log"; fail "building $PG_IMAGE"; }
fi

# ---- 3. the role images --------------------------------------------------------------------------------
build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
# The host's index settings, network ones only (a file:// index on the host is not in the build).
http_only() { tr ' ' '\n' | grep -E '^https?://' | paste -sd ' ' - || true; }
index_url=$(echo "${PIP_INDEX_URL:-$(pip3 config get global.index-url 2>/dev/null || true)}" | http_only)
extra_url=$(echo "${PIP_EXTRA_INDEX_URL:-$(pip3 config get global.extra-index-url 2>/dev/null || true)}" | http_only)
[ -n "$index_url" ] && build_args+=(--build-arg "PIP_INDEX_URL=$index_url")
[ -n "$extra_url" ] && build_args+=(--build-arg "PIP_EXTRA_INDEX_URL=$extra_url")
cert=${PIP_CERT:-$(pip3 config get global.cert 2>/dev/null || true)}
[ -s "$cert" ] || cert=/etc/ssl/certs/ca-certificates.crt
[ -s "$cert" ] && build_args+=(--secret "id=pip_cert,src=$cert")
# One snapshot of the working tree (tracked and untracked files, not the ignored ones) for all three
# builds, so they share the wheel and its layers even while the tree is being edited.
mkdir "$STATE/context"
{ git ls-files -z --cached --others --exclude-standard 2>/dev/null || find . -path ./.git -prune -o -type f -print0; } \
    | tar --null -T - --ignore-failed-read -c 2>/dev/null | tar -x -C "$STATE/context"
for role in scheduler agent router; do
    say "building aryl-$role:local (target $role)"
    "${BUILD[@]}" "${build_args[@]}" --target "$role" -t "aryl-$role:local" "$STATE/context" >"$STATE/build-$role.log" 2>&1 \
        || { tail -30 "$STATE/build-$role.log"; fail "building aryl-$role:local"; }
done
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^aryl-' | sed 's/^/    /'

# ---- 4. the stack ----------------------------------------------------------------------------------------
"${COMPOSE[@]}" -p "$PROJECT" -f docker-compose.yml -f deploy/compose.no-gpu.yml -f deploy/compose.offline.yml \
    config >"$STATE/merged.yml"
"$PYTHON" - "$STATE/merged.yml" "$COMPOSE_FILE_RENDERED" <<'EOF'
import sys, yaml
compose = yaml.safe_load(open(sys.argv[1]))
for name, service in compose["services"].items():
    if name.startswith("agent-"):
        service.pop("deploy", None)  # no NVIDIA runtime here: the agents use fake GPUs
yaml.safe_dump(compose, open(sys.argv[2], "w"), sort_keys=False)
EOF
dc() { "${COMPOSE[@]}" -p "$PROJECT" -f "$COMPOSE_FILE_RENDERED" "$@"; }
# arylctl as the admin, in the training agent's container: its pki volume holds the client certificate and
# the admin's token (the `pki` service made them; docs/security.md).
PKI=/var/lib/aryl/pki
ctl() {
    dc exec -T -e ARYL_TLS_CA=$PKI/ca.crt -e ARYL_TLS_CERT=$PKI/client.crt -e ARYL_TLS_KEY=$PKI/client.key \
        -e ARYL_TOKEN_FILE=$PKI/token-admin agent-train-1 arylctl --server scheduler:50051 "$@"
}
say "docker-compose up"
dc up -d --no-build >"$STATE/up.log" 2>&1 || { cat "$STATE/up.log"; fail "compose up"; }

container() { dc ps -q "$1"; }
wait_healthy() {  # SERVICE...
    local service
    for service in "$@"; do
        for _ in $(seq 120); do
            [ "$(docker inspect -f '{{.State.Health.Status}}' "$(container "$service")" 2>/dev/null)" = healthy ] \
                && continue 2
            sleep 1
        done
        docker inspect -f '{{json .State.Health}}' "$(container "$service")" || true
        fail "$service is not healthy after 120 s"
    done
}
wait_for() {  # SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds
    local seconds=$1 what=$2
    shift 2
    for _ in $(seq "$seconds"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
    fail "$what (waited $seconds s)"
}
wait_healthy postgres scheduler agent-train-1 agent-infer-1 router model-server
say "every container is healthy"

# ---- 5. checks -------------------------------------------------------------------------------------------
for service in scheduler agent-train-1 router; do
    pid1=$(dc exec -T "$service" cat /proc/1/cmdline | tr '\0' ' ')
    case "$pid1" in tini*|/usr/bin/tini*) ;; *) fail "$service: PID 1 is '$pid1', not tini" ;; esac
done
say "tini is PID 1"

# From the host, as docker-compose.yml's header says: the pki copied out of the scheduler's container.
docker cp "$(container scheduler)":$PKI "$STATE/pki" >/dev/null || fail "copying the pki out of the scheduler"
host_ctl() {
    ARYL_TLS_CA="$STATE/pki/ca.crt" ARYL_TLS_CERT="$STATE/pki/client.crt" ARYL_TLS_KEY="$STATE/pki/client.key" \
        ARYL_TOKEN_FILE="$STATE/pki/token-admin" "$ROOT/.venv/bin/arylctl" --server 127.0.0.1:50051 "$@"
}
servers_ready() {
    local listing
    listing=$(host_ctl servers)  # the published port, from the host, with TLS and the admin's token
    grep -q agent-train-1 <<<"$listing" && grep -q agent-infer-1 <<<"$listing"
}
wait_for 60 "both agents registered" servers_ready
say "both agents registered (arylctl on the host, through the published port, TLS and a token)"

routed() { curl -fsS -m 5 -X POST -H 'Content-Type: application/json' -d '{"input": "lyra"}' http://127.0.0.1:8080/v1/infer; }
wait_for 60 "a request through the router reached the model server" routed
routed | grep -q '"aryl"' || fail "the model server's answer: $(routed)"
say "a request through the router reached the model server: $(routed)"

field() {  # KEY: that field of the job in the JSON on stdin (arylctl -o json)
    "$PYTHON" -c '
import json, sys
data = json.load(sys.stdin)
job = data.get("job", data)
print(job.get(sys.argv[1], ""))' "$1"
}
job_state() { ctl job "$1" -o json | field state; }
wait_state() {  # JOB STATE SECONDS
    for _ in $(seq "$3"); do
        state=$(job_state "$1" || true)
        [ "$state" = "$2" ] || [ "$state" = "JOB_STATE_$2" ] && return 0
        case "$state" in *FAILED|*CANCELLED) ctl job "$1" || true; fail "job $1 is $state, expected $2" ;; esac
        sleep 1
    done
    ctl job "$1" || true
    fail "job $1 is not $2 after $3 s (state: ${state:-?})"
}
submit() { ctl submit -o json --chdir /home/aryl --gpus-per-worker 1 --min-workers 1 "$@"; }

job=$(submit --name short -- python examples/train.py --total-steps 6 --step-time 0.5 --checkpoint-every 2 | field job_id)
say "submitted job $job (6 steps)"
wait_state "$job" COMPLETED 120
ctl logs "$job" | grep -q "done: step 6" || { ctl logs "$job" || true; fail "job $job's log does not say it finished"; }
say "job $job ran on an agent and COMPLETED"

job=$(submit --name restarted --restart-policy on_failure --max-restarts 3 -- \
    python examples/train.py --total-steps 60 --step-time 0.5 --checkpoint-every 4 | field job_id)
say "submitted job $job (60 steps, 30 s); restarting agent-train-1's container while it runs"
wait_state "$job" RUNNING 60
sleep 6  # a few steps and checkpoints
dc restart -t 45 agent-train-1 >/dev/null 2>&1
say "agent-train-1 restarted"
wait_state "$job" COMPLETED 180
ctl job "$job" >"$STATE/job.txt" || true
log=$(ctl logs "$job")
grep -q "preempted (SIGTERM)" <<<"$log" || { echo "$log"; fail "job $job's worker was not stopped with SIGTERM"; }
grep -Eq "starting at step [1-9][0-9]* of 60" <<<"$log" || { echo "$log"; fail "job $job did not resume from its checkpoint"; }
say "job $job: its worker was stopped cleanly with the container, restarted from its checkpoint, COMPLETED"
grep -E "starting at step|preempted|done:" <<<"$log" | sed 's/^/    /'
wait_healthy agent-train-1
