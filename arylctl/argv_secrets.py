"""What in a job's command line looks like a secret, so that ``arylctl submit`` can warn before sending it.

A job's command is shown to every user (``arylctl jobs``, ``ListJobs``; docs/security.md), unlike its
environment, and an environment value may name a secret the agent fills in (``aryl-secret:NAME``).
This module only *looks*: it names the arguments (by position and flag or variable name) and never
returns, prints or stores a value. It must never refuse anything: a false alarm costs a line on
stderr, a missed one no more than today.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Final

__all__ = ["SECRET_REFERENCE_PREFIX", "secret_looking_arguments"]

SECRET_REFERENCE_PREFIX: Final = "aryl-secret:"
# The words of a flag or variable name (split at - _ . and camelCase) that name a credential:
# --hf-token, --db_password, AWS_SECRET_ACCESS_KEY, --apiKey; but not --max-tokens or --tokenizer.
_SECRET_WORDS: Final = frozenset({"password", "passwd", "passphrase", "pass", "pwd", "token", "secret", "secrets",
                                  "apikey", "credential", "credentials"})
_SECRET_ENDINGS: Final = ("token", "password", "passwd", "secret", "apikey")
_SECRET_PAIRS: Final = frozenset({("api", "key"), ("access", "key"), ("private", "key")})
# A name ending in one of these names where the secret is kept, not the secret: --password-file PATH.
_PLACE_WORDS: Final = frozenset({"file", "path", "dir", "env", "var", "name", "id"})
_NOT_A_VALUE: Final = frozenset({"true", "false", "yes", "no", "none", "0", "1"})
_FLAG: Final = re.compile(r"--?([A-Za-z][A-Za-z0-9_.-]*)(?:=(.*))?", re.DOTALL)
_ASSIGNMENT: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
# Credentials recognisable by their form alone, wherever they appear in an argument.
_LITERALS: Final = (
    ("a URL with a password", re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("an API key (sk-...)", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
)


def _names_a_secret(name: str) -> bool:
    words = [w.lower() for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name)]
    if not words or words[-1] in _PLACE_WORDS:
        return False
    return (any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words)
            or any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words)))


def _harmless(value: str) -> bool:
    """A value that carries no secret itself: empty, a flag's yes/no, a secret reference, a variable to expand."""
    return not value or value.lower() in _NOT_A_VALUE or value.startswith((SECRET_REFERENCE_PREFIX, "$"))


def secret_looking_arguments(command: Sequence[str]) -> list[str]:
    """Each argument of ``command`` that looks like it carries a secret, described without its value:
    ``"argument 3 (--password)"``, ``"argument 1 (HF_TOKEN=...)"``, ``"argument 2 (a GitHub token)"``.
    The program itself (argument 0) is looked at too: ``env TOKEN=... prog`` puts it later anyway."""
    found: list[str] = []
    for i, arg in enumerate(command):
        flag = _FLAG.fullmatch(arg)
        assignment = _ASSIGNMENT.fullmatch(arg)
        if flag and _names_a_secret(flag.group(1)):
            value = flag.group(2) if flag.group(2) is not None else (command[i + 1] if i + 1 < len(command) else "")
            if not _harmless(value) and not value.startswith("-"):
                found.append(f"argument {i} ({arg.split('=', 1)[0]})")
                continue
        if assignment and _names_a_secret(assignment.group(1)) and not _harmless(assignment.group(2)):
            found.append(f"argument {i} ({assignment.group(1)}=...)")
            continue
        kind = next((name for name, pattern in _LITERALS if pattern.search(arg)), None)
        if kind is not None:
            found.append(f"argument {i} ({kind})")
    return found
