"""Secrets a job references by name, resolved by the agent when a worker starts (docs/security.md).

A job's environment may hold, instead of a secret itself, a reference: the whole value
``aryl-secret:NAME`` (e.g. ``HF_TOKEN=aryl-secret:hf-team``). The scheduler stores and shows only the
reference; the agent replaces it with the value of NAME from its secrets file (``agent.secrets_file``)
in the worker's environment, and nowhere else. The file is the agent's own (mode 0600, not readable by
workers): one ``NAME=VALUE`` a line, ``#`` starting a comment line, names of letters, digits, ``.``,
``_`` and ``-``. It is read at each worker start, so a rotated secret is used by the next start.

A reference to a secret the file does not hold, or any reference with no secrets file configured,
refuses the worker (``identity.Refused``: the job fails, naming the variable and the secret, never a
value).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from node_agent.identity import Refused

PREFIX = "aryl-secret:"
NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class SecretsFileError(Exception):
    """The secrets file cannot be read or has a malformed line (the message names the line, not a value)."""


def load(path: str | Path) -> dict[str, str]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SecretsFileError(f"cannot read the secrets file {path}: {exc.strerror or exc}") from exc
    secrets: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not NAME.match(name):
            raise SecretsFileError(f"{path}:{number}: expected NAME=VALUE with NAME of letters, digits, '.', '_', '-'")
        secrets[name] = value
    return secrets


def references(env: Mapping[str, str]) -> dict[str, str]:
    """The job env's secret references: variable -> secret name."""
    return {key: value[len(PREFIX):] for key, value in env.items() if value.startswith(PREFIX)}


def resolve(env: Mapping[str, str], secrets_file: str) -> dict[str, str]:
    """``env`` with every ``aryl-secret:NAME`` value replaced by the secret; ``Refused`` naming what is
    missing. Without references the file is not read (a server without secrets needs none)."""
    wanted = references(env)
    if not wanted:
        return dict(env)
    if not secrets_file:
        raise Refused(f"the job's env references secrets ({', '.join(sorted(set(wanted.values())))}) and this "
                      "server has no secrets file (agent.secrets_file)")
    try:
        secrets = load(secrets_file)
    except SecretsFileError as exc:
        raise Refused(str(exc)) from None
    missing = sorted({name for name in wanted.values() if name not in secrets})
    if missing:
        variables = ", ".join(sorted(key for key, name in wanted.items() if name in missing))
        raise Refused(f"secret(s) {', '.join(missing)} not found in this server's secrets file "
                      f"(agent.secrets_file); referenced by {variables}")
    return {key: secrets[wanted[key]] if key in wanted else value for key, value in env.items()}
