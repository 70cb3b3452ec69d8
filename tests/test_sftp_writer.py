"""The sftp_writer target through the engine against a real OpenSSH server on loopback
(``tests/sshd_server.py``): dispatch, claim, attempt, settle, then what a user sees: the
file on the server, the delivery state, the history text and the alerts."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import paramiko
import pytest
from sqlalchemy import select

from b2bhub.engine import operator
from b2bhub.engine.probes import ProbeRunner
from b2bhub.engine.runner import TargetRunner
from b2bhub.models import Alert, Delivery, HistoryLine, Message
from b2bhub.runtime.hub import new_session
from b2bhub.services.errors import ServiceError
from plugins.sftp.connection import POOL, Connection, Endpoint, HostKey, SftpError
from plugins.sftp.writer import SftpWriter
from tests.enginekit import Clock
from tests.sshd_server import PASSWORD, USER, SshServer, keygen

BODY = b"<order id='1'>\x00\xffbinary too</order>\n"


@pytest.fixture(autouse=True)
def _sftp_writer(registry):
    registry.register(SftpWriter)
    POOL.close_all()
    yield
    POOL.close_all()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def writer(hub, sshd, remote):
    """Parties, a manual source and an sftp_writer routed from it; returns a setter that
    (re)configures the writer."""
    hub.parties()
    hub.instance("inbox", "manual_source")

    def configure(retry_policy=None, **config):
        data = {"config": {**sshd.connection(), "remote_directory": str(remote), **config}}
        if retry_policy is not None:
            data["retry_policy"] = retry_policy
        row = hub.instance("writer", "sftp_writer", **data)
        hub.route("inbox", "*", "*", "writer")
        return row
    return configure


def drain(hub, registry, clock) -> None:
    TargetRunner(new_session, registry, hub.store, "test-worker", clock=clock).drain(
        "writer", budget=30)


def state(session, message) -> tuple[str, str, int]:
    session.expire_all()
    delivery = session.scalar(select(Delivery).where(Delivery.message_id == message.id))
    return delivery.state, session.get(Message, message.id).status, delivery.attempt


def history(session, message) -> list[str]:
    return session.scalars(select(HistoryLine.text).where(
        HistoryLine.message_id == message.id, HistoryLine.type == "delivery_changed")
        .order_by(HistoryLine.id)).all()


def open_alerts(session, message) -> list[str]:
    return session.scalars(select(Alert.kind).where(
        Alert.message_id == message.id, Alert.resolved_at.is_(None))).all()


def files_below(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if not p.is_dir())


# --- logins ----------------------------------------------------------------------------

def test_a_password_login_uploads_the_payload_byte_for_byte(hub, session, registry, clock,
                                                              writer, remote):
    writer()
    message = hub.message(source="inbox", body=BODY, filename="order1.xml", now=clock())
    drain(hub, registry, clock)

    assert (remote / "order1.xml").read_bytes() == BODY
    assert files_below(remote) == ["order1.xml"]  # no temporary file left
    assert state(session, message) == ("delivered", "delivered", 1)
    assert history(session, message)[-1] == (
        f"writer: attempt 1 delivered: uploaded {remote}/order1.xml ({len(BODY)} bytes)")


@pytest.mark.parametrize("kind,bits", [("ed25519", None), ("rsa", 3072), ("ecdsa", 256)])
def test_a_key_login_without_a_password(hub, session, registry, clock, writer, remote,
                                        sshd, tmp_path, kind, bits):
    key = keygen(tmp_path / f"id_{kind}", kind, bits)
    sshd.authorize(key.with_suffix(".pub"))
    writer(password="", private_key=key.read_text())
    message = hub.message(source="inbox", body=BODY, filename=f"{kind}.xml", now=clock())
    drain(hub, registry, clock)

    assert (remote / f"{kind}.xml").read_bytes() == BODY
    assert state(session, message) == ("delivered", "delivered", 1)
    assert f"Accepted publickey for {USER}" in sshd.log.read_text()


def test_a_key_with_a_passphrase(hub, session, registry, clock, writer, remote, sshd,
                                 tmp_path):
    key = keygen(tmp_path / "id_locked", "ed25519", passphrase="open sesame")
    sshd.authorize(key.with_suffix(".pub"))
    writer(password="", private_key=key.read_text(), passphrase="open sesame")
    message = hub.message(source="inbox", body=BODY, filename="locked.xml", now=clock())
    drain(hub, registry, clock)
    assert (remote / "locked.xml").read_bytes() == BODY
    assert state(session, message)[0] == "delivered"


def test_a_wrong_password_is_an_auth_error_and_nothing_is_written(
        hub, session, registry, clock, writer, remote):
    writer(password="not-the-password")
    message = hub.message(source="inbox", body=BODY, filename="order.xml", now=clock())
    drain(hub, registry, clock)

    assert state(session, message) == ("retrying", "retrying", 1)
    [line] = [t for t in history(session, message) if "failed" in t]
    assert "authentication failed" in line and "error class auth" in line
    assert files_below(remote) == []


# --- the pinned host key ---------------------------------------------------------------

def test_a_changed_host_key_fails_at_once_with_an_alert_and_sends_nothing(
        hub, session, registry, clock, tmp_path):
    """The writer pinned the server's key; the server now offers another (an impostor,
    or a re-installed server): the attempt fails at once (class host_key, not retried),
    ``message_failed`` is raised, no file is written, and the server never saw a login
    attempt: neither the password nor a byte of the payload left."""
    server = SshServer(tmp_path / "sshd")
    try:
        target = server.directory("in")
        hub.parties()
        hub.instance("inbox", "manual_source")
        hub.instance("writer", "sftp_writer", config={**server.connection(),
                                                      "remote_directory": str(target)})
        hub.route("inbox", "*", "*", "writer")
        pinned = server.fingerprint()
        first = hub.message(source="inbox", body=BODY, filename="one.xml", now=clock())
        drain(hub, registry, clock)
        assert state(session, first)[0] == "delivered"

        server.new_host_key()
        POOL.close_all()  # a new worker process: the kept connection is gone
        time.sleep(0.5)  # the restart's own lines written
        log_before = server.log.read_text()
        second = hub.message(source="inbox", body=BODY, filename="two.xml", now=clock())
        drain(hub, registry, clock)

        assert state(session, second) == ("failed", "error", 1)
        line = history(session, second)[-1]
        assert "host key mismatch" in line and "error class host_key" in line
        assert f"pinned is {pinned}" in line and f"offered {server.fingerprint()}" in line
        assert "(error class host_key is not retried)" in line
        assert open_alerts(session, second) == ["message_failed"]
        assert files_below(target) == ["one.xml"]
        time.sleep(0.5)
        since = server.log.read_text()[len(log_before):]
        # the attempt connected and left without trying to log in
        assert "Connection from 127.0.0.1" in since, since
        assert "password" not in since and "Accepted" not in since, since

        # the instance's own alert, named by the server, once however many messages
        # wait: its probe (what the beat runs every interval) sees the same mismatch
        runner = ProbeRunner(registry, "test-probes", clock=clock)
        assert runner.probe(session.get_bind(), "writer", 30) == "offline"
        session.expire_all()
        offline = session.scalars(select(Alert).where(
            Alert.kind == "target_offline", Alert.resolved_at.is_(None))).all()
        assert [a.subject for a in offline] == ["instance:writer"]
        assert "writer is offline" in offline[0].text
        assert "host key mismatch" in offline[0].text
        assert f"offered {server.fingerprint()}" in offline[0].text
    finally:
        server.close()


def test_a_pinned_key_of_a_type_the_server_does_not_have_is_a_mismatch(
        hub, session, registry, clock, writer, remote, tmp_path):
    """Pinned: an ECDSA key; the server has only its ed25519 one (another server, or one
    re-installed with other keys): a host-key mismatch, not a connection error."""
    other = keygen(tmp_path / "other_host", "ecdsa", 256)
    writer(host_key=other.with_suffix(".pub").read_text())
    message = hub.message(source="inbox", body=BODY, filename="x.xml", now=clock())
    drain(hub, registry, clock)
    assert state(session, message) == ("failed", "error", 1)
    line = history(session, message)[-1]
    assert "host key mismatch" in line and "offers no ecdsa-sha2-nistp256 key" in line
    assert "error class host_key" in line
    assert files_below(remote) == []


def test_an_instance_without_a_pinned_host_key_is_refused_when_saved(hub, sshd):
    hub.parties()
    with pytest.raises(ServiceError) as refused:
        hub.instance("writer", "sftp_writer",
                     config={**sshd.connection(host_key=""), "remote_directory": "/tmp/x"})
    assert "host_key" in refused.value.details["config"]
    assert "pin the server's host key" in refused.value.details["config"]["host_key"]


def test_a_pasted_known_hosts_line_is_accepted(hub, session, registry, clock, writer,
                                               remote, sshd):
    scanned = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-p", str(sshd.port),
                              "127.0.0.1"], capture_output=True, text=True, timeout=30)
    line = next(x for x in scanned.stdout.splitlines() if not x.startswith("#"))
    assert line.startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    writer(host_key=line)
    message = hub.message(source="inbox", body=BODY, filename="scan.xml", now=clock())
    drain(hub, registry, clock)
    assert (remote / "scan.xml").read_bytes() == BODY
    assert state(session, message)[0] == "delivered"


# --- atomic, idempotent ------------------------------------------------------------------

def test_no_partner_ever_sees_a_partial_file_under_its_name(hub, session, registry, clock,
                                                            writer, remote):
    """A 64 MB upload watched from the server's side: under its final name there is
    nothing or the whole file, never part of it; meanwhile the temporary name grows."""
    body = os.urandom(1 << 20) * 64
    writer()
    message = hub.message(source="inbox", body=body, filename="big.bin", now=clock())
    final, seen, partial, stop = remote / "big.bin", set(), [], threading.Event()

    def watch():
        while not stop.is_set():
            for path in remote.iterdir():
                if path.name.startswith(".b2bhub-") and path.name.endswith(".part"):
                    seen.add(path.name)
            try:
                size = final.stat().st_size
            except FileNotFoundError:
                continue
            if size != len(body):
                partial.append(size)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        drain(hub, registry, clock)
    finally:
        stop.set()
        watcher.join()
    assert state(session, message)[0] == "delivered"
    assert seen, "the upload was never seen under its temporary name"
    assert partial == []
    assert hashlib.sha256(final.read_bytes()).digest() == hashlib.sha256(body).digest()
    assert files_below(remote) == ["big.bin"]


def test_a_redelivery_finding_exactly_the_payload_counts_as_written(
        hub, session, registry, clock, writer, remote):
    """The operator redelivers a message whose file is on the server already (the
    attempt that wrote it was cut short, or the partner asks again): the same name, the
    same bytes, counted as written, not failed."""
    writer()
    message = hub.message(source="inbox", body=BODY, filename="again.xml", now=clock())
    # the first attempt cannot write (the directory is read-only for the user), the
    # file is then put there by "the attempt that was cut short"
    os.chmod(remote, 0o555)
    drain(hub, registry, clock)
    assert state(session, message)[0] == "retrying"
    os.chmod(remote, 0o755)
    (remote / "again.xml").write_bytes(BODY)
    delivery_id = session.scalar(select(Delivery.id).where(Delivery.message_id == message.id))
    operator.redeliver(session, delivery_id, "alice", clock())
    session.commit()
    drain(hub, registry, clock)

    assert state(session, message) == ("delivered", "delivered", 2)
    assert history(session, message)[-1] == (
        f"writer: attempt 2 delivered: {remote}/again.xml already holds this payload "
        f"({len(BODY)} bytes); counted as written")
    assert files_below(remote) == ["again.xml"]


def test_a_reattempt_finding_other_content_fails_and_leaves_it(hub, session, registry,
                                                               clock, writer, remote):
    writer()
    message = hub.message(source="inbox", body=BODY, filename="taken.xml", now=clock())
    os.chmod(remote, 0o555)
    drain(hub, registry, clock)
    os.chmod(remote, 0o755)
    other = bytes(reversed(BODY))  # the same size, other bytes
    (remote / "taken.xml").write_bytes(other)
    clock.advance(3600)
    drain(hub, registry, clock)

    assert state(session, message) == ("failed", "error", 2)
    assert history(session, message)[-1].endswith(
        f"{remote}/taken.xml exists and overwrite is off")
    assert (remote / "taken.xml").read_bytes() == other


def test_overwrite_replaces_the_file_in_one_rename(hub, session, registry, clock, writer,
                                                   remote):
    writer(overwrite=True)
    (remote / "same.xml").write_bytes(b"yesterday's order")
    inode = (remote / "same.xml").stat().st_ino
    message = hub.message(source="inbox", body=BODY, filename="same.xml", now=clock())
    drain(hub, registry, clock)
    assert state(session, message)[0] == "delivered"
    assert (remote / "same.xml").read_bytes() == BODY
    assert (remote / "same.xml").stat().st_ino != inode  # a new file renamed over it
    assert files_below(remote) == ["same.xml"]


def test_directories_are_made_and_chmod_applied(hub, session, registry, clock, writer,
                                                remote):
    writer(filename_pattern="{to}/{from}/{original_filename}", chmod="0640")
    message = hub.message(source="inbox", body=BODY, filename="deep.xml", now=clock())
    drain(hub, registry, clock)
    path = remote / "mycompany" / "acme" / "deep.xml"
    assert state(session, message)[0] == "delivered"
    assert path.read_bytes() == BODY
    assert oct(path.stat().st_mode & 0o777) == "0o640"


# --- errors classified -------------------------------------------------------------------

def test_a_permission_error_is_classified_and_a_rule_can_fail_it_at_once(
        hub, session, registry, clock, writer, sshd):
    locked = sshd.directory("locked-by-root", owner="root")
    writer(remote_directory=str(locked),
           retry_policy={"rules": [{"match": "permission", "action": "fail"}]})
    message = hub.message(source="inbox", body=BODY, filename="denied.xml", now=clock())
    drain(hub, registry, clock)

    assert state(session, message) == ("failed", "error", 1)
    line = history(session, message)[-1]
    assert "permission denied" in line and "error class permission" in line
    assert line.endswith("(error class permission is not retried)")
    assert open_alerts(session, message) == ["message_failed"]
    assert files_below(locked) == []


def test_a_full_remote_disk_is_classified_no_space_and_retried(
        hub, session, registry, clock, writer, sshd, remote):
    """A 1 MB tmpfs mounted on the server's directory, a 3 MB message: the server
    reports a plain failure (OpenSSH sends ENOSPC as SSH_FX_FAILURE); the writer asks
    the server's statvfs and says no_space. The temporary file is removed, nothing is
    under the final name, and the retry policy retries it."""
    full = remote / "full"
    full.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs",
                              str(full)], capture_output=True, text=True)
    assert mounted.returncode == 0, f"cannot mount a tmpfs: {mounted.stderr}"
    try:
        os.chown(full, sshd.user.pw_uid, sshd.user.pw_gid)
        writer(remote_directory=str(full))
        message = hub.message(source="inbox", body=os.urandom(3 << 20), filename="big.bin",
                              now=clock())
        drain(hub, registry, clock)

        assert state(session, message) == ("retrying", "retrying", 1)
        line = history(session, message)[-1]
        assert "no space left on the server" in line and "error class no_space" in line
        assert files_below(full) == []
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_an_unreachable_server_is_a_connection_error(hub, session, registry, clock, writer,
                                                     sshd):
    from tests.procs import free_port
    writer(port=free_port())  # nothing listens there
    message = hub.message(source="inbox", body=BODY, filename="x.xml", now=clock())
    drain(hub, registry, clock)
    assert state(session, message) == ("retrying", "retrying", 1)
    assert "error class connection" in history(session, message)[-1]


# --- the kept connection -------------------------------------------------------------------

def test_one_connection_is_kept_for_the_instance_and_closed_when_idle(
        hub, session, registry, clock, writer, remote):
    writer(idle_close=1)
    opened = POOL.opened
    for n in range(3):
        hub.message(source="inbox", body=BODY, filename=f"m{n}.xml", now=clock())
    drain(hub, registry, clock)
    assert files_below(remote) == ["m0.xml", "m1.xml", "m2.xml"]
    assert POOL.opened - opened == 1
    assert POOL.kept() == 1
    deadline = time.monotonic() + 15
    while POOL.kept() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert POOL.kept() == 0, "the idle connection was not closed"


def test_a_server_restarted_between_two_messages_costs_no_attempt(
        hub, session, registry, clock, writer, remote, sshd):
    """The kept connection died with the server's restart: the next attempt sees it
    before sending anything, connects again and delivers, on its first attempt."""
    writer()
    first = hub.message(source="inbox", body=BODY, filename="before.xml", now=clock())
    drain(hub, registry, clock)
    assert state(session, first)[0] == "delivered"
    sshd.stop()
    sshd.start()
    second = hub.message(source="inbox", body=BODY, filename="after.xml", now=clock())
    drain(hub, registry, clock)
    assert state(session, second) == ("delivered", "delivered", 1)
    assert (remote / "after.xml").read_bytes() == BODY


# --- the partner's profile, the probe ---------------------------------------------------------

def test_a_writer_on_the_partners_profile_connects_as_the_profile_says(
        hub, session, registry, clock, sshd, remote, api):
    hub.parties(partners=("acme", "globex"))
    hub.instance("inbox", "manual_source")
    hub.instance("writer", "sftp_writer", config={"connection": "partner",
                                                  "remote_directory": str(remote),
                                                  "filename_pattern": "{to}.xml"})
    hub.route("inbox", "*", "*", "writer")
    assert api.put("/api/v1/partners/acme/profiles/sftp", json={
        "host": "127.0.0.1", "port": sshd.port, "username": USER,
        "password": PASSWORD}).status_code == 200
    assert api.post("/api/v1/partners/acme/profiles/sftp/actions/pin_host_key",
                    json={"key": sshd.host_key}).status_code == 200
    to_acme = hub.message(source="inbox", from_party="mycompany", to_party="acme",
                          body=BODY, now=clock())
    to_globex = hub.message(source="inbox", from_party="mycompany", to_party="globex",
                            body=BODY, now=clock())
    drain(hub, registry, clock)
    assert state(session, to_acme)[0] == "delivered"
    assert (remote / "acme.xml").read_bytes() == BODY
    assert state(session, to_globex) == ("failed", "error", 1)
    assert history(session, to_globex)[-1].endswith("globex has no SFTP profile")


def test_a_killed_workers_temporary_file_is_removed_once_an_hour_old(
        hub, session, registry, clock, writer, remote):
    old, young = remote / ".b2bhub-0123456789abcdef.part", remote / ".b2bhub-fedcba9876543210.part"
    other = remote / "partner-file.part"
    for path in (old, young, other):
        path.write_bytes(b"half a file")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    os.utime(other, (two_hours_ago, two_hours_ago))
    writer()
    message = hub.message(source="inbox", body=BODY, filename="new.xml", now=clock())
    drain(hub, registry, clock)
    assert state(session, message)[0] == "delivered"
    assert files_below(remote) == [young.name, "new.xml", other.name]


def test_the_probe_connects_and_stats_the_directory(sshd, remote):
    config = {**sshd.connection(), "remote_directory": str(remote)}
    assert SftpWriter("w", config).probe() is True
    sshd.stop()
    try:
        with pytest.raises(SftpError) as down:
            SftpWriter("w", config).probe()
        assert down.value.error_class == "connection"
    finally:
        sshd.start()
    with pytest.raises(SftpError) as impostor:
        SftpWriter("w", {**config, "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqq"
                         "nkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"}).probe()
    assert impostor.value.error_class == "host_key"
    assert "host key mismatch" in str(impostor.value)
    (remote / "a-file").write_bytes(b"")
    with pytest.raises(SftpError, match="is not a directory"):
        SftpWriter("w", {**config, "remote_directory": str(remote / "a-file")}).probe()


def test_writer_and_profile_kind_are_found_through_the_entry_point():
    from importlib.metadata import entry_points
    [found] = [e for e in entry_points(group="b2bhub.plugins") if e.name == "sftp_writer"]
    assert found.load() is SftpWriter
    assert [k.kind for k in SftpWriter.profile_kinds] == ["sftp"]
    assert Endpoint.from_config({"host": "h"}).problems().keys() == {
        "username", "password", "host_key"}


# --- a server that hangs up during the login -------------------------------------------

class _HangUpAtLogin(paramiko.ServerInterface):
    """Answers the key exchange, then closes the connection at the first login try:
    what an sshd being stopped does to a client between handshake and login."""

    def __init__(self, transport: paramiko.Transport) -> None:
        self.transport = transport

    def get_allowed_auths(self, username):
        return "password"

    def check_auth_password(self, username, password):
        self.transport.close()
        return paramiko.AUTH_FAILED


def test_a_server_hanging_up_during_the_login_is_a_lost_connection_not_a_refusal():
    """paramiko reports it as "Authentication failed: transport shut down or saw EOF";
    an operator reading "error class auth" would go and check the password."""
    host_key = paramiko.ECDSAKey.generate()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        sock, _ = listener.accept()
        transport = paramiko.Transport(sock)
        transport.add_server_key(host_key)
        transport.start_server(server=_HangUpAtLogin(transport))
        transport.join(10)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        endpoint = Endpoint(host="127.0.0.1", port=port, username=USER, password="x",
                            host_key=HostKey.of(host_key).line, connect_timeout=5)
        with pytest.raises(SftpError) as caught:
            Connection(endpoint)
    finally:
        listener.close()
        thread.join(10)
    assert caught.value.error_class == "connection", str(caught.value)
    assert "closed the connection during the login" in str(caught.value)
