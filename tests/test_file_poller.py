"""The file poller in one process with the engine: pickup, completeness, unroutable
files, undescribed places, symbolic links, the scan lease, the scheduler and a death
between the commit and the removal."""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from b2bhub.engine import intake, scans
from b2bhub.engine.scans import ScanLease, SourceRunner, due_scans
from b2bhub.engine.settings import DeliverySettings, save_settings
from b2bhub.models import (
    Alert,
    Delivery,
    HistoryLine,
    Lock,
    Message,
    PluginInstance,
    PollerPickup,
)
from b2bhub.payloads import store as payloads
from b2bhub.payloads.store import PayloadCorrupt
from b2bhub.plugin.registry import PluginRegistry
from b2bhub.runtime.hub import new_session
from b2bhub.services.errors import ServiceError
from plugins import file_poller
from plugins.file_poller import FilePoller

T0 = datetime(2030, 1, 1, 12, 0, 0)


class Clock:
    def __init__(self, now: datetime = T0):
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def registry(registry):
    registry.register(FilePoller)
    return registry


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def base(tmp_path) -> Path:
    return tmp_path / "in"


@pytest.fixture
def poller(hub, base):
    """Make the poller instance ``poller`` with the given configuration."""
    def make(**config):
        hub.parties(organizations=config.pop("organizations", ("mycompany",)),
                    partners=config.pop("partners", ("acme", "globex")))
        config.setdefault("path_pattern", "{to}/{filename}")
        return hub.instance("poller", "file_poller",
                            config={"base_directory": str(base), **config})
    return make


@pytest.fixture
def runner(registry, hub, clock):
    return SourceRunner(new_session, registry, hub.store, "proc-a", clock=clock)


def put(base: Path, relative: str, body: bytes = b"<order/>") -> Path:
    path = base / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    return path


def messages(session) -> list[tuple]:
    session.expire_all()
    return session.execute(select(
        Message.source, Message.from_party, Message.to_party, Message.original_filename,
        Message.direction, Message.sha256).order_by(Message.id)).all()


def count(session, model) -> int:
    session.expire_all()
    return session.scalar(select(func.count()).select_from(model))


@pytest.fixture
def lease(clock):
    """Leases held as other processes would hold them, on sessions closed afterwards."""
    sessions = []

    def make(owner: str) -> ScanLease:
        sessions.append(new_session())
        return ScanLease(sessions[-1], "poller", owner, seconds=30, clock=clock)
    yield make
    for s in sessions:
        s.rollback()
        s.close()


def scan(runner, clock, times: int = 1):
    report = None
    for _ in range(times):
        report = runner.scan("poller")
        clock.advance(10)
    return report


# --- pickup ---------------------------------------------------------------------------

def test_files_under_to_become_messages_and_are_removed(poller, runner, clock, base, hub,
                                                        session, wakeups, record_dir):
    poller()
    hub.instance("writer", "recorder", config={"record_dir": str(record_dir)})
    hub.route("poller", "*", "acme", "writer")
    first = put(base, "acme/order1.xml", b"<order>1</order>")
    second = put(base, "globex/inv 2.txt", b"invoice")

    report = scan(runner, clock)
    assert report.ran and report.messages == []  # a first sighting is not taken
    assert first.exists() and second.exists() and count(session, Message) == 0

    report = scan(runner, clock)
    assert len(report.messages) == 2
    rows = messages(session)
    assert [r[:5] for r in rows] == [
        ("poller", "mycompany", "acme", "order1.xml", "outbound"),
        ("poller", "mycompany", "globex", "inv 2.txt", "outbound")]
    assert hub.store.open(rows[0].sha256).read() == b"<order>1</order>"
    assert hub.store.open(rows[1].sha256).read() == b"invoice"
    assert not first.exists() and not second.exists()
    assert count(session, PollerPickup) == 0
    # routed and woken like any message; the other one is Not routed
    assert session.scalars(select(Delivery.target)).all() == ["writer"]
    assert [t for _, t in wakeups] == ["writer"]
    assert session.scalars(select(Message.status).order_by(Message.id)).all() == [
        "received", "not_routed"]
    assert "order1.xml received from mycompany for acme by poller" in session.scalars(
        select(HistoryLine.text)).all()


def test_captured_from_and_to(poller, runner, clock, base, session):
    poller(path_pattern="outbox/{from}/{to}/{filename}", organizations=("hq", "branch"))
    put(base, "outbox/branch/acme/order1.xml")
    scan(runner, clock, 2)
    assert [r[1:4] for r in messages(session)] == [("branch", "acme", "order1.xml")]


def test_fixed_from_and_to_with_a_file_pattern(poller, runner, clock, base, session):
    poller(path_pattern="{filename}", to="acme", **{"from": "mycompany"},
           file_pattern="*.xml")
    put(base, "a.xml")
    put(base, "b.txt")
    scan(runner, clock, 2)
    assert [r[1:4] for r in messages(session)] == [("mycompany", "acme", "a.xml")]
    assert (base / "b.txt").exists()  # not matching the file pattern: not touched


def test_a_correlation_pattern_captures_the_correlation_id_from_the_file_name(
        poller, runner, clock, base, session):
    poller(path_pattern="{to}/{filename}",
           correlation_pattern=r"^ORDERS_(?P<correlation_id>PO-[0-9]+)(_[0-9]+)?\.xml$")
    put(base, "acme/ORDERS_PO-123_2.xml")
    put(base, "acme/other.xml")  # no match: no correlation id
    scan(runner, clock, 2)
    session.expire_all()
    assert session.execute(select(Message.original_filename, Message.correlation_id)
                           .order_by(Message.original_filename)).all() == [
        ("ORDERS_PO-123_2.xml", "PO-123"), ("other.xml", None)]


def test_without_a_named_group_the_first_group_is_the_correlation_id(
        poller, runner, clock, base, session):
    poller(path_pattern="{to}/{filename}", correlation_pattern=r"inv-(\w+)\.")
    put(base, "acme/inv-A77.txt")
    scan(runner, clock, 2)
    session.expire_all()
    assert session.scalars(select(Message.correlation_id)).all() == ["A77"]


def test_without_a_correlation_pattern_there_is_no_correlation_id(
        poller, runner, clock, base, session):
    poller(path_pattern="{to}/{filename}")
    put(base, "acme/ORDERS_PO-123.xml")
    scan(runner, clock, 2)
    session.expire_all()
    assert session.scalars(select(Message.correlation_id)).all() == [None]


@pytest.mark.parametrize(("pattern", "problem"), [
    ("([", "is not a regular expression"),
    ("PO-[0-9]+", "needs a group"),
])
def test_a_bad_correlation_pattern_is_refused_with_its_reason(pattern, problem):
    from b2bhub.plugin.schema import ConfigError, validate_config
    with pytest.raises(ConfigError) as refused:
        validate_config(FilePoller.config_schema, {
            "base_directory": "/tmp/in", "correlation_pattern": pattern})
    assert problem in refused.value.errors["correlation_pattern"]


def test_a_file_changing_between_scans_is_not_taken(poller, runner, clock, base, session):
    poller()
    path = put(base, "acme/big.xml", b"part one")
    scan(runner, clock)
    with path.open("ab") as out:
        out.write(b", part two")
    os.utime(path, ns=(1, path.stat().st_mtime_ns + 1_000_000))
    scan(runner, clock)
    assert path.exists() and count(session, Message) == 0
    scan(runner, clock)
    rows = messages(session)
    assert len(rows) == 1 and not path.exists()
    assert runner.store.open(rows[0].sha256).read() == b"part one, part two"


class Ticks:
    """``time.monotonic`` for the poller: the given readings, then the last one."""

    def __init__(self, *readings: float):
        self.readings = list(readings)

    def __call__(self) -> float:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


def test_a_scan_that_lasted_an_interval_scans_again_at_once_in_its_process(
        poller, runner, clock, base, session, monkeypatch):
    """The next scan is due when this one ends; this process ran the scan that saw the
    files, so it runs the next one too: the files are taken without waiting for a scan
    of another process, for which they would be first sightings."""
    import plugins.file_poller as module
    poller(polling_interval=1)
    path = put(base, "acme/order1.xml")
    # the poll begins, the first scan starts and ends 1.5 s later, the second is quick
    monkeypatch.setattr(module, "monotonic", Ticks(0.0, 0.0, 1.5, 1.5, 1.6))
    report = scan(runner, clock)

    assert len(report.messages) == 1 and not path.exists()


def test_a_scan_again_at_once_never_stores_twice_a_file_still_being_removed(
        poller, runner, clock, base, session, monkeypatch):
    """The files of a committed batch are removed on a thread while the scan goes on;
    the scan that follows at once may still list them: they are not taken again."""
    import plugins.file_poller as module
    poller(polling_interval=1)
    paths = [put(base, f"acme/order{i}.xml", b"<order n='%d'/>" % i) for i in range(3)]
    scan(runner, clock)  # first sighting
    paths.append(put(base, "acme/order3.xml", b"<order n='3'/>"))  # seen by the next
    real_remove = module.LocalFile.remove

    def slow_remove(self):
        time.sleep(0.3)
        return real_remove(self)
    monkeypatch.setattr(module.LocalFile, "remove", slow_remove)
    # the first scan takes three files and lasts an interval; the second takes the
    # fourth, and lists the three again while they are being removed
    monkeypatch.setattr(module, "monotonic", Ticks(0.0, 0.0, 1.5, 1.5, 1.6))
    report = scan(runner, clock)

    assert len(report.messages) == 4 and count(session, Message) == 4
    assert not any(p.exists() for p in paths) and count(session, PollerPickup) == 0


def test_a_quick_scan_leaves_the_next_one_to_the_schedule(poller, runner, clock, base,
                                                          session, monkeypatch):
    import plugins.file_poller as module
    poller(polling_interval=1)
    path = put(base, "acme/order1.xml")
    monkeypatch.setattr(module, "monotonic", Ticks(0.0, 0.0, 0.5))
    report = scan(runner, clock)

    assert report.messages == [] and path.exists()


def test_many_files_are_stored_in_few_transactions(poller, registry, hub, clock, base,
                                                   session):
    poller()
    runner = SourceRunner(new_session, registry, hub.store, "proc-a", clock=clock,
                          batch_size=100)
    for i in range(250):
        put(base, f"acme/f{i:03}.xml", b"x%d" % i)
    scan(runner, clock)
    commits = []
    listener = lambda s: commits.append(s)  # noqa: E731
    event.listen(Session, "after_commit", listener)
    try:
        report = scan(runner, clock)
    finally:
        event.remove(Session, "after_commit", listener)
    assert len(report.messages) == 250 and count(session, Message) == 250
    assert not any((base / "acme").iterdir())
    # 3 batches (each followed by forgetting its pickups) plus a handful per scan
    assert len(commits) <= 12


# --- unroutable and undescribed files ---------------------------------------------------

def test_unknown_partner_is_moved_aside_with_its_reason(poller, runner, clock, base,
                                                        session):
    poller()
    put(base, "nobody/order1.xml", b"first")
    scan(runner, clock, 2)
    moved = base / "unroutable" / "nobody" / "order1.xml"
    assert moved.read_bytes() == b"first"
    reason = (base / "unroutable" / "nobody" / "order1.xml.reason.txt").read_text()
    assert "'nobody'" in reason and "not a business partner" in reason
    assert not (base / "nobody" / "order1.xml").exists()

    put(base, "nobody/order1.xml", b"second")
    scan(runner, clock, 2)
    assert moved.read_bytes() == b"first"  # not replaced: the new one has a suffix
    assert (base / "unroutable" / "nobody" / "order1.xml.1").read_bytes() == b"second"
    assert (base / "unroutable" / "nobody" / "order1.xml.1.reason.txt").exists()
    assert count(session, Message) == 0
    scan(runner, clock, 2)  # the unroutable folder itself is never scanned
    assert sorted(p.name for p in (base / "unroutable" / "nobody").iterdir()) == [
        "order1.xml", "order1.xml.1", "order1.xml.1.reason.txt", "order1.xml.reason.txt"]


def test_a_captured_from_must_be_an_organization(poller, runner, clock, base, session):
    poller(path_pattern="{from}/{to}/{filename}")
    put(base, "globex/acme/x.xml")
    scan(runner, clock, 2)
    reason = (base / "unroutable/globex/acme/x.xml.reason.txt").read_text()
    assert "'globex' (captured by {from}) is not an organization" in reason
    assert count(session, Message) == 0


@pytest.mark.parametrize("organizations,words", [
    ((), "there is no organization"),
    (("hq", "branch"), "2 organizations (branch, hq)"),
])
def test_without_from_the_single_organization_is_needed(poller, runner, clock, base,
                                                        session, organizations, words):
    poller(organizations=organizations)
    put(base, "acme/x.xml")
    scan(runner, clock, 2)
    assert words in (base / "unroutable/acme/x.xml.reason.txt").read_text()
    assert count(session, Message) == 0


def test_the_organization_is_looked_up_at_pickup_time(poller, runner, clock, base, hub,
                                                      session):
    poller(organizations=())
    put(base, "acme/late.xml")
    scan(runner, clock)
    hub.parties(organizations=("hq",), partners=())
    scan(runner, clock)
    assert [r[1:4] for r in messages(session)] == [("hq", "acme", "late.xml")]


def test_wrong_depth_is_left_alone_and_logged_once(poller, runner, clock, base, session,
                                                   caplog):
    poller()
    stray = put(base, "stray.xml")
    deep = put(base, "acme/sub/deep.xml")
    caplog.set_level(logging.WARNING, logger="plugins.file_poller")
    scan(runner, clock, 3)
    assert stray.exists() and deep.exists() and count(session, Message) == 0
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("stray.xml" in w for w in warnings) == 1
    assert sum("acme/sub " in w for w in warnings) == 1
    assert all("left alone" in w for w in warnings)


def test_symbolic_links_are_never_followed(poller, runner, clock, base, tmp_path, session):
    poller(partners=("acme", "evil"))
    outside = tmp_path / "outside"
    secret = put(outside, "secret.xml", b"secret")
    put(base, "acme/real.xml", b"real")
    (base / "acme" / "link.xml").symlink_to(secret)
    (base / "evil").symlink_to(outside, target_is_directory=True)
    scan(runner, clock, 2)
    assert [r[3] for r in messages(session)] == ["real.xml"]
    assert secret.read_bytes() == b"secret"
    assert (base / "acme" / "link.xml").is_symlink() and (base / "evil").is_symlink()


def test_hostile_names_stay_below_the_base_directory(poller, runner, clock, base, tmp_path,
                                                     session):
    poller()
    os.makedirs(os.fsencode(base / "acme"))
    odd = os.path.join(os.fsencode(base / "acme"), b"bad\xff\x1b:.xml")
    Path(os.fsdecode(odd)).write_bytes(b"odd")
    hostile_dir = base / "..\\x:\x07"
    put(hostile_dir, "f.xml", b"hostile")
    scan(runner, clock, 2)
    rows = messages(session)
    assert [r[3] for r in rows] == ["bad\\xff\x1b:.xml"]
    assert not os.path.exists(odd)
    moved = base / "unroutable" / "..\\x:\x07" / "f.xml"
    assert moved.read_bytes() == b"hostile"
    # nothing appeared beside the base directory but the test's own payload store
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "payloads"]


# --- start, lease, schedule -------------------------------------------------------------

def test_a_base_directory_that_cannot_be_created_puts_the_instance_in_error(
        hub, registry, runner, clock, tmp_path, session):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    hub.parties()
    hub.instance("poller", "file_poller", config={
        "base_directory": str(blocker / "in"), "path_pattern": "{to}/{filename}"})

    report = runner.scan("poller")
    assert not report.ran
    session.expire_all()
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "poller"))
    assert row.state == "error" and "cannot create base_directory" in row.state_reason
    alert = session.scalar(select(Alert))
    assert (alert.kind, alert.subject, alert.resolved_at) == (
        "plugin_failed", "instance:poller", None)
    assert due_scans(session, registry, clock()) == []  # an instance in Error is not scanned

    blocker.unlink()  # fixed; the process restarts and starts its sources
    restarted = SourceRunner(new_session, registry, hub.store, "proc-b", clock=clock)
    assert restarted.start_all() == {"poller": True}
    session.expire_all()
    assert session.scalar(select(PluginInstance.state)) == "running"
    assert session.scalar(select(Alert.resolved_at)) is not None
    assert (blocker / "in").is_dir()


def test_the_scan_guard_refuses_a_second_concurrent_scan(poller, runner, clock, base,
                                                         session, lease):
    poller()
    put(base, "acme/x.xml")
    other = lease("proc-b:1")
    assert other.take(clock())
    for _ in range(3):
        report = runner.scan("poller")
        assert not report.ran and "scanned elsewhere" in report.reason
    assert count(session, Message) == 0 and (base / "acme/x.xml").exists()
    other.release(clock())
    scan(runner, clock, 2)
    assert count(session, Message) == 1


def test_a_scanner_whose_lease_was_handed_on_cannot_commit(poller, clock, session, lease):
    poller()
    first = lease("proc-a:1")
    assert first.take(clock())
    clock.advance(31)  # it stopped renewing: the lease ran out
    second = lease("proc-b:1")
    assert second.take(clock())
    with pytest.raises(scans.LeaseLost):
        first.check(first.session, clock())


def test_the_scheduler_publishes_each_interval(poller, hub, registry, clock, session):
    poller(polling_interval=10)
    hub.instance("manual", "manual_source")
    hub.instance("off", "file_poller", enabled=False,
                 config={"base_directory": "/nonexistent", "to": "acme"})
    assert due_scans(session, registry, clock()) == [("poller", 10.0)]
    assert due_scans(session, registry, clock() + timedelta(seconds=9)) == []
    assert due_scans(session, registry, clock() + timedelta(seconds=10)) == [("poller", 10.0)]


def test_a_scan_is_published_at_the_scheduler_run_nearest_its_time(
        poller, registry, clock, session):
    """The scheduler runs once a tick (beat's ``source-scheduler``): a scan due less
    than half a tick after a run is published at that run, one due more than half a
    tick after it at the next. A scan's next time counts from its start, a little after
    the run that published it, so with a 1 s interval each scan used to wait for the
    run after next: every 2 s instead of every second."""
    import celeryconfig
    assert celeryconfig.beat_schedule["source-scheduler"]["schedule"] == scans.SCHEDULER_TICK
    poller(polling_interval=10)
    assert due_scans(session, registry, clock()) == [("poller", 10.0)]
    assert due_scans(session, registry, clock() + timedelta(seconds=9.4)) == []
    assert due_scans(session, registry, clock() + timedelta(seconds=9.6)) == [
        ("poller", 10.0)]


def test_a_one_second_polling_interval_scans_at_every_scheduler_run(
        poller, registry, clock, session, lease):
    """Each scan starts a little after the run that published it and sets its next time
    one interval after its start: the next run, one tick later, still publishes it."""
    poller(polling_interval=1)
    for n in range(5):
        run = clock() + timedelta(seconds=n * scans.SCHEDULER_TICK)
        assert due_scans(session, registry, run) == [("poller", 1.0)], f"run {n}"
        scan = lease(f"worker:{n}")
        started = run + timedelta(milliseconds=30)
        assert scan.take(started)
        scan.release(started + timedelta(seconds=1))


def test_a_next_scan_set_by_a_clock_ten_minutes_ahead_is_due_at_once(
        poller, registry, clock, session):
    """A process whose clock runs ahead schedules the next scan in its future; the
    others publish it anyway instead of waiting out the skew."""
    poller(polling_interval=10)
    ahead = clock() + timedelta(minutes=10)
    assert due_scans(session, registry, ahead) == [("poller", 10.0)]
    assert due_scans(session, registry, clock()) == [("poller", 10.0)]
    assert due_scans(session, registry, clock() + timedelta(seconds=9)) == []
    late = clock() + timedelta(seconds=10)  # within the slack: an ordinary interval
    assert due_scans(session, registry, late - timedelta(seconds=4)) == []
    assert due_scans(session, registry, late) == [("poller", 10.0)]


def test_the_scheduler_hands_on_a_lease_left_by_a_dead_scanner(poller, registry, clock,
                                                               session, lease):
    poller(polling_interval=10)
    dead = lease("dead:1")
    assert dead.take(clock())
    assert due_scans(session, registry, clock() + timedelta(seconds=29)) == []
    assert due_scans(session, registry, clock() + timedelta(seconds=31)) == [
        ("poller", 10.0)]


def test_the_scan_lease_lasts_the_scan_lease_seconds_setting(
        poller, registry, hub, clock, base, session, monkeypatch):
    save_settings(session, DeliverySettings(scan_lease_seconds=5))
    session.commit()
    poller(polling_interval=1)
    put(base, "acme/o.xml")
    runner = SourceRunner(new_session, registry, hub.store, "proc-a", clock=clock)
    scan(runner, clock)
    real_remove, held, bind = file_poller.LocalFile.remove, [], session.get_bind()

    def note_the_lease(self):  # after the batch's commit renewed the lease; files are
        with Session(bind) as s:  # removed on a thread of their own (no app context)
            held.append((*s.execute(select(Lock.owner, Lock.until).where(
                Lock.name == "scan:poller")).one(), clock()))
        return real_remove(self)
    monkeypatch.setattr(file_poller.LocalFile, "remove", note_the_lease)
    scan(runner, clock)
    [(owner, until, now)] = held
    assert owner.startswith("proc-a:") and until == now + timedelta(seconds=5)


def test_a_batch_slower_to_read_than_the_lease_keeps_its_lease(
        poller, registry, hub, clock, base, session, monkeypatch):
    """Reading the ten files of one batch takes 20 s, the lease is 5 s: the scan renews
    it as it reads, so the scheduler (run after every file) never hands it on and the
    batch commits."""
    poller()
    for i in range(10):
        put(base, f"acme/s{i}.xml", b"s%d" % i)
    runner = SourceRunner(new_session, registry, hub.store, "proc-a", clock=clock,
                          lease_seconds=5)
    scan(runner, clock)
    real_open, handed_on = file_poller.LocalFile.open, []

    def slow_open(self):
        clock.advance(2)
        with new_session() as s:
            handed_on.extend(due_scans(s, registry, clock()))
        return real_open(self)
    monkeypatch.setattr(file_poller.LocalFile, "open", slow_open)
    report = runner.scan("poller")

    assert handed_on == []
    assert (report.ran, report.reason, len(report.messages)) == (True, "", 10)
    assert count(session, Message) == 10 and not list((base / "acme").iterdir())


def test_celery_config_schedules_the_source_scheduler_every_second():
    import celeryconfig
    entry = celeryconfig.beat_schedule["source-scheduler"]
    assert (entry["task"], entry["schedule"]) == ("b2bhub.schedule_sources", 1.0)


# --- crash safety -----------------------------------------------------------------------

class Death(BaseException):
    """The process dies here (nothing after it runs, not even except Exception)."""


def die_after_commit(runner, monkeypatch) -> None:
    """A scan whose process dies after its commit, before removing what it stored."""
    def die(self):
        raise Death()
    monkeypatch.setattr(file_poller.LocalFile, "remove", die)
    with pytest.raises(Death):
        runner.scan("poller")
    monkeypatch.undo()


def test_death_between_commit_and_removal_stores_nothing_twice(
        poller, registry, hub, clock, base, session, monkeypatch):
    poller()
    files = [put(base, f"acme/o{i}.xml", b"o%d" % i) for i in range(3)]
    runner = SourceRunner(new_session, registry, hub.store, "proc-a", clock=clock)
    scan(runner, clock)
    die_after_commit(runner, monkeypatch)
    assert count(session, Message) == 3 and count(session, PollerPickup) == 3
    assert all(f.exists() for f in files)
    # as a kill -9 leaves it: the lease still held by the dead process
    with new_session() as s:
        s.execute(Lock.__table__.update().where(Lock.name == "scan:poller").values(
            owner="proc-a:dead", until=clock() + timedelta(seconds=30)))
        s.commit()

    restarted = SourceRunner(new_session, registry, hub.store, "proc-b", clock=clock)
    assert "scanned elsewhere" in restarted.scan("poller").reason
    clock.advance(31)
    assert due_scans(session, registry, clock()) == [("poller", 10.0)]
    report = restarted.scan("poller")  # first scan of the new process: recovery only
    assert report.ran and report.messages == []
    assert not any(f.exists() for f in files)
    assert count(session, Message) == 3 and count(session, PollerPickup) == 0


def test_a_failed_removal_is_retried_not_stored_again(poller, runner, clock, base, session,
                                                      monkeypatch):
    poller()
    path = put(base, "acme/o.xml")
    scan(runner, clock)
    real_remove, failures = file_poller.LocalFile.remove, []

    def remove_fails_once(self):
        if not failures:
            failures.append(self.relative)
            raise PermissionError(13, "Permission denied")
        return real_remove(self)
    monkeypatch.setattr(file_poller.LocalFile, "remove", remove_fails_once)
    scan(runner, clock)
    assert failures == ["acme/o.xml"]
    assert path.exists() and count(session, PollerPickup) == 1
    scan(runner, clock, 2)
    assert not path.exists()
    assert count(session, Message) == 1 and count(session, PollerPickup) == 0


def test_a_removal_not_made_durable_keeps_its_pickup_until_the_next_scan(
        poller, runner, clock, base, session, monkeypatch):
    """After removing a batch's files the poller fsyncs their directory; until that
    succeeds the pickup rows stay, so a removal lost in a crash could not bring back a
    file the hub forgot it stored. The next scan finds the files gone and forgets them."""
    poller()
    paths = [put(base, f"acme/o{i}.xml", b"o%d" % i) for i in range(3)]
    scan(runner, clock)
    synced = []

    def sync_fails(self):
        synced.append(self.relative)
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(file_poller.LocalFile, "sync_removal", sync_fails)
    scan(runner, clock)
    assert synced == ["acme/o0.xml"]  # once for their one directory
    assert not any(p.exists() for p in paths)
    assert count(session, Message) == 3 and count(session, PollerPickup) == 3
    monkeypatch.undo()
    scan(runner, clock)
    assert count(session, Message) == 3 and count(session, PollerPickup) == 0


def scan_rewriting_before_removal(runner, clock, path: Path, monkeypatch) -> None:
    """A scan that stores ``path``, whose sender rewrites it in place (new and longer)
    after the commit, just before the poller removes it."""
    real_remove = file_poller.LocalFile.remove

    def rewrite_then_remove(self):
        path.write_bytes(b"new and longer")
        return real_remove(self)
    monkeypatch.setattr(file_poller.LocalFile, "remove", rewrite_then_remove)
    scan(runner, clock)
    monkeypatch.undo()


def test_a_file_replaced_after_the_commit_is_not_removed(poller, runner, clock, base,
                                                         session, monkeypatch):
    poller()
    path = put(base, "acme/o.xml", b"old")
    scan(runner, clock)
    scan_rewriting_before_removal(runner, clock, path, monkeypatch)
    assert path.read_bytes() == b"new and longer" and count(session, Message) == 1
    scan(runner, clock, 2)
    bodies = [runner.store.open(r.sha256).read() for r in messages(session)]
    assert bodies == [b"old", b"new and longer"] and not path.exists()


def test_files_are_copied_into_the_payload_store_by_default(poller, runner, clock, base,
                                                           session):
    poller()
    path = put(base, "acme/o.xml", b"copied")
    inode = path.stat().st_ino
    scan(runner, clock, 2)
    [row] = messages(session)
    assert runner.store.path(row.sha256).stat().st_ino != inode and not path.exists()


def test_take_by_link_stores_the_file_itself(poller, runner, clock, base, session):
    poller(take_by_link=True)
    paths = [put(base, f"acme/o{i}.xml", b"linked %d" % i) for i in range(3)]
    inodes = [p.stat().st_ino for p in paths]
    scan(runner, clock, 2)
    rows = messages(session)
    assert [runner.store.path(r.sha256).stat().st_ino for r in rows] == inodes
    assert [runner.store.open(r.sha256).read() for r in rows] == [
        b"linked 0", b"linked 1", b"linked 2"]
    assert not any(p.exists() for p in paths)
    assert list((runner.store.root / "tmp").iterdir()) == []
    assert all(runner.store.path(r.sha256).stat().st_nlink == 1 for r in rows)


def test_take_by_link_copies_a_file_that_has_another_name(poller, runner, clock, base,
                                                          tmp_path, session):
    poller(take_by_link=True)
    path = put(base, "acme/o.xml", b"two names")
    elsewhere = tmp_path / "elsewhere.xml"
    os.link(path, elsewhere)
    scan(runner, clock, 2)
    [row] = messages(session)
    assert not path.exists()
    assert runner.store.path(row.sha256).stat().st_ino != elsewhere.stat().st_ino
    assert elsewhere.stat().st_nlink == 1  # the store took no link
    elsewhere.write_bytes(b"changed through the other name")
    assert runner.store.open(row.sha256).read() == b"two names"


def test_take_by_link_a_file_rewritten_in_place_before_its_removal_is_refused(
        poller, runner, clock, base, session, monkeypatch):
    """The trade-off take_by_link documents: the stored message shares the file's bytes
    until its removal, so a rewrite in place in that window changes them; the payload's
    sha256 check then refuses it rather than hand on other bytes. (By default the copy
    keeps the first version: test_a_file_replaced_after_the_commit_is_not_removed.)"""
    poller(take_by_link=True)
    path = put(base, "acme/o.xml", b"old")
    scan(runner, clock)
    scan_rewriting_before_removal(runner, clock, path, monkeypatch)
    [row] = messages(session)
    with pytest.raises(PayloadCorrupt), runner.store.open(row.sha256) as stream:
        stream.read()


def test_a_poll_removes_payload_temp_files_a_dead_process_left(
        poller, runner, clock, base, session, monkeypatch):
    poller()
    tmp = runner.store.root / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    stale, fresh = tmp / "link-0123456789abcdef", tmp / "put-being-written"
    stale.write_bytes(b"a batch never committed")
    fresh.write_bytes(b"a batch under way")
    then = time.time() - payloads.TEMP_GRACE - 60
    os.utime(stale, (then, then))
    monkeypatch.setattr(intake, "_TEMP_CHECKED", {})
    scan(runner, clock)
    assert sorted(p.name for p in tmp.iterdir()) == ["put-being-written"]
    os.utime(fresh, (then, then))
    scan(runner, clock)  # checked once an hour per process, not at every poll
    assert fresh.exists()
    monkeypatch.setattr(intake, "_TEMP_CHECKED", {})
    scan(runner, clock)
    assert not fresh.exists()


# --- configuration and registration -----------------------------------------------------

@pytest.mark.parametrize("config,words", [
    ({"path_pattern": "{to}/{filename}", "to": "acme"}, "keep one"),
    ({"path_pattern": "{filename}"}, "neither"),
    ({"path_pattern": "order_{to}/{filename}"}, "whole path element"),
    ({"path_pattern": "/abs/{to}/{filename}"}, "absolute"),
    ({"path_pattern": "{to}/{filename}", "from": "Bad Name"}, "must be 1-64"),
    ({"path_pattern": "{to}/{filename}", "file_pattern": "a/*.xml"}, "file name alone"),
    ({"path_pattern": "{to}/{filename}", "polling_interval": 0}, "at least 1"),
])
def test_a_bad_configuration_is_refused_when_saved(hub, base, config, words):
    with pytest.raises(ServiceError) as refused:
        hub.instance("poller", "file_poller", config={"base_directory": str(base), **config})
    assert words in str(refused.value)


def test_defaults(poller):
    row = poller()
    assert {k: row.config[k] for k in ("polling_interval", "file_pattern", "from")} == {
        "polling_interval": 10, "file_pattern": "*", "from": None}


def test_registered_through_its_entry_point_like_any_package():
    found = PluginRegistry()
    found.load()
    assert found.get("file_poller") is FilePoller and FilePoller.is_source()
    assert scans.is_scheduled_source(FilePoller)


# --- archive_directory ------------------------------------------------------------------

@pytest.fixture
def archive(tmp_path):
    return tmp_path / "archive"


def test_a_picked_up_file_is_moved_to_the_archive(poller, runner, clock, base, archive,
                                                  session, hub):
    poller(archive_directory=str(archive))
    first = put(base, "acme/order.xml", b"<order>1</order>")
    scan(runner, clock, 2)
    assert archive.is_dir()  # created when the instance started
    assert not first.exists()
    assert (archive / "acme" / "order.xml").read_bytes() == b"<order>1</order>"
    assert count(session, Message) == 1 and count(session, PollerPickup) == 0
    # the same name again: archived beside the first, which is never replaced
    put(base, "acme/order.xml", b"<order>2</order>")
    scan(runner, clock, 2)
    assert (archive / "acme" / "order.xml").read_bytes() == b"<order>1</order>"
    assert (archive / "acme" / "order.xml.1").read_bytes() == b"<order>2</order>"
    assert count(session, Message) == 2
    assert sorted(p.name for p in (base / "acme").iterdir()) == []


def _die_then_recover(registry, hub, clock, monkeypatch, between=None):
    """A scan whose process dies after the commit, before the move; then a new
    process's first scan (recovery). ``between`` runs before the recovery."""
    runner = file_poller_runner(registry, hub, clock, "proc-a")
    scan(runner, clock)
    die_after_commit(runner, monkeypatch)
    with new_session() as s:  # the lease of the dead process, run out
        s.execute(Lock.__table__.update().where(Lock.name == "scan:poller").values(
            owner="proc-a:dead", until=clock() - timedelta(seconds=1)))
        s.commit()
    if between:
        between()
    restarted = file_poller_runner(registry, hub, clock, "proc-b")
    report = restarted.scan("poller")
    assert report.ran and report.messages == []


def file_poller_runner(registry, hub, clock, owner):
    return SourceRunner(new_session, registry, hub.store, owner, clock=clock)


def test_death_before_the_move_archives_once_on_recovery(poller, registry, hub, clock, base,
                                                         archive, session, monkeypatch):
    poller(archive_directory=str(archive))
    files = [put(base, f"acme/o{i}.xml", b"o%d" % i) for i in range(3)]
    _die_then_recover(registry, hub, clock, monkeypatch)
    assert not any(f.exists() for f in files)
    assert sorted(p.name for p in (archive / "acme").iterdir()) == ["o0.xml", "o1.xml",
                                                                    "o2.xml"]
    assert count(session, Message) == 3 and count(session, PollerPickup) == 0


def test_death_between_the_link_and_the_unlink_archives_once(poller, registry, hub, clock,
                                                             base, archive, session,
                                                             monkeypatch):
    poller(archive_directory=str(archive))
    put(archive, "acme/o.xml", b"an older file of the same name")
    path = put(base, "acme/o.xml", b"this one")

    def linked_only():  # what the move had done when the process died
        os.link(path, archive / "acme" / "o.xml.1")

    _die_then_recover(registry, hub, clock, monkeypatch, between=linked_only)
    assert not path.exists()
    assert sorted(p.name for p in (archive / "acme").iterdir()) == ["o.xml", "o.xml.1"]
    assert (archive / "acme" / "o.xml.1").read_bytes() == b"this one"
    assert (archive / "acme" / "o.xml").read_bytes() == b"an older file of the same name"
    assert count(session, Message) == 1


def test_an_archive_inside_the_base_directory_is_refused(hub, base):
    hub.parties(organizations=("mycompany",), partners=("acme",))
    with pytest.raises(ServiceError) as refused:
        hub.instance("poller", "file_poller", config={
            "base_directory": str(base), "path_pattern": "{to}/{filename}",
            "archive_directory": str(base / "done")})
    assert "outside base_directory" in str(refused.value)
