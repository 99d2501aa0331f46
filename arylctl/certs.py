"""``arylctl certs init DIR``, ``arylctl certs add DIR`` and ``arylctl certs renew DIR``: a development
CA and everything a cluster needs to run with mutual TLS and tokens (docs/security.md). For development
and compose; production brings its own PKI.

DIR receives (keys and tokens 0600):

- ``ca.crt``/``ca.key``: the CA every component trusts (the key signs nothing else: keep it off the servers);
- ``scheduler.crt``/``.key``: CN ``aryl-scheduler``, names ``localhost``, ``scheduler``, ``127.0.0.1``
  (it also presents it as a client, to read agents' worker logs);
- ``client.crt``/``.key``: CN ``aryl-client``, for ``arylctl`` and programs (whose identity is their token);
- ``agent-<ID>.crt``/``.key`` per ``--agent ID``: CN and DNS name the server id (also ``localhost`` and
  ``127.0.0.1``, so a one-machine demo's log service can be reached);
- ``router-<ID>.crt``/``.key`` per ``--router ID``;
- ``tokens``: the scheduler's token file (hashes only); ``token-<NAME>``: each principal's token;
- ``users``: the agents' user map (``[users] map_file``, ``name:uid:gid`` a line) for every user and
  admin: a root agent runs each job as its owner's uid and refuses owners it cannot map, so the
  names that get a token here also get a uid. A name that is an account of this machine (uid >= 1000)
  keeps that account's uid and gid; any other gets the next free uid from ``DEV_UID_FIRST`` (20001),
  an unprivileged uid with no account, the gid equal to it. Edit the file to choose others; entries
  already in it are kept.

``add`` issues more principals from the CA already in DIR (an agent, a router, a user or an admin
added later): one certificate and token each, a line appended to ``tokens`` (the scheduler reads the
file again within a second, without a restart) and, for users and admins, to ``users``. ``init`` on a
DIR that holds a CA does the same for the principals it names that are not issued yet, so re-running
it with one more ``--agent`` is enough; ``--force`` makes a new CA instead.

``add --agent ID --bundle FILE --scheduler-address HOST:PORT`` also packs what that one GPU server needs
into a gzipped tar (``-``: standard output), to copy there and unpack into ``/etc/aryl``
(``deploy/compose.agent.yml``, docs/operations.md "A cluster across servers"): ``pki/ca.crt``,
``pki/agent.crt``, ``pki/agent.key``, ``pki/token``, ``pki/users`` and ``agent.env`` (the compose
file's variables: ``ARYL_SERVER_ID``, ``ARYL_SCHEDULER_ADDRESS``). Its files belong to uid/gid
``IMAGE_UID`` (the images' ``aryl`` user, which the agent's container runs as) when unpacked as root;
keys and the token are 0600.

``renew`` issues every certificate in DIR again from its CA, valid ``VALID_DAYS`` from now (never past
the CA's own expiry), with the same key, subject, names and usages: a certificate that expired (which
the scheduler refuses, and which ends the streams it opened) is replaced by copying the new ``.crt``
to its holder; keys and tokens stay as they are.

It must never overwrite an issued principal's key or token (``add`` skips them and says so, ``renew``
keeps them): its holder would be locked out.
"""

from __future__ import annotations

import argparse
import datetime
import io
import ipaddress
import pwd
import re
import secrets
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aryl_common.security import SCHEDULER_CERT_NAME, hash_token, write_private

CLIENT_CERT_NAME = "aryl-client"
VALID_DAYS = 365
LOCAL_NAMES = ("localhost", "127.0.0.1")
TOKENS_FILE = "tokens"
USER_MAP_FILE = "users"
DEV_UID_FIRST = 20001  # first uid given to a name with no account here (module doc)
ACCOUNT_MIN_UID = 1000  # a local account below it (daemon, bin...) never lends its uid to a token's name
ROLES = ("admin", "user", "agent", "router")
EXIT_OK, EXIT_USAGE = 0, 2
IMAGE_UID = 10001  # the images' unprivileged user (Dockerfile: useradd --uid 10001 aryl): owns a bundle's files
_HOST_PORT = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?:[0-9]{1,5}$")


@dataclass(frozen=True)
class DevCluster:
    """What ``init`` makes: names of agents, routers, users and admins."""

    agents: tuple[str, ...] = ()
    routers: tuple[str, ...] = ()
    users: tuple[str, ...] = ("alice",)
    admins: tuple[str, ...] = ("admin",)
    scheduler_names: tuple[str, ...] = ("localhost", "scheduler", "127.0.0.1")
    extra: dict[str, str] = field(default_factory=dict)

    def principals(self) -> list[tuple[str, str]]:
        """``(role, name)`` of everyone named, admins first (the order of the token file)."""
        return ([("admin", n) for n in self.admins] + [("user", n) for n in self.users]
                + [("agent", n) for n in self.agents] + [("router", n) for n in self.routers])


@dataclass(frozen=True)
class Added:
    """What ``add`` did: the tokens it issued (by ``role:name``), the principals it found already
    issued and left as they were, and the user map entries it wrote (name to uid, gid)."""

    tokens: dict[str, str]
    kept: tuple[str, ...]
    mapped: dict[str, tuple[int, int]]


class CertsError(ValueError):
    """DIR cannot take what was asked (no CA, a name issued under another role); the message says
    what to do."""


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(names: tuple[str, ...]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _issue(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, common_name: str,
           names: tuple[str, ...], *, server: bool, not_after: datetime.datetime | None = None) -> tuple[bytes, bytes]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    not_after = not_after or now + datetime.timedelta(days=VALID_DAYS)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(min(now, not_after) - datetime.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(_san((common_name, *names)), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def _write_pair(out: Path, stem: str, pair: tuple[bytes, bytes]) -> None:
    (out / f"{stem}.crt").write_bytes(pair[0])
    write_private(out / f"{stem}.key", pair[1])


def _issue_principals(out: Path, ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
                      principals: Iterable[tuple[str, str]]) -> tuple[dict[str, str], list[str]]:
    """Certificates (agents, routers) and tokens of ``principals``; returns the tokens by ``role:name``
    and the token file's lines for them."""
    tokens: dict[str, str] = {}
    lines: list[str] = []
    for role, name in principals:
        if role == "agent":
            _write_pair(out, f"agent-{name}", _issue(ca_cert, ca_key, name, LOCAL_NAMES, server=True))  # logs too
        elif role == "router":
            _write_pair(out, f"router-{name}", _issue(ca_cert, ca_key, name, (), server=False))
        token = f"aryl_{secrets.token_urlsafe(32)}"
        tokens[f"{role}:{name}"] = token
        lines.append(f"{role} {name} sha256:{hash_token(token)}")
        write_private(out / f"token-{name}", token + "\n")
    return tokens, lines


def init(directory: str | Path, cluster: DevCluster) -> dict[str, str]:
    """Write the CA, certificates, keys and tokens of ``cluster`` into ``directory`` (anything there is
    replaced, except the user map's entries, which are kept); returns each principal's token by
    ``role:name``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    now = datetime.datetime.now(datetime.UTC)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aryl development CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    (out / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    write_private(out / "ca.key", _pem_key(ca_key))
    _write_pair(out, "scheduler", _issue(ca_cert, ca_key, SCHEDULER_CERT_NAME, cluster.scheduler_names, server=True))
    _write_pair(out, "client", _issue(ca_cert, ca_key, CLIENT_CERT_NAME, (), server=False))
    tokens, lines = _issue_principals(out, ca_cert, ca_key, cluster.principals())
    header = "# ROLE NAME sha256:HEX -- made by arylctl certs init; tokens themselves are in token-<NAME>"
    write_private(out / TOKENS_FILE, "\n".join([header, *lines]) + "\n")
    map_users(out, (*cluster.admins, *cluster.users))
    return tokens


def _load_ca(out: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    if not (out / "ca.crt").is_file() or not (out / "ca.key").is_file():
        raise CertsError(f"{out} holds no CA (ca.crt and ca.key): make one with arylctl certs init {out}")
    ca_cert = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertsError(f"{out / 'ca.key'} is not the EC key arylctl certs init writes")
    return ca_cert, ca_key


def issued(directory: str | Path) -> dict[str, str]:
    """The principals DIR's token file names: name to role."""
    path = Path(directory) / TOKENS_FILE
    found: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split("#", 1)[0].split()
            if len(parts) >= 2 and parts[0] in ROLES:
                found[parts[1]] = parts[0]
    return found


def add(directory: str | Path, cluster: DevCluster) -> Added:
    """Issue ``cluster``'s principals that DIR's CA has not issued yet (module doc); those already
    issued keep their keys and tokens. ``CertsError`` when DIR holds no CA or a name is issued under
    another role (its token file ``token-NAME`` would be shared)."""
    out = Path(directory)
    ca_cert, ca_key = _load_ca(out)
    already = issued(out)
    wanted = list(dict.fromkeys(cluster.principals()))
    for role, name in wanted:
        if name in already and already[name] != role:
            raise CertsError(f"{name!r} is already issued as {already[name]} in {out / TOKENS_FILE}: "
                             f"choose another name for the {role}")
    names = [name for _, name in wanted]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise CertsError(f"{', '.join(twice)}: one name, one role (each gets its own token-NAME file)")
    new = [(role, name) for role, name in wanted if name not in already]
    tokens, lines = _issue_principals(out, ca_cert, ca_key, new)
    if lines:
        path = out / TOKENS_FILE
        before = path.read_text(encoding="utf-8") if path.is_file() else ""
        if before and not before.endswith("\n"):
            before += "\n"
        write_private(path, before + "\n".join(lines) + "\n")  # the scheduler re-reads it (no restart)
    people = [name for role, name in wanted if role in ("admin", "user")]
    mapped = map_users(out, people) if people else {}
    kept = tuple(f"{role}:{name}" for role, name in wanted if name in already)
    return Added(tokens, kept, mapped)


def agent_bundle(directory: str | Path, agent: str, scheduler_address: str) -> bytes:
    """The gzipped tar of what GPU server ``agent`` needs (module doc), from DIR where ``agent`` is issued;
    ``CertsError`` when it is not, or when ``scheduler_address`` is not HOST:PORT."""
    out = Path(directory)
    if issued(out).get(agent) != "agent":
        raise CertsError(f"{agent!r} is not an agent issued in {out / TOKENS_FILE}: "
                         f"arylctl certs add {out} --agent {agent}")
    _check_scheduler_address(scheduler_address)
    files = [
        ("pki/ca.crt", (out / "ca.crt").read_bytes(), 0o644),
        ("pki/agent.crt", (out / f"agent-{agent}.crt").read_bytes(), 0o644),
        ("pki/agent.key", (out / f"agent-{agent}.key").read_bytes(), 0o600),
        ("pki/token", (out / f"token-{agent}").read_bytes(), 0o600),
        ("pki/users", (out / USER_MAP_FILE).read_bytes() if (out / USER_MAP_FILE).is_file() else b"", 0o644),
        ("agent.env", f"ARYL_SERVER_ID={agent}\nARYL_SCHEDULER_ADDRESS={scheduler_address}\n".encode(), 0o644),
    ]
    buffer = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        def entry(name: str, mode: int, kind: bytes = tarfile.REGTYPE, size: int = 0) -> tarfile.TarInfo:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.size, info.mtime = kind, mode, size, now
            info.uid = info.gid = IMAGE_UID  # numeric owner: no name to look up on the GPU server
            return info
        tar.addfile(entry("pki", 0o700, tarfile.DIRTYPE))
        for name, data, mode in files:
            tar.addfile(entry(name, mode, size=len(data)), io.BytesIO(data))
    return buffer.getvalue()


def _check_scheduler_address(address: str) -> None:
    if not _HOST_PORT.match(address):
        raise CertsError(f"--scheduler-address {address!r}: give HOST:PORT, the address the GPU server reaches the "
                         "scheduler at (a name or IP the scheduler's certificate holds: certs init --scheduler-name)")


def read_user_map(path: Path) -> dict[str, tuple[int, int]]:
    """``name:uid:gid`` lines (``#`` comments) of the user map; missing file: empty."""
    mapping: dict[str, tuple[int, int]] = {}
    if not path.is_file():
        return mapping
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for entry in line.split("#", 1)[0].replace(",", " ").split():
            name, _, ids = entry.partition(":")
            uid, _, gid = ids.partition(":")
            if not name or not uid.isdigit() or not gid.isdigit():
                raise CertsError(f"{path}:{number}: {entry!r} is not name:uid:gid (e.g. alice:20001:20001)")
            mapping[name] = (int(uid), int(gid))
    return mapping


def map_users(directory: str | Path, names: Iterable[str]) -> dict[str, tuple[int, int]]:
    """Give each of ``names`` missing from DIR's user map a uid and gid (module doc) and write the
    map; returns the entries it added."""
    path = Path(directory) / USER_MAP_FILE
    mapping = read_user_map(path)
    added: dict[str, tuple[int, int]] = {}
    taken = {uid for uid, _ in mapping.values()}
    for name in dict.fromkeys(names):
        if name in mapping:
            continue
        ids = _account_ids(name)
        if ids is None:
            uid = DEV_UID_FIRST
            while uid in taken or _uid_has_account(uid):
                uid += 1
            ids = (uid, uid)
        mapping[name] = added[name] = ids
        taken.add(ids[0])
    if added or not path.exists():
        header = ("# The agents' user map ([users] map_file, docs/security.md): a root agent runs each job as its "
                  "owner's uid:gid here.\n# Written by arylctl certs for the users and admins it issued; edit "
                  "it to choose other ids.\n")
        path.write_text(header + "".join(f"{n}:{u}:{g}\n" for n, (u, g) in mapping.items()), encoding="utf-8")
        path.chmod(0o644)
    return added


def _account_ids(name: str) -> tuple[int, int] | None:
    """The uid and gid of ``name``'s account on this machine, when it is one of a person (uid >= 1000)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    if entry.pw_uid < ACCOUNT_MIN_UID or entry.pw_uid == 65534:  # system accounts, nobody
        return None
    return entry.pw_uid, entry.pw_gid


def _uid_has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def issue_from(directory: str | Path, stem: str, common_name: str, names: tuple[str, ...] = LOCAL_NAMES, *,
               server: bool = True, not_after: datetime.datetime | None = None) -> tuple[Path, Path]:
    """Issue one more certificate (``stem``.crt/.key) from the CA that ``init`` wrote into ``directory``
    (e.g. for an agent added later), valid ``VALID_DAYS`` or until ``not_after``; returns the
    certificate's and the key's paths."""
    out = Path(directory)
    ca_cert, ca_key = _load_ca(out)
    _write_pair(out, stem, _issue(ca_cert, ca_key, common_name, names, server=server, not_after=not_after))
    return out / f"{stem}.crt", out / f"{stem}.key"


@dataclass(frozen=True)
class Renewed:
    """A certificate ``renew`` issued again: its file and its new notAfter."""

    file: str
    not_after: datetime.datetime


def renew(directory: str | Path) -> list[Renewed]:
    """Issue every certificate in DIR that its CA issued (``ca.crt`` aside) again, valid ``VALID_DAYS``
    from now but not past the CA's own notAfter, keeping its key, subject, names and usages (module
    doc). ``CertsError`` when DIR holds no CA or the CA itself has expired (renewing under it would
    not help)."""
    out = Path(directory)
    ca_cert, ca_key = _load_ca(out)
    now = datetime.datetime.now(datetime.UTC)
    ca_until = ca_cert.not_valid_after_utc
    if ca_until <= now:
        raise CertsError(f"the CA in {out} expired at {ca_until:%Y-%m-%d %H:%M:%S} UTC: certificates issued under "
                         f"it are refused whatever their own dates; arylctl certs init {out} --force makes a new CA "
                         "(and everything issued from the old one must be replaced)")
    not_after = min(now + datetime.timedelta(days=VALID_DAYS), ca_until)
    renewed: list[Renewed] = []
    for path in sorted(out.glob("*.crt")):
        if path.name == "ca.crt":
            continue
        try:
            old = x509.load_pem_x509_certificate(path.read_bytes())
            old.verify_directly_issued_by(ca_cert)
        except (ValueError, TypeError, InvalidSignature):
            continue  # not a certificate, or not this CA's: not ours to re-issue
        builder = (
            x509.CertificateBuilder().subject_name(old.subject).issuer_name(ca_cert.subject)
            .public_key(old.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(not_after)
        )
        for extension in old.extensions:
            builder = builder.add_extension(extension.value, extension.critical)
        path.write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
        renewed.append(Renewed(path.name, not_after))
    return renewed


# ---------------------------------------------------------------------------------------------------
# the command line: `arylctl certs init|add|renew`


def add_certs_commands(add_command: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Register ``certs init``, ``certs add`` and ``certs renew`` with the CLI's ``add`` (``run_command``
    runs them)."""
    certs = add_command("certs", None, "development certificates and tokens")
    commands = certs.add_subparsers(dest="certs_command", metavar="init|add|renew", required=True)
    init_parser = commands.add_parser(
        "init", parents=[common], allow_abbrev=False,
        help="make a development CA, scheduler/agent/router certificates, tokens and a user map in DIR",
        description="Writes ca.crt/.key, scheduler.crt/.key, client.crt/.key, agent-ID.crt/.key, "
                    "router-ID.crt/.key, tokens (the scheduler's token file), token-NAME (each principal's "
                    "token) and users (the agents' [users] map_file) into DIR. On a DIR that already holds a CA "
                    "it keeps the CA and issues only the names not issued yet (as certs add). For development "
                    "and compose only (docs/security.md).")
    init_parser.add_argument("--force", action="store_true",
                             help="replace a CA already in DIR (everything issued from it stops working)")
    add_parser = commands.add_parser(
        "add", parents=[common], allow_abbrev=False,
        help="issue more agents, routers, users or admins from the CA in DIR",
        description="Issues each named principal that DIR's CA has not issued yet: certificate and key (agents, "
                    "routers), token-NAME, a line in tokens (the scheduler reads it again within a second) and, "
                    "for users and admins, a line in users. Those already issued are kept as they are.")
    for sub, default_people in ((init_parser, "default alice"), (add_parser, "none by default")):
        sub.add_argument("dir", metavar="DIR")
        sub.add_argument("--agent", action="append", default=[], metavar="ID", help="an agent's server id (repeat)")
        sub.add_argument("--router", action="append", default=[], metavar="ID", help="a router's id (repeat)")
        sub.add_argument("--user", action="append", default=[], metavar="NAME",
                         help=f"a user (repeat; {default_people})")
        sub.add_argument("--admin", action="append", default=[], metavar="NAME",
                         help=f"an admin (repeat; {default_people.replace('alice', 'admin')})")
    add_parser.add_argument("--bundle", metavar="FILE",
                            help="with one --agent: also write that GPU server's certificate, key, token, CA and "
                                 "agent.env as a .tar.gz to FILE (- for standard output), to unpack into /etc/aryl "
                                 "there (deploy/compose.agent.yml)")
    add_parser.add_argument("--scheduler-address", metavar="HOST:PORT",
                            help="with --bundle: where that server reaches the scheduler (written to agent.env)")
    renew_parser = commands.add_parser(
        "renew", parents=[common], allow_abbrev=False,
        help="issue every certificate in DIR again from its CA (an expired one included), keys and tokens kept",
        description="Issues each certificate in DIR that its CA issued (scheduler, client, agents, routers) again, "
                    f"valid {VALID_DAYS} days from now but not past the CA's own expiry, with the same key, names "
                    "and usages. Copy the new .crt files to their holders and restart them; keys and tokens do not "
                    "change. An expired certificate is refused by the scheduler and ends the streams it opened.")
    renew_parser.add_argument("dir", metavar="DIR")
    init_parser.add_argument("--scheduler-name", action="append", default=[], metavar="NAME",
                             help="a name or IP the scheduler is reached by (repeat; default localhost, scheduler, "
                                  "127.0.0.1)")


def run_command(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """``certs init``, ``certs add`` or ``certs renew`` as parsed by ``add_certs_commands``; returns the
    exit status."""
    directory = Path(args.dir).resolve()
    if args.certs_command == "renew":
        try:
            renewed = renew(directory)
        except CertsError as exc:
            print(f"error: {exc}", file=stderr)
            return EXIT_USAGE
        for cert in renewed:
            print(f"renewed {cert.file}: valid until {cert.not_after:%Y-%m-%d %H:%M:%S} UTC (same key)", file=stdout)
        if not renewed:
            print(f"{directory} holds no certificate issued by its CA to renew", file=stdout)
        return EXIT_OK
    named = DevCluster(agents=tuple(args.agent), routers=tuple(args.router), users=tuple(args.user),
                       admins=tuple(args.admin))
    try:
        if args.certs_command == "add":
            if not named.principals():
                print("error: name someone to add: --agent ID, --router ID, --user NAME or --admin NAME",
                      file=stderr)
                return EXIT_USAGE
            if args.bundle is None:
                return _report_added(directory, add(directory, named), stdout)
            return _add_with_bundle(directory, named, args, stdout, stderr)
        if (directory / "ca.crt").exists() and not args.force:
            print(f"{directory} already holds a CA: kept (--force makes a new one, and every certificate and token "
                  "issued from the old one stops working)", file=stdout)
            if args.scheduler_name:
                print("--scheduler-name is not applied: the scheduler's certificate issued with the CA is kept "
                      "(--force remakes everything)", file=stderr)
            return _report_added(directory, add(directory, named), stdout) if named.principals() else EXIT_OK
        cluster = DevCluster(
            agents=named.agents, routers=named.routers, users=named.users or ("alice",),
            admins=named.admins or ("admin",),
            scheduler_names=tuple(args.scheduler_name) or ("localhost", "scheduler", "127.0.0.1"),
        )
        tokens = init(directory, cluster)
    except CertsError as exc:
        print(f"error: {exc}", file=stderr)
        return EXIT_USAGE
    print(f"wrote a development CA, certificates, {len(tokens)} tokens and a user map to {directory}", file=stdout)
    print(f"scheduler: ARYL_SECURITY__INSECURE=false ARYL_SECURITY__TLS_CERT={directory}/scheduler.crt "
          f"ARYL_SECURITY__TLS_KEY={directory}/scheduler.key ARYL_SECURITY__TLS_CLIENT_CA={directory}/ca.crt "
          f"ARYL_SECURITY__TOKENS_FILE={directory}/tokens", file=stdout)
    print(f"agents:    ARYL_USERS__MAP_FILE={directory}/users (a root agent runs each job as its owner's uid there)",
          file=stdout)
    print(f"arylctl:   export ARYL_TLS_CA={directory}/ca.crt ARYL_TLS_CERT={directory}/client.crt "
          f"ARYL_TLS_KEY={directory}/client.key; arylctl login < {directory}/token-NAME", file=stdout)
    return EXIT_OK


def _add_with_bundle(directory: Path, named: DevCluster, args: argparse.Namespace, stdout: TextIO,
                     stderr: TextIO) -> int:
    """``certs add --agent ID --bundle FILE``: the agent issued (or kept), then its bundle written; the report
    goes to standard error when the bundle goes to standard output."""
    if len(named.agents) != 1 or len(named.principals()) != 1:
        print("error: --bundle packs one GPU server's files: name exactly one --agent and no one else", file=stderr)
        return EXIT_USAGE
    if not args.scheduler_address:
        print("error: --bundle needs --scheduler-address HOST:PORT, where that server reaches the scheduler",
              file=stderr)
        return EXIT_USAGE
    _check_scheduler_address(args.scheduler_address)  # before anything is issued
    to_stdout = args.bundle == "-"
    binary_out = getattr(stdout, "buffer", None)
    if to_stdout and binary_out is None:
        print("error: --bundle -: this standard output takes no binary data; give a file name", file=stderr)
        return EXIT_USAGE
    report = stderr if to_stdout else stdout
    _report_added(directory, add(directory, named), report)
    data = agent_bundle(directory, named.agents[0], args.scheduler_address)
    if binary_out is not None and to_stdout:
        stdout.flush()
        binary_out.write(data)
        binary_out.flush()
    else:
        Path(args.bundle).write_bytes(data)
    where = "standard output" if to_stdout else args.bundle
    print(f"bundle for {named.agents[0]} written to {where}: on that server, as root, mkdir -p /etc/aryl && "
          "tar -xzf BUNDLE -C /etc/aryl, then docker compose --env-file /etc/aryl/agent.env -f "
          "deploy/compose.agent.yml up -d (docs/operations.md, \"A cluster across servers\")", file=report)
    return EXIT_OK


def _report_added(directory: Path, added: Added, stdout: TextIO) -> int:
    for principal in added.tokens:
        role, name = principal.split(":", 1)
        files = f"{role}-{name}.crt/.key, " if role in ("agent", "router") else ""
        uid = f"; runs jobs as uid {added.mapped[name][0]} (users)" if name in added.mapped else ""
        print(f"issued {principal}: {files}token-{name}{uid}", file=stdout)
    for principal in added.kept:
        print(f"kept {principal}: already issued (its certificate and token are unchanged)", file=stdout)
    if added.tokens:
        print(f"{directory}/tokens updated: a running scheduler takes the new tokens within a second", file=stdout)
    return EXIT_OK
