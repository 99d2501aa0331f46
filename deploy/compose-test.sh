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
# Each project brought up, as "NAME FILE": the one-host stack, then the two-host layout's control and GPU hosts.
STACKS=("$PROJECT $COMPOSE_FILE_RENDERED")
teardown() {
    local status=$? stack name file
    for stack in "${STACKS[@]}"; do
        name=${stack%% *} file=${stack#* }
        [ -s "$file" ] || continue
        if [ "$status" != 0 ]; then
            say "logs of the failed run, project $name (last 40 lines per service):"
            "${COMPOSE[@]}" -p "$name" -f "$file" logs --no-color --tail 40 2>&1 | tail -300 || true
        fi
        say "tearing down project $name"
        "${COMPOSE[@]}" -p "$name" -f "$file" down -v --remove-orphans -t 60 >/dev/null 2>&1 || true
    done
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
# No NVIDIA runtime here: the agents' device reservations go, and they use fake GPUs (FAKE_COUNT where given).
without_gpus() {  # MERGED RENDERED [FAKE_COUNT]
    "$PYTHON" - "$@" <<'EOF'
import sys, yaml
compose = yaml.safe_load(open(sys.argv[1]))
for name, service in compose["services"].items():
    if "aryl-agent" in str(service.get("command", "")):
        service.pop("deploy", None)
        if len(sys.argv) > 3:
            service["environment"].update(ARYL_GPUS__BACKEND="fake", ARYL_GPUS__FAKE_COUNT=sys.argv[3])
yaml.safe_dump(compose, open(sys.argv[2], "w"), sort_keys=False)
EOF
}
without_gpus "$STATE/merged.yml" "$COMPOSE_FILE_RENDERED"
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

DC=dc  # the project wait_healthy looks in
container() { $DC ps -q "$1"; }
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
HOST_PKI=$STATE/pki CTL_SERVER=127.0.0.1:50051
host_ctl() {
    ARYL_TLS_CA="$HOST_PKI/ca.crt" ARYL_TLS_CERT="$HOST_PKI/client.crt" ARYL_TLS_KEY="$HOST_PKI/client.key" \
        ARYL_TOKEN_FILE="$HOST_PKI/token-admin" "$ROOT/.venv/bin/arylctl" --server "$CTL_SERVER" "$@"
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
CTL=ctl  # how the checks below reach the scheduler (section 6: host_ctl, as from another machine)
job_state() { $CTL job "$1" -o json | field state; }
wait_state() {  # JOB STATE SECONDS
    for _ in $(seq "$3"); do
        state=$(job_state "$1" || true)
        [ "$state" = "$2" ] || [ "$state" = "JOB_STATE_$2" ] && return 0
        case "$state" in *FAILED|*CANCELLED) $CTL job "$1" || true; fail "job $1 is $state, expected $2" ;; esac
        sleep 1
    done
    $CTL job "$1" || true
    fail "job $1 is not $2 after $3 s (state: ${state:-?})"
}
submit() { $CTL submit -o json --chdir /home/aryl --gpus-per-worker 1 --min-workers 1 "$@"; }

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

# ---- 6. a cluster across servers: the control host and a GPU server as two compose projects -----------
# docker-compose.yml's scheduler and router with deploy/compose.control.yml on one network, and
# deploy/compose.agent.yml (host networking, as on a GPU server) in another project, joined only through
# the scheduler's published port at this host's address, as two machines would be. The GPU server gets its
# certificate, token and agent.env from one command on the control host (certs add --bundle).
say "tearing down the one-host stack: the two-host layout next"
dc down -v --remove-orphans -t 60 >/dev/null 2>&1 || true
HOST_IP=$(hostname -I | tr ' ' '\n' | grep -E '^[0-9]+(\.[0-9]+){3}$' | grep -v '^127\.' | head -1)
[ -n "$HOST_IP" ] || fail "no IPv4 address of this host (hostname -I) to publish the scheduler on"
CONTROL=${PROJECT}-control GPU_HOST=${PROJECT}-gpu
CONTROL_RENDERED=$STATE/control.yml GPU_RENDERED=$STATE/gpu.yml
ARYL_SCHEDULER_NAME=$HOST_IP ARYL_PUBLISH_ADDRESS=$HOST_IP "${COMPOSE[@]}" -p "$CONTROL" -f docker-compose.yml \
    -f deploy/compose.control.yml -f deploy/compose.offline.yml config >"$STATE/control-merged.yml"
without_gpus "$STATE/control-merged.yml" "$CONTROL_RENDERED"
STACKS+=("$CONTROL $CONTROL_RENDERED")
dcc() { "${COMPOSE[@]}" -p "$CONTROL" -f "$CONTROL_RENDERED" "$@"; }
say "control host: docker-compose up scheduler router (scheduler published on $HOST_IP:50051)"
dcc up -d --no-build scheduler router >"$STATE/up-control.log" 2>&1 || { cat "$STATE/up-control.log"; fail "control up"; }
DC=dcc wait_healthy postgres scheduler router

say "control host: arylctl certs add --agent gpu-remote-1 --bundle - (one command)"
dcc run --rm -T pki arylctl certs add /var/lib/aryl/pki --agent gpu-remote-1 --bundle - \
    --scheduler-address "$HOST_IP:50051" >"$STATE/gpu-remote-1.tgz" 2>"$STATE/bundle.log" \
    || { cat "$STATE/bundle.log"; fail "issuing the GPU server's bundle"; }
mkdir "$STATE/gpu-host"
tar -xzf "$STATE/gpu-remote-1.tgz" -C "$STATE/gpu-host" || fail "the bundle is not a tar.gz: $(head -c 300 "$STATE/gpu-remote-1.tgz")"
[ "$(stat -c %u "$STATE/gpu-host/pki/agent.key")" = 10001 ] || fail "the bundle's key is not the image user's"
say "GPU server: the bundle unpacked ($(tr '\n' ' ' <"$STATE/gpu-host/agent.env"))"

ARYL_AGENT_PKI=$STATE/gpu-host/pki ARYL_ADVERTISE_ADDRESS=$HOST_IP "${COMPOSE[@]}" -p "$GPU_HOST" \
    --env-file "$STATE/gpu-host/agent.env" -f deploy/compose.agent.yml config >"$STATE/gpu-merged.yml"
without_gpus "$STATE/gpu-merged.yml" "$GPU_RENDERED" 2
STACKS+=("$GPU_HOST $GPU_RENDERED")
dcg() { "${COMPOSE[@]}" -p "$GPU_HOST" -f "$GPU_RENDERED" "$@"; }
say "GPU server: docker-compose -f deploy/compose.agent.yml up (host network, 2 fake GPUs)"
dcg up -d --no-build >"$STATE/up-gpu.log" 2>&1 || { cat "$STATE/up-gpu.log"; fail "GPU server up"; }
DC=dcg wait_healthy agent

docker cp "$(DC=dcc container scheduler)":$PKI "$STATE/control-pki" >/dev/null || fail "copying the control host's pki"
HOST_PKI=$STATE/control-pki CTL_SERVER=$HOST_IP:50051 CTL=host_ctl
remote_registered() { host_ctl servers | grep -q gpu-remote-1; }
wait_for 90 "gpu-remote-1 registered with the control host's scheduler" remote_registered
say "gpu-remote-1 registered through $HOST_IP:50051 (TLS: the scheduler's certificate names $HOST_IP)"
job=$(submit --name remote -- python examples/train.py --total-steps 6 --step-time 0.5 --checkpoint-every 2 \
    | field job_id)
wait_state "$job" COMPLETED 120
host_ctl logs "$job" | grep -q "done: step 6" || { host_ctl logs "$job" || true; fail "job $job's log (read by the scheduler from $HOST_IP:50052)"; }
dcg exec -T agent test -d "/var/lib/aryl/agent/logs/$job" || fail "job $job did not run on gpu-remote-1"
say "job $job ran on the remote agent and COMPLETED; its log came back through the scheduler"
