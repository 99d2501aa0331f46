# One image for every Aryl daemon: aryl-scheduler, aryl-agent, aryl-router (and arylctl).
# No ENTRYPOINT: docker-compose.yml (or `docker run aryl <command>`) names the program to run.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Install the project (a regular, non-editable install) and drop the sources afterwards.
COPY . /src
RUN pip install /src && rm -rf /src

# Run as an unprivileged user. Its home is the working directory, so the embedded SQLite default
# (./.aryl/aryl.db) is writable when no database URL is configured.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin aryl \
    && mkdir -p /var/lib/aryl/agent /var/lib/aryl/checkpoints && chown -R aryl /var/lib/aryl
# Agents' work (worker logs, state) and shared checkpoints; named volumes inherit this ownership.
USER aryl
WORKDIR /home/aryl

EXPOSE 50051 50052 8080
CMD ["aryl-scheduler", "--help"]
