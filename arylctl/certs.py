"""``arylctl certs init DIR``: a development CA and everything a cluster needs to run with mutual TLS
and tokens (docs/security.md). For development and compose; production brings its own PKI.

DIR receives (keys and tokens 0600):

- ``ca.crt``/``ca.key``: the CA every component trusts (the key signs nothing else: keep it off the servers);
- ``scheduler.crt``/``.key``: CN ``aryl-scheduler``, names ``localhost``, ``scheduler``, ``127.0.0.1``
  (it also presents it as a client, to read agents' worker logs);
- ``client.crt``/``.key``: CN ``aryl-client``, for ``arylctl`` and programs (whose identity is their token);
- ``agent-<ID>.crt``/``.key`` per ``--agent ID``: CN and DNS name the server id (also ``localhost`` and
  ``127.0.0.1``, so a one-machine demo's log service can be reached);
- ``router-<ID>.crt``/``.key`` per ``--router ID``;
- ``tokens``: the scheduler's token file (hashes only); ``token-<NAME>``: each principal's token.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aryl_common.security import SCHEDULER_CERT_NAME, hash_token, write_private

CLIENT_CERT_NAME = "aryl-client"
VALID_DAYS = 365
LOCAL_NAMES = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class DevCluster:
    """What ``init`` makes: names of agents, routers, users and admins."""

    agents: tuple[str, ...] = ()
    routers: tuple[str, ...] = ()
    users: tuple[str, ...] = ("alice",)
    admins: tuple[str, ...] = ("admin",)
    scheduler_names: tuple[str, ...] = ("localhost", "scheduler", "127.0.0.1")
    extra: dict[str, str] = field(default_factory=dict)


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
           names: tuple[str, ...], *, server: bool) -> tuple[bytes, bytes]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(_san((common_name, *names)), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def init(directory: str | Path, cluster: DevCluster) -> dict[str, str]:
    """Write the CA, certificates, keys and tokens of ``cluster`` into ``directory`` (anything there is
    replaced); returns each principal's token by ``role:name``."""
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

    def issue(stem: str, common_name: str, names: tuple[str, ...], *, server: bool) -> None:
        cert, key = _issue(ca_cert, ca_key, common_name, names, server=server)
        (out / f"{stem}.crt").write_bytes(cert)
        write_private(out / f"{stem}.key", key)

    issue("scheduler", SCHEDULER_CERT_NAME, cluster.scheduler_names, server=True)
    issue("client", CLIENT_CERT_NAME, (), server=False)
    for agent in cluster.agents:
        issue(f"agent-{agent}", agent, LOCAL_NAMES, server=True)  # it serves worker logs too
    for router in cluster.routers:
        issue(f"router-{router}", router, (), server=False)

    principals = ([("admin", n) for n in cluster.admins] + [("user", n) for n in cluster.users]
                  + [("agent", n) for n in cluster.agents] + [("router", n) for n in cluster.routers])
    tokens: dict[str, str] = {}
    lines = ["# ROLE NAME sha256:HEX -- made by arylctl certs init; tokens themselves are in token-<NAME>"]
    for role, name in principals:
        token = f"aryl_{secrets.token_urlsafe(32)}"
        tokens[f"{role}:{name}"] = token
        lines.append(f"{role} {name} sha256:{hash_token(token)}")
        write_private(out / f"token-{name}", token + "\n")
    write_private(out / "tokens", "\n".join(lines) + "\n")
    return tokens


def issue_from(directory: str | Path, stem: str, common_name: str, names: tuple[str, ...] = LOCAL_NAMES, *,
               server: bool = True) -> tuple[Path, Path]:
    """Issue one more certificate (``stem``.crt/.key) from the CA that ``init`` wrote into ``directory``
    (e.g. for an agent added later); returns the certificate's and the key's paths."""
    out = Path(directory)
    ca_cert = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{out / 'ca.key'} is not the EC key arylctl certs init writes")
    cert, key = _issue(ca_cert, ca_key, common_name, names, server=server)
    (out / f"{stem}.crt").write_bytes(cert)
    write_private(out / f"{stem}.key", key)
    return out / f"{stem}.crt", out / f"{stem}.key"
