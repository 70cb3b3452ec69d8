"""The file_writer target through the engine: dispatch, claim, attempt, settle.

Each test stores a message from a manual source routed to a file_writer instance and
drains the writer with the TargetRunner, then checks what a user sees: the file's bytes,
the delivery state, the message status, the history text and the alerts."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import os
import stat
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from b2bhub.engine import operator
from b2bhub.engine.dispatch import NewMessage, store_and_dispatch
from b2bhub.engine.machine import claiming, recovery
from b2bhub.engine.runner import TargetRunner
from b2bhub.models import Alert, Delivery, HistoryLine, Message
from b2bhub.plugin import DeliveryInfo
from b2bhub.plugin.registry import PluginRegistry
from b2bhub.runtime.hub import new_session
from b2bhub.services.errors import ServiceError
from plugins.file_writer import FileWriter
from tests.enginekit import Clock

BODY = b"<order id='1'>\x00\xffbinary too</order>\n"


@pytest.fixture(autouse=True)
def _file_writer(registry):
    registry.register(FileWriter)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def out(tmp_path) -> Path:
    return tmp_path / "out"


@pytest.fixture
def writer(hub, out):
    """Parties, a manual source and a writer routed from it; returns a setter that
    (re)configures the writer."""
    hub.parties()
    hub.instance("inbox", "manual_source")

    def configure(**config):
        row = hub.instance("writer", "file_writer",
                           config={"base_directory": str(out), **config})
        hub.route("inbox", "*", "*", "writer")
        return row
    return configure


def drain(hub, registry, clock) -> None:
    TargetRunner(new_session, registry, hub.store, "test-worker", clock=clock).drain(
        "writer", budget=30)


def state(session, message) -> tuple[str, str, int]:
    """(delivery state, message status, attempts) as a user sees them."""
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
    """Every file below ``path`` but the test's payload store."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")
                  if not p.is_dir() and "payloads" not in p.relative_to(path).parts[:1])


# --- writing --------------------------------------------------------------------------

def test_writes_the_payload_byte_for_byte_and_says_which_file(hub, session, registry,
                                                               clock, writer, out):
    writer()
    message = hub.message(source="inbox", body=BODY, filename="order1.xml", now=clock())
    drain(hub, registry, clock)

    assert (out / "order1.xml").read_bytes() == BODY
    assert files_below(out) == ["order1.xml"]  # no temporary file left behind
    assert state(session, message) == ("delivered", "delivered", 1)
    assert history(session, message)[-1] == (
        f"writer: attempt 1 delivered: wrote order1.xml ({len(BODY)} bytes)")


def test_falls_back_to_the_message_id_and_makes_subdirectories(hub, session, registry,
                                                                clock, writer, out):
    writer(filename_pattern="{from}/{date}/{original_filename|message_id}")
    message = hub.message(source="inbox", body=BODY, filename=None, now=clock())
    drain(hub, registry, clock)

    relative = f"acme/{clock.now:%Y%m%d}/{message.id}"
    assert (out / relative).read_bytes() == BODY
    assert history(session, message)[-1].endswith(f"wrote {relative} ({len(BODY)} bytes)")


def test_a_hostile_original_filename_stays_below_the_base_directory(hub, session, registry,
                                                                     clock, writer, out):
    writer(filename_pattern="{to}/{original_filename}")
    message = hub.message(source="inbox", body=BODY, filename="../../../escaped:\x1b.xml",
                          now=clock())
    drain(hub, registry, clock)

    assert files_below(out.parent) == ["out/mycompany/.._.._.._escaped__.xml"]
    assert state(session, message)[0] == "delivered"


def test_the_chosen_payload_stage_is_written(hub, session, registry, clock, writer, out):
    writer(payload_stage="raw")
    raw, unpacked = hub.store.put(b"raw on the wire"), hub.store.put(b"the document")
    message = store_and_dispatch(session, NewMessage(
        source="inbox", from_party="acme", to_party="mycompany", original_filename="in.edi",
        stages={"raw": (raw.digest, raw.size), "unpacked": (unpacked.digest, unpacked.size)}),
        clock())
    session.commit()
    drain(hub, registry, clock)

    assert (out / "in.edi").read_bytes() == b"raw on the wire"
    assert state(session, message)[0] == "delivered"


# --- failures at once -----------------------------------------------------------------

def test_an_existing_different_file_fails_at_once_when_overwrite_is_off(
        hub, session, registry, clock, writer, out):
    writer()
    out.mkdir()
    (out / "order1.xml").write_bytes(b"somebody else's file")
    message = hub.message(source="inbox", body=BODY, filename="order1.xml", now=clock())
    drain(hub, registry, clock)

    assert (out / "order1.xml").read_bytes() == b"somebody else's file"
    assert files_below(out) == ["order1.xml"]
    assert state(session, message) == ("failed", "error", 1)
    assert history(session, message)[-1] == (
        "writer: attempt 1 failed: order1.xml exists and overwrite is off")
    assert open_alerts(session, message) == ["message_failed"]


def test_overwrite_on_replaces_an_existing_file(hub, session, registry, clock, writer, out):
    writer(overwrite=True)
    out.mkdir()
    (out / "order1.xml").write_bytes(b"yesterday's order, longer than today's" * 3)
    message = hub.message(source="inbox", body=BODY, filename="order1.xml", now=clock())
    drain(hub, registry, clock)

    assert (out / "order1.xml").read_bytes() == BODY
    assert files_below(out) == ["order1.xml"]
    assert state(session, message)[0] == "delivered"


def test_a_missing_stage_fails_at_once_with_the_reason_in_the_history(
        hub, session, registry, clock, writer, out):
    writer(payload_stage="sent")
    message = hub.message(source="inbox", body=BODY, now=clock())  # unpacked only
    drain(hub, registry, clock)

    assert state(session, message) == ("failed", "error", 1)
    assert history(session, message)[-1] == (
        "writer: attempt 1 failed: the message has no 'sent' payload stage")
    assert open_alerts(session, message) == ["message_failed"]
    assert not out.exists() or files_below(out) == []


def test_a_placeholder_without_a_value_fails_at_once(hub, session, registry, clock, writer,
                                                      out):
    writer(filename_pattern="report_{external_id}.dat")
    message = hub.message(source="inbox", body=BODY, now=clock())
    drain(hub, registry, clock)

    assert state(session, message) == ("failed", "error", 1)
    assert "placeholder {external_id} has no value" in history(session, message)[-1]


def test_a_symbolic_link_out_of_the_base_directory_is_never_followed(
        hub, session, registry, clock, writer, out, tmp_path):
    writer(filename_pattern="{to}/{original_filename}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out.mkdir()
    (out / "mycompany").symlink_to(elsewhere)
    message = hub.message(source="inbox", body=BODY, filename="x.xml", now=clock())
    drain(hub, registry, clock)

    assert list(elsewhere.iterdir()) == []
    assert state(session, message) == ("failed", "error", 1)
    assert "mycompany leads out of the base directory" in history(session, message)[-1]


def test_a_symbolic_link_inside_the_base_directory_is_followed(
        hub, session, registry, clock, writer, out):
    writer(filename_pattern="{to}/{original_filename}")
    (out / "shared").mkdir(parents=True)
    (out / "mycompany").symlink_to(out / "shared")
    hub.message(source="inbox", body=BODY, filename="x.xml", now=clock())
    drain(hub, registry, clock)

    assert (out / "shared" / "x.xml").read_bytes() == BODY


# --- the re-attempt that finds its file -----------------------------------------------

def test_a_reattempt_finding_exactly_the_payload_counts_as_written(
        hub, session, registry, clock, writer, out):
    """Attempt 1 wrote the file, then its worker died before settling; the lease expires
    and attempt 2 finds the file holding the payload."""
    writer()
    message = hub.message(source="inbox", body=BODY, filename="order1.xml", now=clock())
    claims = claiming.claim(session, "writer", "dead-worker", clock(), 1, 300)
    session.commit()
    out.mkdir()
    (out / "order1.xml").write_bytes(BODY)
    clock.advance(301)
    assert recovery.expire_leases(session, clock(), 10) == 1
    session.commit()
    drain(hub, registry, clock)

    assert [c.attempt for c in claims] == [1]
    assert state(session, message) == ("delivered", "delivered", 2)
    assert history(session, message)[-1] == (
        f"writer: attempt 2 delivered: order1.xml already holds this payload "
        f"({len(BODY)} bytes); counted as written")
    assert files_below(out) == ["order1.xml"]


def test_a_reattempt_finding_other_content_of_the_same_size_fails(
        hub, session, registry, clock, writer, out):
    writer()
    message = hub.message(source="inbox", body=BODY, filename="order1.xml", now=clock())
    claiming.claim(session, "writer", "dead-worker", clock(), 1, 300)
    session.commit()
    out.mkdir()
    (out / "order1.xml").write_bytes(BODY.upper())  # same size, other bytes
    clock.advance(301)
    recovery.expire_leases(session, clock(), 10)
    session.commit()
    drain(hub, registry, clock)

    assert state(session, message) == ("failed", "error", 2)
    assert (out / "order1.xml").read_bytes() == BODY.upper()


def test_a_first_attempt_finding_identical_content_fails_as_the_seed_says(
        hub, session, registry, clock, writer, out):
    """Only a re-attempt may count a file it finds as its own."""
    writer()
    out.mkdir()
    (out / "order1.xml").write_bytes(BODY)
    message = hub.message(source="inbox", body=BODY, filename="order1.xml", now=clock())
    drain(hub, registry, clock)

    assert state(session, message) == ("failed", "error", 1)


# --- failures that are retried --------------------------------------------------------

def test_a_storage_failure_is_retried_after_30s_2min_10min_then_fails(
        hub, session, registry, clock, writer, tmp_path):
    """The base directory cannot be made: its parent is a regular file (ENOTDIR). Tests
    run as root, which permission bits do not stop; a file in the way stops root too, as
    a share that is not mounted over its mount point would."""
    blocker = tmp_path / "blocker"
    blocker.write_bytes(b"not a directory")
    writer(base_directory=str(blocker / "out"))
    message = hub.message(source="inbox", body=BODY, now=clock())

    for attempt, delay in enumerate((30, 120, 600), 1):
        drain(hub, registry, clock)
        assert state(session, message) == ("retrying", "retrying", attempt)
        assert _due(session, message) == clock.now + timedelta(seconds=delay)
        clock.advance(delay - 1)
        drain(hub, registry, clock)  # not due yet: nothing is attempted
        assert state(session, message)[2] == attempt
        clock.advance(1)
    drain(hub, registry, clock)

    assert state(session, message) == ("failed", "error", 4)
    lines = history(session, message)
    failures = [line for line in lines if " failed: " in line]
    assert len(failures) == 4
    assert all(f"could not write order.edi below {blocker / 'out'}: Not a directory" in line
               for line in failures)
    assert lines[-1].endswith("(attempts used up (4))")
    assert open_alerts(session, message) == ["message_failed"]


def test_a_write_whose_directory_cannot_be_made_durable_is_not_recorded_as_delivered(
        hub, session, registry, clock, writer, out, monkeypatch):
    """The directory is fsynced once per claimed batch, before the settlement; when that
    fails (the disk reports an I/O error) the batch's writes are storage errors, and the
    retry finds each file already holding its payload."""
    writer()
    messages = [hub.message(source="inbox", body=BODY + bytes([n]), filename=f"o{n}.xml",
                            now=clock()) for n in range(3)]
    fsync = os.fsync

    def failing_on_directories(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "Input/output error")
        return fsync(fd)
    monkeypatch.setattr(os, "fsync", failing_on_directories)
    drain(hub, registry, clock)
    for message in messages:
        assert state(session, message) == ("retrying", "retrying", 1)
        assert history(session, message)[-1].startswith(
            f"writer: attempt 1 failed: could not make the write durable below {out}: "
            "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    clock.advance(30)
    drain(hub, registry, clock)
    for n, message in enumerate(messages):
        assert state(session, message) == ("delivered", "delivered", 2)
        assert history(session, message)[-1].endswith(
            f"o{n}.xml already holds this payload ({len(BODY) + 1} bytes); counted as "
            "written")


def test_a_batch_fsyncs_each_directory_once_before_its_settlement(
        hub, session, registry, clock, writer, out, monkeypatch):
    """Four messages are one claimed batch (Max Concurrent Deliveries 4)."""
    writer(filename_pattern="{original_filename}")
    for n in range(4):
        hub.message(source="inbox", body=BODY + bytes([n]), filename=f"o{n}.xml",
                    now=clock())
    synced = []
    fsync = os.fsync

    def recording(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.append(os.fstat(fd).st_ino)
        return fsync(fd)
    monkeypatch.setattr(os, "fsync", recording)
    runner = TargetRunner(new_session, registry, hub.store, "test-worker", clock=clock)
    runner.settle_window = 60  # one settlement for the batch, however slow the machine
    runner.drain("writer", budget=30)

    assert sorted(p.name for p in out.iterdir()) == [f"o{n}.xml" for n in range(4)]
    assert synced == [out.stat().st_ino]


def test_redeliver_after_the_directory_is_fixed_writes_the_file(
        hub, session, registry, clock, writer, tmp_path):
    """Failed once the schedule is used up; the operator fixes the directory and
    redelivers: the next attempt writes the file, the message is Delivered, its
    ``message_failed`` alert resolved, and the history names the operator."""
    blocker = tmp_path / "blocker"
    blocker.write_bytes(b"not a directory")
    writer(base_directory=str(blocker / "out"))
    message = hub.message(source="inbox", body=BODY, filename="order1.xml", now=clock())
    for delay in (30, 120, 600):
        drain(hub, registry, clock)
        clock.advance(delay)
    drain(hub, registry, clock)
    assert state(session, message) == ("failed", "error", 4)
    assert open_alerts(session, message) == ["message_failed"]

    blocker.unlink()
    blocker.mkdir()
    clock.advance(60)
    delivery_id = session.scalar(select(Delivery.id).where(Delivery.message_id == message.id))
    operator.redeliver(session, delivery_id, "alice", clock())
    session.commit()
    assert state(session, message) == ("queued", "received", 4)
    drain(hub, registry, clock)

    assert (blocker / "out" / "order1.xml").read_bytes() == BODY
    assert files_below(blocker) == ["out/order1.xml"]
    assert state(session, message) == ("delivered", "delivered", 5)
    assert open_alerts(session, message) == []
    assert session.execute(select(HistoryLine.type, HistoryLine.actor, HistoryLine.text)
                           .where(HistoryLine.message_id == message.id,
                                  HistoryLine.actor == "alice")
                           .order_by(HistoryLine.id)).all() == [
        ("redeliver_requested", "alice", "alice asked to redeliver the delivery to writer"),
        ("delivery_changed", "alice", "writer: queued (redeliver)"),
        ("status_changed", "alice", "Error → Received")]
    assert history(session, message)[-2:] == [
        "writer: attempt 5 started",
        f"writer: attempt 5 delivered: wrote order1.xml ({len(BODY)} bytes)"]


def _due(session, message):
    return session.scalar(select(Delivery.due_at).where(Delivery.message_id == message.id))


def test_a_payload_that_fails_its_checksum_is_retried_and_leaves_no_file(
        hub, session, registry, clock, writer, out):
    writer()
    message = hub.message(source="inbox", body=BODY, filename="order1.xml", now=clock())
    digest = hashlib.sha256(BODY).hexdigest()
    hub.store.path(digest).write_bytes(BODY.upper())  # rotted on disk
    drain(hub, registry, clock)

    assert state(session, message) == ("retrying", "retrying", 1)
    assert "could not read the payload" in history(session, message)[-1]
    assert files_below(out) == []


# --- large payloads -------------------------------------------------------------------

class Generated:
    """A stream of ``size`` pseudo-random bytes, made as it is read."""

    def __init__(self, size: int):
        self.left, self.counter = size, 0

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        out = bytearray()
        while len(out) < n:
            self.counter += 1
            out += hashlib.sha512(self.counter.to_bytes(8, "big")).digest() * 64
        self.left -= n
        return bytes(out[:n])


def test_a_100_mb_payload_is_streamed_with_little_memory(hub, session, registry, clock,
                                                         writer, out):
    writer()
    size = 100 * 1024 * 1024
    stored = hub.store.put(Generated(size))
    message = store_and_dispatch(session, NewMessage(
        source="inbox", from_party="acme", to_party="mycompany", original_filename="big.bin",
        stages={"unpacked": (stored.digest, stored.size)}), clock())
    session.commit()

    tracemalloc.start()
    try:
        drain(hub, registry, clock)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert state(session, message)[0] == "delivered"
    assert peak < 10 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB"
    assert os.path.getsize(out / "big.bin") == size
    assert _sha256_file(out / "big.bin") == stored.digest


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# --- configuration --------------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "reason"), [
    ("{to}/{nope}", "unknown placeholder {nope}"),
    ("/srv/{message_id}", "absolute"),
    ("../{message_id}", "'..' element"),
    ("a//{message_id}", "empty element"),
])
def test_a_bad_pattern_is_refused_when_the_configuration_is_saved(hub, out, pattern,
                                                                  reason):
    with pytest.raises(ServiceError) as caught:
        hub.instance("writer", "file_writer", config={"base_directory": str(out),
                                                      "filename_pattern": pattern})
    assert reason in caught.value.details["config"]["filename_pattern"]


def test_the_configuration_defaults_and_the_relative_base_refused(hub, out):
    row = hub.instance("writer", "file_writer", config={"base_directory": str(out)})
    assert row.config == {"base_directory": str(out),
                          "filename_pattern": "{original_filename|message_id}",
                          "overwrite": False, "payload_stage": "unpacked",
                          "openpgp_encrypt": False, "openpgp_sign": False}
    with pytest.raises(ServiceError) as caught:
        hub.instance("writer2", "file_writer", config={"base_directory": "out"})
    assert caught.value.details["config"]["base_directory"] == "must be an absolute path"
    with pytest.raises(ServiceError):
        hub.instance("writer3", "file_writer", config={"base_directory": str(out),
                                                       "payload_stage": "receipt"})


def test_file_writer_is_found_through_its_entry_point():
    found = PluginRegistry()
    found.load()
    assert found.get("file_writer") is FileWriter
    assert "file_writer" not in found.failures
    assert FileWriter.default_retry_policy.schedule == (30, 120, 600)


class AppearsWhileWriting:
    """A payload reader whose stream, once opened, lets another program create the
    destination file: the race between the existence check and the rename."""

    def __init__(self, body: bytes, destination: Path):
        self.body, self.destination = body, destination

    def stages(self):
        return ("unpacked",)

    def size(self, stage):
        return len(self.body)

    def digest(self, stage):
        return hashlib.sha256(self.body).hexdigest()

    def open(self, stage):
        self.destination.write_bytes(b"written by someone else meanwhile")
        return io.BytesIO(self.body)


def test_overwrite_off_never_clobbers_a_file_that_appears_during_the_write(
        message_info, out):
    out.mkdir()
    reader = AppearsWhileWriting(BODY, out / "order1.xml")
    plugin = FileWriter("writer", {"base_directory": str(out)})
    [outcome] = plugin.before_settle([plugin.deliver(message_info, reader, None)])

    assert outcome.kind == "failed"
    assert outcome.text == "order1.xml exists and overwrite is off"
    assert (out / "order1.xml").read_bytes() == b"written by someone else meanwhile"
    assert files_below(out) == ["order1.xml"]


@pytest.fixture
def message_info(clock):
    return DeliveryInfo(
        delivery_id=1, message_id=1, target="writer", attempt=1, source="inbox",
        from_party="acme", to_party="mycompany", direction="inbound",
        original_filename="order1.xml", external_id=None, correlation_id=None,
        sequence_key=None, created_at=clock(), payload_stages=("unpacked",))


class Body(AppearsWhileWriting):
    """A payload reader of ``body`` that lets nobody else write anything."""

    def __init__(self, body: bytes):
        super().__init__(body, None)

    def open(self, stage):
        return io.BytesIO(self.body)


def _info(message_info, n: int) -> DeliveryInfo:
    return dataclasses.replace(message_info, delivery_id=n, message_id=n,
                               original_filename=f"order{n}.xml")


def test_a_file_appears_under_its_name_only_once_its_bytes_are_durable(
        message_info, out, monkeypatch):
    """The data of a batch's writes is made durable, then the files are moved into
    place, then their directory is fsynced: a crash can never leave a name whose bytes
    were not yet on disk."""
    import plugins.file_writer as module
    events = []
    real_syncfs, real_fsync = module.syncfs, os.fsync

    def data_synced(fd):
        events.append(("data", sorted(p.name for p in out.iterdir()
                                      if not p.name.startswith("."))))
        return real_syncfs(fd)

    def fsynced(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            events.append(("names", sorted(p.name for p in out.iterdir())))
        return real_fsync(fd)
    monkeypatch.setattr(module, "syncfs", data_synced)
    monkeypatch.setattr(os, "fsync", fsynced)
    plugin = FileWriter("writer", {"base_directory": str(out)})
    outcomes = [plugin.deliver(_info(message_info, n), Body(BODY + bytes([n])), None)
                for n in (1, 2)]
    assert [o.kind for o in outcomes] == ["delivered", "delivered"]
    assert events == [] and not (out / "order1.xml").exists()

    settled = plugin.before_settle(outcomes)

    assert settled == outcomes
    assert events == [("data", []), ("names", ["order1.xml", "order2.xml"])]
    assert (out / "order1.xml").read_bytes() == BODY + b"\x01"
    assert (out / "order2.xml").read_bytes() == BODY + b"\x02"


def test_a_write_whose_data_cannot_be_made_durable_is_never_put_in_place(
        message_info, out, monkeypatch):
    import plugins.file_writer as module

    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(module, "syncfs", failing)
    plugin = FileWriter("writer", {"base_directory": str(out)})
    [outcome] = plugin.before_settle([plugin.deliver(message_info, Body(BODY), None)])

    assert (outcome.kind, outcome.error_class) == ("error", "storage")
    assert outcome.text == (f"could not make the write durable below {out}: "
                            "Input/output error")
    assert files_below(out) == []


def test_without_syncfs_each_written_file_is_fsynced_before_it_is_moved(
        message_info, out, monkeypatch):
    import plugins.file_writer as module
    synced = []
    fsync = os.fsync

    def recording(fd):
        if stat.S_ISREG(os.fstat(fd).st_mode):
            synced.append(sorted(p.name for p in out.iterdir()
                                 if not p.name.startswith(".")))
        return fsync(fd)
    monkeypatch.setattr(module, "syncfs", lambda fd: False)
    monkeypatch.setattr(os, "fsync", recording)
    plugin = FileWriter("writer", {"base_directory": str(out)})
    outcomes = plugin.before_settle([
        plugin.deliver(_info(message_info, n), Body(BODY), None) for n in (1, 2, 3)])

    assert [o.kind for o in outcomes] == ["delivered"] * 3
    assert synced == [[], [], []]
    assert files_below(out) == ["order1.xml", "order2.xml", "order3.xml"]


def test_the_temporary_file_of_an_attempt_that_reported_nothing_is_removed(
        message_info, out):
    """An attempt cancelled after its write (the worker's stop grace ran out) has no
    outcome: its file is not put in place and its temporary file goes."""
    plugin = FileWriter("writer", {"base_directory": str(out)})
    plugin.deliver(_info(message_info, 1), Body(BODY), None)  # outcome lost
    kept = plugin.deliver(_info(message_info, 2), Body(BODY), None)

    assert plugin.before_settle([kept]) == [kept]
    assert files_below(out) == ["order2.xml"]


def test_two_writes_of_one_batch_to_one_name_the_second_fails(message_info, out):
    plugin = FileWriter("writer", {"base_directory": str(out)})
    first = plugin.deliver(message_info, Body(BODY), None)
    second = plugin.deliver(dataclasses.replace(message_info, delivery_id=2),
                            Body(BODY.upper()), None)
    outcomes = plugin.before_settle([first, second])

    assert [o.kind for o in outcomes] == ["delivered", "failed"]
    assert outcomes[1].text == "order1.xml exists and overwrite is off"
    assert (out / "order1.xml").read_bytes() == BODY
    assert files_below(out) == ["order1.xml"]


# --- temporary files left by a killed worker ----------------------------------------

def hidden(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("."))


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_a_killed_workers_temporary_file_is_removed_by_a_later_write(message_info, out):
    """A worker killed between its write and its move leaves its hidden temporary file;
    the re-attempt (another process) writes the file and removes the leftover once it
    is older than an hour. Fresh temporary files (attempts under way elsewhere) and
    anything not named as the writer names them stay."""
    killed = FileWriter("writer", {"base_directory": str(out)})
    killed.deliver(message_info, Body(BODY), None)  # killed before before_settle
    [leftover] = hidden(out)
    assert not (out / "order1.xml").exists()
    under_way = out / ".b2bhub-0123456789abcdef.tmp"
    under_way.write_bytes(b"another worker's attempt, just written")
    strangers = [out / ".b2bhub-not-ours.tmp", out / "report.tmp", out / ".b2bhub-x"]
    for path in strangers:
        path.write_bytes(b"not the writer's")
        age(path, 7200)
    (out / ".b2bhub-fedcba9876543210.tmp").mkdir()  # not a regular file
    age(out / ".b2bhub-fedcba9876543210.tmp", 7200)
    os.symlink("/nonexistent", out / ".b2bhub-00000000000000ff.tmp")
    age(out / ".b2bhub-00000000000000ff.tmp", 7200)
    age(out / leftover, 3700)

    again = FileWriter("writer", {"base_directory": str(out)})
    [outcome] = again.before_settle([again.deliver(
        dataclasses.replace(message_info, attempt=2), Body(BODY), None)])

    assert outcome.kind == "delivered"
    assert (out / "order1.xml").read_bytes() == BODY
    assert leftover not in hidden(out)
    assert hidden(out) == sorted([under_way.name, ".b2bhub-00000000000000ff.tmp",
                                  ".b2bhub-fedcba9876543210.tmp", ".b2bhub-not-ours.tmp",
                                  ".b2bhub-x"])
    assert all(p.exists() for p in strangers)


def test_a_leftover_younger_than_an_hour_stays(message_info, out):
    killed = FileWriter("writer", {"base_directory": str(out)})
    killed.deliver(message_info, Body(BODY), None)
    [leftover] = hidden(out)
    age(out / leftover, 3500)
    again = FileWriter("writer", {"base_directory": str(out)})
    again.before_settle([again.deliver(_info(message_info, 2), Body(BODY), None)])
    assert hidden(out) == [leftover]


def test_a_directory_is_looked_at_for_leftovers_once_an_hour_per_process(
        message_info, out, monkeypatch):
    import plugins.file_writer as module
    plugin = FileWriter("writer", {"base_directory": str(out)})
    plugin.before_settle([plugin.deliver(_info(message_info, 1), Body(BODY), None)])
    leftover = out / ".b2bhub-0123456789abcdef.tmp"
    leftover.write_bytes(b"left by a killed worker")
    age(leftover, 7200)
    plugin.before_settle([plugin.deliver(_info(message_info, 2), Body(BODY), None)])
    assert leftover.exists()  # looked at less than an hour ago
    later = time.monotonic() + module.STALE_TEMP_CHECK_SECONDS + 1
    monkeypatch.setattr(module.time, "monotonic", lambda: later)
    plugin.before_settle([plugin.deliver(_info(message_info, 3), Body(BODY), None)])
    assert not leftover.exists()
    assert files_below(out) == ["order1.xml", "order2.xml", "order3.xml"]
