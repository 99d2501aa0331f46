"""``arylctl certs init|add|renew`` (``arylctl.certs``): a development CA that grows by one command, the
user map it writes so that a root agent can run the jobs of the users it issued (issue 36), and
certificates issued again when they expire (issue 37: an expired one ends its streams).

Files only, no scheduler: ``arylctl`` runs in this process (``cli.main``)."""

from __future__ import annotations

import datetime
import io
import pwd
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from aryl_common.security import hash_token, load_tokens
from arylctl import certs, cli


def arylctl(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = cli.main(list(argv), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def common_name(path: Path) -> str:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return str(cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value)


def test_init_writes_a_user_map_for_its_users_and_admins(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    status, out, err = arylctl("certs", "init", str(pki), "--agent", "gpu-1", "--user", "alice", "--user", "bob")
    assert status == 0, err
    mapping = certs.read_user_map(pki / "users")
    assert set(mapping) == {"admin", "alice", "bob"}
    for name, (uid, gid) in mapping.items():
        assert uid >= 1000 and gid >= 1000, name  # never root, never a system account
    assert len({uid for uid, _ in mapping.values()}) == 3  # one uid each
    assert stat.S_IMODE((pki / "users").stat().st_mode) == 0o644  # no secret: the agents read it
    assert f"ARYL_USERS__MAP_FILE={pki.resolve()}/users" in out


def test_a_name_with_an_account_here_keeps_its_uid_and_others_get_free_ones(tmp_path: Path) -> None:
    person = next((p for p in pwd.getpwall() if 1000 <= p.pw_uid < 65534), None)
    names = ["carol-has-no-account"] + ([person.pw_name] if person else [])
    added = certs.map_users(tmp_path, names)
    first = added["carol-has-no-account"]
    assert first[0] >= certs.DEV_UID_FIRST and first[0] == first[1]
    if person is not None:
        assert added[person.pw_name] == (person.pw_uid, person.pw_gid)
    # Kept as written (an operator's edit too); a new name takes the next free uid.
    (tmp_path / "users").write_text((tmp_path / "users").read_text() + "dave:30000:30000\n")
    again = certs.map_users(tmp_path, ["carol-has-no-account", "dave", "erin-has-no-account"])
    assert list(again) == ["erin-has-no-account"] and again["erin-has-no-account"][0] not in (first[0], 30000)
    assert certs.read_user_map(tmp_path / "users")["dave"] == (30000, 30000)


def test_an_agent_or_a_user_is_added_to_an_existing_ca_with_one_command(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    assert arylctl("certs", "init", str(pki), "--agent", "gpu-1")[0] == 0
    before = {name: (pki / name).read_bytes() for name in ("ca.crt", "ca.key", "agent-gpu-1.key", "token-alice")}

    status, out, err = arylctl("certs", "add", str(pki), "--agent", "gpu-3", "--user", "bob", "--agent", "gpu-1")
    assert status == 0, err
    assert "issued agent:gpu-3: agent-gpu-3.crt/.key, token-gpu-3" in out
    assert "issued user:bob: token-bob; runs jobs as uid" in out
    assert "kept agent:gpu-1: already issued" in out
    assert {name: (pki / name).read_bytes() for name in before} == before  # nothing issued before changes
    assert common_name(pki / "agent-gpu-3.crt") == "gpu-3"
    principals = {str(p) for p in load_tokens(pki / "tokens").values()}
    assert {"agent:gpu-1", "agent:gpu-3", "user:alice", "user:bob", "admin:admin"} <= principals
    bob = (pki / "token-bob").read_text().strip()
    assert str(load_tokens(pki / "tokens")[hash_token(bob)]) == "user:bob"
    assert "bob" in certs.read_user_map(pki / "users")
    for name in ("agent-gpu-3.key", "token-gpu-3", "token-bob", "tokens"):
        assert stat.S_IMODE((pki / name).stat().st_mode) == 0o600, name

    # `init` again with one more agent (what a user tries first) issues it too, and keeps the CA.
    status, out, _ = arylctl("certs", "init", str(pki), "--agent", "gpu-1", "--agent", "gpu-4")
    assert status == 0 and "already holds a CA: kept" in out and "issued agent:gpu-4" in out
    assert (pki / "ca.key").read_bytes() == before["ca.key"] and (pki / "agent-gpu-4.crt").is_file()
    status, _, err = arylctl("certs", "init", str(pki), "--scheduler-name", "sched.example")
    assert status == 0 and "--scheduler-name is not applied" in err  # never silently ignored


def test_add_refuses_what_it_cannot_do_and_says_what_to_do(tmp_path: Path) -> None:
    status, _, err = arylctl("certs", "add", str(tmp_path / "none"), "--agent", "gpu-1")
    assert status == 2 and "holds no CA" in err and "arylctl certs init" in err
    pki = tmp_path / "pki"
    arylctl("certs", "init", str(pki))
    status, _, err = arylctl("certs", "add", str(pki))
    assert status == 2 and "--agent ID, --router ID, --user NAME or --admin NAME" in err
    status, _, err = arylctl("certs", "add", str(pki), "--agent", "alice")  # alice is a user already
    assert status == 2 and "'alice' is already issued as user" in err
    assert not (pki / "agent-alice.crt").exists()


def _reissue(pki: Path, name: str, not_after: datetime.datetime) -> None:
    """Replace ``name``.crt with the same certificate (key, subject, extensions) valid only until
    ``not_after``, signed by the CA's key (its own certificate when ``name`` is the CA)."""
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    old = x509.load_pem_x509_certificate((pki / f"{name}.crt").read_bytes())
    builder = (x509.CertificateBuilder().subject_name(old.subject).issuer_name(old.issuer)
               .public_key(old.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(not_after - datetime.timedelta(days=1)).not_valid_after(not_after))
    for extension in old.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    (pki / f"{name}.crt").write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))


def test_renew_issues_expired_certificates_again_with_the_same_keys_and_names(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    assert arylctl("certs", "init", str(pki), "--agent", "gpu-1", "--router", "r1")[0] == 0
    now = datetime.datetime.now(datetime.UTC)
    _reissue(pki, "client", now - datetime.timedelta(minutes=1))  # what the scheduler refuses
    _reissue(pki, "agent-gpu-1", now - datetime.timedelta(minutes=1))
    before = {p.name: p.read_bytes() for p in pki.iterdir() if not p.name.endswith(".crt")}
    old = {p.name: x509.load_pem_x509_certificate(p.read_bytes()) for p in pki.glob("*.crt")}

    status, out, err = arylctl("certs", "renew", str(pki))
    assert status == 0, err
    for name in ("client.crt", "agent-gpu-1.crt", "router-r1.crt", "scheduler.crt"):
        assert f"renewed {name}: valid until " in out, out
    assert "ca.crt" not in out
    assert {p.name: p.read_bytes() for p in pki.iterdir() if not p.name.endswith(".crt")} == before  # keys, tokens
    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    for name in ("client.crt", "agent-gpu-1.crt", "router-r1.crt", "scheduler.crt"):
        new = x509.load_pem_x509_certificate((pki / name).read_bytes())
        new.verify_directly_issued_by(ca)
        assert new.not_valid_after_utc > now + datetime.timedelta(days=300), name
        assert new.not_valid_after_utc <= ca.not_valid_after_utc, name  # never past the CA
        assert new.public_key() == old[name].public_key(), name  # the holder's key file still fits
        assert new.subject == old[name].subject and list(new.extensions) == list(old[name].extensions), name
    assert common_name(pki / "agent-gpu-1.crt") == "gpu-1"


def test_renew_refuses_a_directory_without_a_ca_or_with_an_expired_one(tmp_path: Path) -> None:
    status, _, err = arylctl("certs", "renew", str(tmp_path / "none"))
    assert status == 2 and "holds no CA" in err and "arylctl certs init" in err
    pki = tmp_path / "pki"
    arylctl("certs", "init", str(pki))
    _reissue(pki, "ca", datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1))
    status, _, err = arylctl("certs", "renew", str(pki))
    assert status == 2 and "the CA in" in err and "expired at" in err and "--force makes a new CA" in err


def test_one_command_issues_a_gpu_server_and_packs_what_it_needs(tmp_path: Path) -> None:
    """``certs add --agent ID --bundle FILE``: the server's certificate, key, token, the CA and agent.env in
    one archive, owned by the images' user when unpacked as root (deploy/compose.agent.yml mounts them)."""
    pki, bundle = tmp_path / "pki", tmp_path / "gpu-7.tgz"
    assert arylctl("certs", "init", str(pki), "--scheduler-name", "10.0.0.5")[0] == 0
    status, out, err = arylctl("certs", "add", str(pki), "--agent", "gpu-7", "--bundle", str(bundle),
                               "--scheduler-address", "10.0.0.5:50051")
    assert status == 0, err
    assert "issued agent:gpu-7" in out and "tar -xzf BUNDLE -C /etc/aryl" in out
    with tarfile.open(bundle) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"pki", "pki/ca.crt", "pki/agent.crt", "pki/agent.key", "pki/token", "pki/users",
                                "agent.env"}
        assert {(m.uid, m.gid) for m in members.values()} == {(certs.IMAGE_UID, certs.IMAGE_UID)}
        assert stat.S_IMODE(members["pki/agent.key"].mode) == stat.S_IMODE(members["pki/token"].mode) == 0o600
        def read(name: str) -> bytes:
            member = tar.extractfile(name)
            assert member is not None
            return member.read()
        assert read("pki/agent.crt") == (pki / "agent-gpu-7.crt").read_bytes()
        assert read("pki/agent.key") == (pki / "agent-gpu-7.key").read_bytes()
        assert read("pki/ca.crt") == (pki / "ca.crt").read_bytes()
        token = read("pki/token").decode().strip()
        assert read("agent.env").decode().splitlines() == ["ARYL_SERVER_ID=gpu-7",
                                                             "ARYL_SCHEDULER_ADDRESS=10.0.0.5:50051"]
    tokens = load_tokens(pki / "tokens")
    assert (tokens[hash_token(token)].role, tokens[hash_token(token)].name) == ("agent", "gpu-7")
    # Again for the same server: its key and token are kept (its holder is not locked out), the bundle re-made.
    status, out, _ = arylctl("certs", "add", str(pki), "--agent", "gpu-7", "--bundle", str(tmp_path / "again.tgz"),
                             "--scheduler-address", "10.0.0.5:50051")
    assert status == 0 and "kept agent:gpu-7" in out
    with tarfile.open(tmp_path / "again.tgz") as tar:
        again = tar.extractfile("pki/token")
        assert again is not None and again.read().decode().strip() == token


def test_a_bundle_to_standard_output_is_the_archive_alone(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    assert arylctl("certs", "init", str(pki))[0] == 0
    argv = ["certs", "add", str(pki), "--agent", "gpu-8", "--bundle", "-", "--scheduler-address", "ctl.example:50051"]
    done = subprocess.run([sys.executable, "-c", "import sys; from arylctl.cli import main; sys.exit(main())", *argv],
                          capture_output=True, check=True)
    assert b"issued agent:gpu-8" in done.stderr
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        agent_env = tar.extractfile("agent.env")
        assert agent_env is not None and b"ARYL_SERVER_ID=gpu-8" in agent_env.read()


def test_a_bundle_refuses_what_it_cannot_pack_before_issuing_anything(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    assert arylctl("certs", "init", str(pki))[0] == 0
    bundle = str(tmp_path / "b.tgz")
    for argv, problem in [
        (["--agent", "gpu-1", "--bundle", bundle], "needs --scheduler-address HOST:PORT"),
        (["--agent", "gpu-1", "--bundle", bundle, "--scheduler-address", "10.0.0.5"], "give HOST:PORT"),
        (["--agent", "gpu-1", "--agent", "gpu-2", "--bundle", bundle, "--scheduler-address", "a:1"], "exactly one"),
        (["--agent", "gpu-1", "--user", "bob", "--bundle", bundle, "--scheduler-address", "a:1"], "exactly one"),
    ]:
        status, _, err = arylctl("certs", "add", str(pki), *argv)
        assert status == 2 and problem in err, (argv, err)
    assert not (pki / "agent-gpu-1.crt").exists() and "gpu-1" not in certs.issued(pki)
    assert not Path(bundle).exists()


def test_the_bundle_s_owner_is_the_images_user() -> None:
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    assert f"useradd --create-home --uid {certs.IMAGE_UID} " in dockerfile
