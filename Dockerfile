# Aryl's images, one target per role, each with only what its program needs:
#
#   docker build --target scheduler -t aryl-scheduler .   aryl-scheduler (+ numba for the solvers)
#   docker build --target agent     -t aryl-agent .       aryl-agent, arylctl, examples/; base of job images
#   docker build --target router    -t aryl-router .      aryl-router and HAProxy, its data plane
#
# Every target runs its program under tini (PID 1: forwards signals, reaps orphaned processes) and
# has a HEALTHCHECK (deploy/healthcheck.py). The base image is a build argument: the default is the
# official Python image pinned to a release; any Debian-like image with python3 (>= 3.11) and the
# venv module works (deploy/compose-test.sh builds one from Debian packages). No ENTRYPOINT besides
# tini: docker-compose.yml (or `docker run IMAGE <command>`) names the program.
#
# Index access: pip reads PIP_INDEX_URL / PIP_EXTRA_INDEX_URL build arguments, and a CA bundle given
# as the build secret `pip_cert` (`--secret id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt`).
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

# ---- the wheels: built from the sources in builder stages; no image holds the sources -------------
# `deps`: the project's metadata without its packages, an empty wheel that requires what aryl
# requires. Installing it first puts the dependencies in a layer that changes only with pyproject.toml.
FROM ${BASE_IMAGE} AS deps
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml ./
# Empty stand-ins for the files pyproject.toml names, so that this layer depends on it alone.
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    touch README.md LICENSE \
    && python3 -m venv /tmp/build && /tmp/build/bin/pip wheel --no-deps --wheel-dir /wheels /src

# `wheel`: the project itself.
FROM deps AS wheel
COPY README.md LICENSE ./
COPY protos protos
COPY aryl_common aryl_common
COPY scheduler_service scheduler_service
COPY node_agent node_agent
COPY inference_router inference_router
COPY migrations migrations
COPY arylctl arylctl
COPY simulator simulator
COPY aryl_demo aryl_demo
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    rm -rf /wheels && /tmp/build/bin/pip wheel --no-deps --wheel-dir /wheels /src

# ---- what every role's image has ------------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/aryl/bin:$PATH
# tini (Debian's package); the base image may already carry it.
RUN if ! command -v tini >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends tini && rm -rf /var/lib/apt/lists/*; \
    fi
# Run as an unprivileged user. Its home is the working directory, so the embedded SQLite default
# (./.aryl/aryl.db) is writable when no database URL is configured.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin aryl \
    && mkdir -p /var/lib/aryl/agent /var/lib/aryl/checkpoints /var/lib/aryl/pki && chown -R aryl /var/lib/aryl
COPY deploy/healthcheck.py /usr/local/bin/aryl-healthcheck
ENTRYPOINT ["tini", "--"]
WORKDIR /home/aryl
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/aryl

# The daemons without numba: the agent and the router (and arylctl). Dependencies, then the wheel.
FROM runtime AS core
RUN --mount=type=bind,from=deps,source=/wheels,target=/deps --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    pip install /deps/aryl-*.whl
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install --no-deps --force-reinstall /wheels/aryl-*.whl

# ---- the roles ------------------------------------------------------------------------------------
# The router programs HAProxy (Debian's package), its data plane, which it starts as its own child process.
FROM core AS router
RUN apt-get update && apt-get install -y --no-install-recommends haproxy && rm -rf /var/lib/apt/lists/*
USER aryl
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 CMD ["aryl-healthcheck", "router"]
CMD ["aryl-router", "--help"]

FROM runtime AS scheduler
RUN --mount=type=bind,from=deps,source=/wheels,target=/deps --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    pip install "$(ls /deps/aryl-*.whl)[scheduler]"
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install --no-deps --force-reinstall /wheels/aryl-*.whl
USER aryl
EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["aryl-healthcheck", "scheduler"]
CMD ["aryl-scheduler", "--help"]

# The agent's workers run in this image: the JOB_PACKAGES build argument adds the jobs' framework, or
# a job image is `FROM aryl-agent` plus it (docs/operations.md, "Job images"); examples/ lies in the working
# directory for `python3 examples/train.py`.
FROM core AS agent
# Python packages the jobs need (pip requirement specifiers, space-separated), e.g. "torch==2.5.1".
ARG JOB_PACKAGES=""
RUN --mount=type=secret,id=pip_cert \
    if [ -n "$JOB_PACKAGES" ]; then \
        if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
        pip install $JOB_PACKAGES; \
    fi
COPY --chown=aryl examples examples
# Workers get a clean environment (docs/security.md, "Jobs run as their user"): their PATH names the
# venv, so `python` is the one with JOB_PACKAGES.
ENV ARYL_USERS__PATH=/opt/aryl/bin:/usr/local/bin:/usr/bin:/bin
USER aryl
EXPOSE 50052
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 CMD ["aryl-healthcheck", "agent"]
CMD ["aryl-agent", "--help"]
