"""sftp_poller with real worker and beat processes against a real OpenSSH server (issue
39, "Must show"): a worker killed (SIGKILL) in the middle of downloading a 1 GB file,
after which another worker takes it whole, once, in under 150 MB of memory; and the
server stopped and started in the middle of a run of files: a collection error while it
is down, nothing lost, every file taken once after.

The test process writes the files on the server's disk, kills processes and reads the
outcome: the messages, their payloads, the alerts and the server's directory."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.engine.settings import DeliverySettings, save_settings
from b2bhub.models import Alert, Message
from plugins.sftp.poller import SftpPoller
from tests.procs import wait_until

pytestmark = pytest.mark.processes
MB = 1024 * 1024


@pytest.fixture
def poller(hub, session, registry, sshd, remote):
    """Parties and an sftp_poller on ``remote`` polled every second."""
    registry.register(SftpPoller)
    save_settings(session, DeliverySettings(scan_lease_seconds=5))
    session.commit()
    hub.parties(organizations=("mycompany",), partners=("acme",))
    hub.instance("pull", "sftp_poller", config={
        **sshd.connection(), "remote_directory": str(remote), "to": "acme",
        "polling_interval": 1, "settle_seconds": 1, "connect_timeout": 3,
        "operation_timeout": 10})


def rows(stmt) -> list:
    with Session(db.engine) as s:
        return s.execute(stmt).all()


def taken() -> list[tuple]:
    return rows(select(Message.original_filename, Message.sha256, Message.size).where(
        Message.status != "collection_error").order_by(Message.id))


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def write_pattern(path: Path, size: int) -> str:
    """``size`` bytes of a repeating pseudo-random block; their sha256."""
    block, digest = hashlib.shake_256(b"sftp-poller").digest(MB + 7), hashlib.sha256()
    with open(path, "wb") as out:
        left = size
        while left:
            piece = block[:min(left, len(block))]
            out.write(piece)
            digest.update(piece)
            left -= len(piece)
    os.chmod(path, 0o644)
    return digest.hexdigest()


def test_kill_9_mid_download_of_1_gb_then_taken_once_in_under_150_mb(
        procs, hub, poller, remote):
    """A worker is killed while it downloads a 1 GB file: nothing is committed and the
    file stays; after the scan lease the next worker takes it whole, once, and neither
    it nor beat ever held more than 150 MB."""
    first = procs.worker()
    beat = procs.beat()
    (remote / "small.txt").write_bytes(b"a small one first")
    wait_until(lambda: len(taken()) == 1, 60, "the small one taken")
    size = int(os.environ.get("SFTP_POLLER_BIG_MB", "1024")) * MB
    digest = write_pattern(remote / "huge.bin", size)
    temp = Path(hub.store.root) / "tmp"

    def downloading():
        return [p for p in temp.glob("*") if p.is_file() and p.stat().st_size > 50 * MB]
    wait_until(downloading, 120, "the download under way")
    first.signal(signal.SIGKILL)
    assert first.wait_exit(10) == -signal.SIGKILL
    assert len(taken()) == 1 and (remote / "huge.bin").exists()

    second = procs.worker()
    before = peak_rss(second.pid)
    started = time.monotonic()
    wait_until(lambda: not (remote / "huge.bin").exists(), 300, "taken by the next worker")
    print(f"{size / MB:.0f} MB taken in {time.monotonic() - started:.1f} s; worker peak "
          f"RSS {before / MB:.1f} MB before, {peak_rss(second.pid) / MB:.1f} MB after")
    assert taken()[1:] == [("huge.bin", digest, size)]  # whole, and once
    for proc in (second, beat):
        assert peak_rss(proc.pid) < 150 * MB, f"{proc.name}: {peak_rss(proc.pid) / MB:.0f} MB"


def test_the_server_stopped_and_started_mid_run_loses_nothing(
        procs, hub, poller, remote, sshd):
    bodies = {f"m{n:03d}.xml": os.urandom(10_000 + n) for n in range(40)}
    names = list(bodies)
    procs.worker()
    procs.worker()
    procs.beat()
    for name in names[:20]:
        (remote / name).write_bytes(bodies[name])
    wait_until(lambda: len(taken()) >= 5, 60, "the first files taken")
    sshd.stop()
    try:
        for name in names[20:]:
            (remote / name).write_bytes(bodies[name])
        wait_until(lambda: rows(select(Message.id).where(
            Message.status == "collection_error")), 60, "a collection error")
    finally:
        sshd.start()
    wait_until(lambda: len(taken()) == 40 and not os.listdir(remote), 120,
               "every file taken after the outage")
    got = taken()
    assert sorted(name for name, _digest, _size in got) == sorted(bodies)  # each once
    for name, digest, _size in got:
        assert hub.store.open(digest).read() == bodies[name]
    [(status_text,)] = rows(select(Message.status_text).where(
        Message.status == "collection_error"))
    assert "error class connection" in status_text
    wait_until(lambda: rows(select(func.count()).select_from(Alert).where(
        Alert.kind == "message_failed", Alert.resolved_at.is_(None)))[0][0] == 0, 30,
        "the collection error's alert resolved")
