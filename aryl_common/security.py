"""Who a caller is, and the TLS every Aryl channel uses (docs/security.md).

Identities are bearer tokens listed in one token file the scheduler reads (``ROLE NAME sha256:HEX`` a
line; only hashes, so the file is no credential itself). Every channel is TLS with a client
certificate (mutual TLS); an agent's or router's certificate names its server id or router id, which
the scheduler checks against what it asks for. ``arylctl certs init DIR`` makes a development CA and
all of it (``aryl_common.devca``).

Clients (``arylctl``, the agent, the router, benchmarks) describe what they present with
``ClientSecurity``; ``insecure`` (plaintext, no identity) only when asked for explicitly.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc
from pydantic import Field

from aryl_common.config import ConfigSection
from aryl_common.entry import BadInput

# Whether TLS and tokens are on unless switched off (the scheduler's security.insecure, the daemons'
# agent.insecure / router.insecure, ARYL_INSECURE for clients).
SECURE_BY_DEFAULT: Final = True
ROLES: Final = ("user", "admin", "agent", "router")
AUTH_METADATA_KEY: Final = "authorization"
BEARER: Final = "Bearer "
# The name in the scheduler's certificate: the log reader presents it to agents, which accept no other.
SCHEDULER_CERT_NAME: Final = "aryl-scheduler"

# The client side's environment (arylctl, benchmarks; the daemons take the same from their config).
ENV_INSECURE: Final = "ARYL_INSECURE"
ENV_TLS_CA: Final = "ARYL_TLS_CA"
ENV_TLS_CERT: Final = "ARYL_TLS_CERT"
ENV_TLS_KEY: Final = "ARYL_TLS_KEY"
ENV_TOKEN: Final = "ARYL_TOKEN"
ENV_TOKEN_FILE: Final = "ARYL_TOKEN_FILE"


class SecurityError(BadInput):
    """A token file, certificate or key that cannot be used (exit 2: the fix is the file or setting)."""


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: its role (one of ``ROLES``) and name (user name, server id, router id)."""

    role: str
    name: str

    def __str__(self) -> str:
        return f"{self.role}:{self.name}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_tokens(path: str | Path) -> dict[str, Principal]:
    """The token file's principals by token hash. Lines: ``ROLE NAME sha256:HEX`` (or ``ROLE NAME TOKEN``,
    hashed here); ``#`` starts a comment. SecurityError naming the line for anything else."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SecurityError(f"cannot read the token file {path}: {exc.strerror or exc}") from exc
    tokens: dict[str, Principal] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3 or parts[0] not in ROLES:
            raise SecurityError(f"{path}:{number}: expected 'ROLE NAME sha256:HEX' with ROLE one of {', '.join(ROLES)}")
        role, name, secret = parts
        digest = secret[len("sha256:"):] if secret.startswith("sha256:") else hash_token(secret)
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise SecurityError(f"{path}:{number}: sha256: must be followed by 64 lower-case hex digits")
        if digest in tokens:
            raise SecurityError(f"{path}:{number}: the same token is listed twice")
        tokens[digest] = Principal(role, name)
    return tokens


class TokenFile:
    """The token file as the scheduler uses it: read at start (a bad file stops the start), then read
    again when it changes (its size, modification time or inode; looked at no more than once per
    ``check_s`` seconds), so that adding or revoking a token needs no restart. A changed file that
    does not parse is not taken: the tokens read last stay in force and ``current`` reports the
    problem once per change (``on_error``), so a typo never locks everyone out."""

    def __init__(self, path: str | Path, *, check_s: float = 1.0,
                 on_error: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.check_s = check_s
        self._on_error = on_error
        self._clock = clock
        self._lock = threading.Lock()
        self._seen = self._signature()
        self._tokens = load_tokens(self.path)
        self._checked_at = clock()

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def current(self) -> Mapping[str, Principal]:
        """The tokens in force now (the file read again first if it changed since it was last read)."""
        now = self._clock()
        with self._lock:
            if now - self._checked_at < self.check_s:
                return self._tokens
            self._checked_at = now
            signature = self._signature()
            if signature == self._seen:
                return self._tokens
            self._seen = signature
            try:
                self._tokens = load_tokens(self.path)
            except SecurityError as exc:
                if self._on_error is not None:
                    self._on_error(f"{exc}; the tokens read before stay in force")
            return self._tokens


def lookup_token(tokens: Mapping[str, Principal], token: str) -> Principal | None:
    """The principal of ``token``, or None: one lookup of its SHA-256 among the token file's keys
    (``load_tokens``). Timing can tell a caller at most where the digest of its guess falls in the table,
    which says nothing of any token: matching a digest needs a preimage of SHA-256. (Until 2026-12-02 every
    call compared the digest with every entry, in time linear in the tokens: with a token per agent, 8% of
    the scheduler's interpreter at 1,000 agents; ``benchmarks/bench_auth.py``, ``token_lookup``.)"""
    return tokens.get(hash_token(token))


def read_secret_file(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SecurityError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


def write_private(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` readable by its owner only (0600), also when it existed."""
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "wb") as out:
        out.write(raw)
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)


def default_token_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``arylctl login`` keeps the user's token: ``$XDG_CONFIG_HOME/aryl/token`` (~/.config)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "aryl" / "token"


@dataclass(frozen=True)
class ClientSecurity:
    """What a client presents: TLS (CA to trust, its certificate and key) and a bearer token; or nothing
    at all with ``insecure`` (a scheduler started with ``security.insecure``)."""

    insecure: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    token: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSecurity:
        """``ARYL_INSECURE``, ``ARYL_TLS_CA``/``_CERT``/``_KEY``, ``ARYL_TOKEN`` (else the file of
        ``ARYL_TOKEN_FILE``, else ``arylctl login``'s)."""
        env = os.environ if environ is None else environ
        flag = env.get(ENV_INSECURE, "").lower()
        insecure = flag in ("1", "true", "yes") if flag else not SECURE_BY_DEFAULT
        token = env.get(ENV_TOKEN, "")
        if not token:
            token = token_from_file(env.get(ENV_TOKEN_FILE, "") or default_token_file(env), required=False)
        return cls(insecure=insecure, ca_file=env.get(ENV_TLS_CA, ""), cert_file=env.get(ENV_TLS_CERT, ""),
                   key_file=env.get(ENV_TLS_KEY, ""), token=token)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """TLS with the client certificate, and the token on every call (when there is one)."""
        ca = read_secret_file(self.ca_file, "the CA certificate (ARYL_TLS_CA)") if self.ca_file else None
        cert = read_secret_file(self.cert_file, "the client certificate") if self.cert_file else None
        key = read_secret_file(self.key_file, "the client key") if self.key_file else None
        if (cert is None) != (key is None):
            raise SecurityError("a client certificate needs its key and a key its certificate "
                                "(ARYL_TLS_CERT, ARYL_TLS_KEY)")
        tls = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        if not self.token:
            return tls
        return grpc.composite_channel_credentials(tls, grpc.access_token_call_credentials(self.token))


def token_from_file(path: str | Path, *, required: bool = True) -> str:
    """The token in ``path`` (its first line); "" when it does not exist and not ``required``."""
    try:
        return Path(path).read_text().strip().splitlines()[0].strip()
    except FileNotFoundError:
        if required:
            raise SecurityError(f"token file {path} not found") from None
        return ""
    except IndexError:
        raise SecurityError(f"token file {path} is empty") from None
    except OSError as exc:
        raise SecurityError(f"cannot read the token file {path}: {exc.strerror or exc}") from exc


def secure_channel(address: str, security: ClientSecurity, options: list[tuple[str, int | str]]) -> grpc.Channel:
    if security.insecure:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, security.channel_credentials(), options=options)


def secure_aio_channel(address: str, security: ClientSecurity,
                       options: list[tuple[str, int | str]]) -> grpc.aio.Channel:
    if security.insecure:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, security.channel_credentials(), options=options)


def server_credentials(cert_file: str, key_file: str, client_ca_file: str) -> grpc.ServerCredentials:
    """TLS that requires a client certificate signed by ``client_ca_file`` (mutual TLS)."""
    cert = read_secret_file(cert_file, "the server certificate")
    key = read_secret_file(key_file, "the server key")
    ca = read_secret_file(client_ca_file, "the client CA certificate")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def peer_names(auth_context: Mapping[str, Iterable[bytes]]) -> frozenset[str]:
    """The names in the peer's verified client certificate: its common name and DNS/IP SANs."""
    names: set[str] = set()
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        names.update(value.decode(errors="replace") for value in auth_context.get(key, ()))
    return frozenset(names)


class ClientSecurityFields(ConfigSection):
    """A daemon's settings for its channel to the scheduler (``agent.*``, ``router.*``): mutual TLS and a
    bearer token, or, with ``insecure``, neither (a scheduler run with ``security.insecure``)."""

    insecure: bool = Field(
        not SECURE_BY_DEFAULT,
        description="plaintext and no token to the scheduler (only a scheduler run with security.insecure accepts "
        "it); otherwise TLS with tls_cert and the token in token_file",
    )
    tls_ca: str = Field("", description="PEM CA that signed the scheduler's certificate (ca.crt)")
    tls_cert: str = Field("", description="PEM client certificate naming this daemon's id (agent-<ID>.crt)")
    tls_key: str = Field("", description="its PEM private key")
    token_file: str = Field("", description="file holding this daemon's bearer token (token-<ID>)")

    def client_security(self) -> ClientSecurity:
        """SecurityError naming the setting when a file is missing or unreadable."""
        if self.insecure:
            return ClientSecurity(insecure=True)
        missing = [name for name in ("tls_ca", "tls_cert", "tls_key", "token_file") if not getattr(self, name)]
        if missing:
            raise SecurityError(f"{', '.join(missing)} must be set for TLS to the scheduler (arylctl certs init DIR; "
                                "docs/security.md), or set insecure = true for a scheduler run without TLS")
        return ClientSecurity(ca_file=self.tls_ca, cert_file=self.tls_cert, key_file=self.tls_key,
                              token=token_from_file(self.token_file))
