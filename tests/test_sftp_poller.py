"""The sftp_poller source in one process with the engine against a real OpenSSH server
on loopback (``tests/sshd_server.py``): password and key logins, the three
post-processing modes, completeness, unroutable files, a death between the commit and
the removal, a changed host key, an outage, the probe and the host-key actions.

What is checked is what a user relies on: the messages and their history, the files on
the server's disk, the alerts, and the server's own log (no login when the key differs)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from b2bhub.engine.scans import SourceRunner
from b2bhub.models import Alert, HistoryLine, Lock, Message, PollerPickup
from b2bhub.runtime.hub import new_session
from b2bhub.services.config import get_instance, save_instance
from plugins.sftp.connection import POOL, SftpError
from plugins.sftp.poller import RemoteFile, SftpPoller
from tests.enginekit import Clock
from tests.sshd_server import SshServer, keygen


class Death(BaseException):
    """A process dying where it stands."""


@pytest.fixture(autouse=True)
def _sftp_poller(registry):
    registry.register(SftpPoller)
    POOL.close_all()
    POOL.opened = 0  # counted per test: another module's tests may have run before
    yield
    POOL.close_all()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def poller(hub, sshd, remote):
    """Parties and the poller ``poller`` on ``remote`` (files below {to}/, taken on the
    second scan); returns a setter that (re)configures it."""
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))

    def configure(server: SshServer = sshd, **config):
        return hub.instance("poller", "sftp_poller", config={
            **server.connection(), "remote_directory": str(remote),
            "path_pattern": "{to}/{filename}", "settle_seconds": 0, **config})
    return configure


@pytest.fixture
def runner(registry, hub, clock):
    return SourceRunner(new_session, registry, hub.store, "proc-a", clock=clock)


def put(sshd: SshServer, remote: Path, relative: str, body: bytes = b"<order/>") -> Path:
    """A file as a partner's upload leaves it (directories the SFTP user owns)."""
    path = remote / relative
    if not path.parent.exists():
        sshd.directory(str(path.parent.relative_to(sshd.root)))
    path.write_bytes(body)
    return path


def scan(runner, clock, times: int = 1):
    report = None
    for _ in range(times):
        report = runner.scan("poller")
        clock.advance(61)
    return report


def messages(session) -> list[tuple]:
    session.expire_all()
    return session.execute(select(
        Message.from_party, Message.to_party, Message.original_filename,
        Message.correlation_id, Message.sha256).order_by(Message.id)).all()


def count(session, model) -> int:
    session.expire_all()
    return session.scalar(select(func.count()).select_from(model))


def files_below(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if not p.is_dir())


# --- taking files -----------------------------------------------------------------------

def test_files_become_messages_then_are_deleted_at_most_max_files_per_scan(
        poller, runner, clock, sshd, remote, hub, session):
    """Password login; {to} from the path, the correlation id from the name; a first
    sighting is not taken; two files per scan; an unknown partner's file is moved to
    unroutable/ with its reason; nothing is left but that."""
    poller(max_files=2, correlation_pattern=r"PO-(\d+)")
    bodies = {"acme/PO-1.xml": b"<order>1</order>", "acme/PO-2.xml": b"\x00\xff" * 5000,
              "globex/inv.txt": b"invoice"}
    for relative, body in bodies.items():
        put(sshd, remote, relative, body)
    put(sshd, remote, "initech/x.xml", b"for nobody")

    assert scan(runner, clock).messages == []  # a first sighting
    assert len(scan(runner, clock).messages) == 2
    assert len(scan(runner, clock).messages) == 1
    rows = messages(session)
    assert [r[:4] for r in rows] == [("mycompany", "acme", "PO-1.xml", "1"),
                                     ("mycompany", "acme", "PO-2.xml", "2"),
                                     ("mycompany", "globex", "inv.txt", None)]
    assert [hub.store.open(r.sha256).read() for r in rows] == list(bodies.values())
    assert files_below(remote) == ["unroutable/initech/x.xml",
                                   "unroutable/initech/x.xml.reason.txt"]
    reason = (remote / "unroutable/initech/x.xml.reason.txt").read_text()
    assert "'initech' (captured by {to}) is not a business partner" in reason
    assert count(session, PollerPickup) == 0
    assert POOL.opened == 1  # one connection for every scan of this process


def test_a_file_still_growing_is_not_taken_until_two_listings_agree(
        poller, runner, clock, sshd, remote, session):
    poller()
    path = put(sshd, remote, "acme/grows.csv", b"1")
    scan(runner, clock)
    with open(path, "ab") as out:
        out.write(b"2")
    scan(runner, clock)  # another size than the previous scan saw: not yet
    assert count(session, Message) == 0 and path.exists()
    scan(runner, clock)
    assert count(session, Message) == 1 and not path.exists()


def test_a_key_login_moves_each_file_to_the_archive_without_replacing_one(
        poller, runner, clock, sshd, remote, session, tmp_path):
    key = keygen(tmp_path / "id_ed25519", "ed25519")
    sshd.authorize(key.with_suffix(".pub"))
    archive = sshd.directory(f"{remote.name}-archive")
    poller(password="", private_key=key.read_text(), after="move",
           archive_directory=str(archive), archive_name="{path}", settle_seconds=1)
    put(sshd, archive, "acme/o.xml", b"an older one")
    put(sshd, remote, "acme/o.xml", b"this one")
    scan(runner, clock)  # taken in one scan: listed again a second later, unchanged
    assert count(session, Message) == 1
    assert files_below(remote) == []
    assert (archive / "acme/o.xml").read_bytes() == b"an older one"
    assert (archive / "acme/o.xml.1").read_bytes() == b"this one"
    assert "Accepted publickey" in sshd.log.read_text()


def test_keep_leaves_files_in_place_and_never_takes_one_twice(
        poller, registry, runner, clock, sshd, remote, hub, session):
    """Kept files are remembered (their pickup rows) across scans and a restart; a file
    rewritten in place is a new file; a removed one is forgotten (the memory is bounded
    by what the directory holds)."""
    poller(after="keep")
    a = put(sshd, remote, "acme/a.xml", b"a")
    b = put(sshd, remote, "acme/b.xml", b"b")
    scan(runner, clock, 4)
    restarted = SourceRunner(new_session, registry, hub.store, "proc-b", clock=clock)
    scan(restarted, clock, 3)
    assert [r[2] for r in messages(session)] == ["a.xml", "b.xml"]
    assert a.exists() and b.exists() and count(session, PollerPickup) == 2

    b.write_bytes(b"b, second version")
    os.utime(b, (time.time() + 5, time.time() + 5))
    a.unlink()
    scan(restarted, clock, 3)
    assert [r[2] for r in messages(session)] == ["a.xml", "b.xml", "b.xml"]
    assert hub.store.open(messages(session)[-1].sha256).read() == b"b, second version"
    assert count(session, PollerPickup) == 1  # a's memory went with a, b's old one too


def test_a_death_between_the_commit_and_the_removal_stores_nothing_twice(
        poller, registry, runner, clock, sshd, remote, hub, session, monkeypatch):
    poller()
    files = [put(sshd, remote, f"acme/o{i}.xml", b"o%d" % i) for i in range(3)]
    scan(runner, clock)

    def die(self):
        raise Death()
    monkeypatch.setattr(RemoteFile, "remove", die)
    with pytest.raises(Death):
        runner.scan("poller")
    monkeypatch.undo()
    assert count(session, Message) == 3 and count(session, PollerPickup) == 3
    assert all(f.exists() for f in files)
    with new_session() as s:  # the dead process's lease, run out
        s.execute(Lock.__table__.update().where(Lock.name == "scan:poller").values(
            owner="proc-a:dead", until=clock() - timedelta(seconds=1)))
        s.commit()
    POOL.close_all()
    restarted = SourceRunner(new_session, registry, hub.store, "proc-b", clock=clock)
    assert restarted.scan("poller").messages == []  # recovery: removal only
    assert not any(f.exists() for f in files)
    assert count(session, Message) == 3 and count(session, PollerPickup) == 0


# --- a server that cannot be reached, or is not the pinned one -------------------------

def collection_errors(session) -> list[tuple]:
    session.expire_all()
    return session.execute(select(Message.id, Message.status, Message.status_text).where(
        Message.status == "collection_error").order_by(Message.id)).all()


def alerts(session) -> list[tuple]:
    session.expire_all()
    return session.execute(select(Alert.kind, Alert.resolved_at.is_not(None)).where(
        Alert.kind == "message_failed").order_by(Alert.id)).all()


def next_scan_due():
    with new_session() as s:
        return s.scalar(select(Lock.until).where(Lock.name == "scan:poller"))


def test_an_outage_is_one_collection_error_once_the_retries_give_up(
        poller, runner, clock, remote, session, tmp_path):
    """The poller's collection retry policy: three more tries at 15, 30 and 60 s (each
    the sooner of that and the next scan), then the Collection error; resolved when
    the server is back."""
    server = SshServer(tmp_path / "sshd")
    try:
        directory = server.directory("in")
        poller(server=server, remote_directory=str(directory), polling_interval=300)
        put(server, directory, "acme/o.xml", b"during the outage")
        scan(runner, clock)
        server.stop()
        for delay in (15, 30, 60):
            started = clock()
            report = runner.scan("poller")
            assert "error class connection" in report.reason
            assert report.retry_at == started + timedelta(seconds=delay)
            assert next_scan_due() == started + timedelta(seconds=delay)
            assert collection_errors(session) == [] and alerts(session) == []
            clock.advance(delay)
        report = runner.scan("poller")
        assert report.retry_at is None
        assert next_scan_due() == clock() + timedelta(seconds=300)  # the schedule
        [(message_id, status, text)] = collection_errors(session)
        assert "127.0.0.1" in text and "(4 failed fetches since" in text
        assert "attempts used up (4)" in text
        assert alerts(session) == [("message_failed", False)]
        clock.advance(300)
        scan(runner, clock)  # counted on the episode's message
        assert "(5 failed fetches since" in collection_errors(session)[0][2]
        assert (directory / "acme/o.xml").exists()

        server.start()
        scan(runner, clock, 2)
        assert alerts(session) == [("message_failed", True)]
        assert [r[2] for r in messages(session)] == [None, "o.xml"]
        assert not (directory / "acme/o.xml").exists()
        assert session.scalars(select(HistoryLine.type).where(
            HistoryLine.message_id == message_id)).all()[-1] == "collection_recovered"
    finally:
        server.close()


def test_a_short_outage_records_nothing_and_the_instance_policy_overrides(
        poller, runner, clock, remote, session, hub, tmp_path):
    """Two failed scans and then a good one: no message, no alert; the next outage is
    counted from one again. With the instance's own policy (no retry), the first failed
    scan is recorded at once."""
    server = SshServer(tmp_path / "sshd")
    try:
        directory = server.directory("in")
        poller(server=server, remote_directory=str(directory))
        server.stop()
        scan(runner, clock, 2)
        server.start()
        assert runner.scan("poller").retry_at is None
        server.stop()
        scan(runner, clock, 3)
        assert collection_errors(session) == [] and alerts(session) == []

        save_instance(session, hub.registry, {"retry_policy": {"max_attempts": 1}},
                      existing=get_instance(session, "poller"), actor="tests")
        session.commit()
        server.start()
        scan(runner, clock)
        server.stop()
        scan(runner, clock)
        [(_id, _status, text)] = collection_errors(session)
        assert "failed fetches" not in text  # the first failure of its episode
        assert alerts(session) == [("message_failed", False)]
    finally:
        server.close()


def test_a_changed_host_key_is_refused_before_any_login(poller, runner, clock, session,
                                                        tmp_path):
    server = SshServer(tmp_path / "sshd")
    try:
        directory = server.directory("in")
        poller(server=server, remote_directory=str(directory))
        server.new_host_key()
        put(server, directory, "acme/o.xml")
        log_before = server.log.read_text()
        report = scan(runner, clock, 2)
        assert "host key mismatch" in report.reason
        assert "error class host_key" in report.reason
        [(_id, _status, text)] = collection_errors(session)
        assert f"offered {server.fingerprint()}" in text
        assert (directory / "acme/o.xml").exists() and count(session, Message) == 1
        time.sleep(0.5)  # sshd's lines of the refused connections written
        since = server.log.read_text()[len(log_before):]
        assert "Connection from 127.0.0.1" in since
        assert "password" not in since and "Accepted" not in since, since
    finally:
        server.close()


# --- probe, configuration, host-key actions --------------------------------------------

def test_the_probe_connects_and_stats_the_directory(sshd, remote):
    config = {**sshd.connection(), "remote_directory": str(remote), "to": "acme"}
    assert SftpPoller("p", config).probe() is True
    with pytest.raises(SftpError, match="does not exist"):
        SftpPoller("p", {**config, "remote_directory": f"{remote}/missing"}).probe()
    with pytest.raises(SftpError) as refused:
        SftpPoller("p", {**config, "port": 1}).probe()
    assert refused.value.error_class == "connection"


def test_move_needs_an_archive_outside_the_remote_directory(sshd):
    config = {**sshd.connection(), "remote_directory": "/data/in", "after": "move",
              "to": "acme"}
    assert SftpPoller.config_problems(config) == {
        "archive_directory": "required to move files"}
    assert "outside" in SftpPoller.config_problems(
        {**config, "archive_directory": "/data/in/done"})["archive_directory"]
    assert SftpPoller.config_problems({**config, "archive_directory": "/data/done"}) == {}
    assert "host_key" in SftpPoller.config_problems({**config, "host_key": ""})


def test_the_instance_fetches_and_pins_the_servers_host_key(api, sshd, hub, tmp_path):
    wrong = keygen(tmp_path / "wrong", "ed25519").with_suffix(".pub").read_text()
    hub.parties()
    hub.instance("pull", "sftp_poller", config={**sshd.connection(host_key=wrong),
                                                "remote_directory": "/tmp/in", "to": "acme"})
    base = "/api/v1/plugins/configs/pull/actions"
    fetched = api.post(f"{base}/fetch_host_key", json={})
    assert fetched.status_code == 200
    assert fetched.get_json()["fingerprint"] == sshd.fingerprint()
    assert api.post(f"{base}/pin_host_key", json={
        "fingerprint": "SHA256:" + "B" * 43}).status_code == 422
    assert api.post(f"{base}/pin_host_key", json={
        "fingerprint": sshd.fingerprint()}).status_code == 200
    config = api.get("/api/v1/plugins/configs/pull").get_json()["config"]
    assert config["host_key"] == sshd.host_key
