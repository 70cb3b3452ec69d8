"""One poller's scan split into shards by the hash of each file's path (issue 43;
docs/design.md, "One poller's scan split across workers"): the shards together take
every file once, a shard never takes nor removes another's, recovery is per shard, one
lease per shard, and a change of the shard count loses and doubles nothing. Each
``SourceRunner`` here stands for a worker process of its own."""

# ruff: noqa: F811 (the imported fixtures are requested by name as parameters)
from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from b2bhub.domain.shards import Shard, shard_of
from b2bhub.engine.scans import LeaseLost, ScanLease, SourceRunner, due_scans
from b2bhub.models import Lock, Message, PluginInstance, PollerPickup
from b2bhub.runtime.hub import new_session
from b2bhub.services import config as svc
from b2bhub.services.errors import ServiceError

# the single-scan tests' fixtures (registry, clock, base, poller), used here by name
from tests.test_file_poller import (  # noqa: F401
    Death,
    base,
    clock,
    count,
    poller,
    put,
    registry,
)

N = 40


def runner_of(registry, hub, clock, owner: str) -> SourceRunner:
    return SourceRunner(new_session, registry, hub.store, owner, clock=clock)


def drop(base: Path, n: int = N, prefix: str = "o") -> dict[str, int]:
    """``n`` files under acme/ and globex/; their recorded paths and each one's shard of
    two."""
    paths = [f"{'acme' if i % 2 else 'globex'}/{prefix}{i}.xml" for i in range(n)]
    for i, relative in enumerate(paths):
        put(base, relative, b"<order n='%d'/>" % i)
    return {p: shard_of(p, 2) for p in paths}


def left(base: Path) -> set[str]:
    return {p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()}


def stored(session) -> Counter:
    session.expire_all()
    return Counter(f"{to}/{name}" for to, name in session.execute(
        select(Message.to_party, Message.original_filename)))


def scan_twice(runner: SourceRunner, clock, shard: int | None) -> list[int]:
    """A first sighting, then the take (the poller takes a file seen twice unchanged)."""
    made = runner.scan("poller", shard).messages
    clock.advance(10)
    made += runner.scan("poller", shard).messages
    return made


def set_shards(session, registry, count: int) -> None:
    """The operator changes the shard count (as the form and the API save it)."""
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "poller"))
    svc.save_instance(session, registry, {"config": {**row.config, "scan_shards": count}},
                      existing=row)
    session.commit()


def die_after_commit(runner, clock, shard, monkeypatch) -> None:
    """A scan whose process dies after its commit, before removing what it stored."""
    from plugins import file_poller

    def die(self):
        raise Death()
    runner.scan("poller", shard)
    clock.advance(10)
    with monkeypatch.context() as patch:
        patch.setattr(file_poller.LocalFile, "remove", die)
        with pytest.raises(Death):
            runner.scan("poller", shard)


# --- the split -------------------------------------------------------------------------

def test_the_shard_of_a_path_is_a_pure_function_of_the_path():
    assert shard_of("acme/o1.xml", 2) == shard_of("acme/o1.xml", 2)
    assert {shard_of(f"acme/o{i}.xml", 4) for i in range(100)} == {0, 1, 2, 3}
    assert all(Shard(0, 1).owns(f"x{i}") for i in range(10))
    assert [Shard(k, 3).owns("acme/o1.xml") for k in range(3)].count(True) == 1


def test_two_shards_take_every_file_exactly_once_and_never_another_shards(
        poller, registry, hub, clock, base, session):
    poller(scan_shards=2)
    files = drop(base)
    lost = {shard_of(p, 2): p for p in (f"nobody/lost{i}.xml" for i in range(10))}
    for relative in lost.values():  # unroutable: moved by the shard that owns it
        put(base, relative)
    assert set(files.values()) == set(lost) == {0, 1}
    a, b = runner_of(registry, hub, clock, "proc-a"), runner_of(registry, hub, clock, "proc-b")
    moved = {f"unroutable/{lost[0]}", f"unroutable/{lost[0]}.reason.txt"}

    scan_twice(a, clock, 0)
    assert stored(session) == Counter(p for p, k in files.items() if k == 0)
    assert left(base) == {p for p, k in files.items() if k == 1} | {lost[1]} | moved

    scan_twice(b, clock, 1)
    assert stored(session) == Counter(list(files))  # every file, each once
    assert left(base) == moved | {f"unroutable/{lost[1]}", f"unroutable/{lost[1]}.reason.txt"}
    assert count(session, PollerPickup) == 0
    session.expire_all()
    assert set(session.scalars(select(Lock.name).where(Lock.name.like("scan:%")))) >= {
        "scan:poller#0", "scan:poller#1"}


def test_the_scheduler_publishes_one_scan_per_due_shard_each_under_its_own_lease(
        poller, registry, hub, clock, base, session):
    poller(scan_shards=3)
    assert due_scans(session, registry, clock()) == [
        ("poller", 10.0, 0), ("poller", 10.0, 1), ("poller", 10.0, 2)]
    assert due_scans(session, registry, clock() + timedelta(seconds=5)) == []
    files = drop(base, 30)
    holder = ScanLease(new_session(), "poller", "proc-x", 30, clock, Shard(1, 3))
    assert holder.take(clock())  # shard 1 is being scanned by another process
    a = runner_of(registry, hub, clock, "proc-a")
    assert "being scanned elsewhere" in a.scan("poller", 1).reason
    assert a.scan("poller", 0).ran and a.scan("poller", 2).ran  # the others are free
    assert "shard 3 is not one of them" in a.scan("poller", 3).reason
    assert "shard None is not one of them" in a.scan("poller").reason
    clock.advance(10)
    scan_twice(a, clock, 0)
    scan_twice(a, clock, 2)
    assert stored(session) == Counter(p for p in files if shard_of(p, 3) != 1)
    holder.session.close()


def test_recovery_reads_only_its_shards_pickups(poller, registry, hub, clock, base, session,
                                                monkeypatch):
    poller(scan_shards=2)
    files = drop(base)
    # both shards' processes die after their commit, before removing their files
    die_after_commit(runner_of(registry, hub, clock, "proc-a"), clock, 0, monkeypatch)
    die_after_commit(runner_of(registry, hub, clock, "proc-b"), clock, 1, monkeypatch)
    assert stored(session) == Counter(list(files)) and left(base) == set(files)
    assert count(session, PollerPickup) == N

    c = runner_of(registry, hub, clock, "proc-c")
    assert c.scan("poller", 1).messages == []  # recovery: shard 1's files removed
    assert left(base) == {p for p, k in files.items() if k == 0}  # shard 0's untouched
    session.expire_all()
    assert {shard_of(p, 2) for p in session.scalars(select(PollerPickup.path))} == {0}
    clock.advance(10)
    assert c.scan("poller", 0).messages == []
    assert left(base) == set() and count(session, PollerPickup) == 0
    assert stored(session) == Counter(list(files))


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 3)])
def test_changing_the_shard_count_with_pickups_left_loses_and_doubles_nothing(
        before, after, poller, registry, hub, clock, base, session, monkeypatch):
    """Pickup rows of the old shards (their processes died after the commit) and files
    seen once but not taken yet: the new shards finish each path's row and take the
    rest, every file stored once."""
    poller(scan_shards=before)
    files = drop(base)
    old = [None] if before == 1 else list(range(before))
    for k in old:
        die_after_commit(runner_of(registry, hub, clock, f"proc-{k}"), clock, k, monkeypatch)
    fresh = drop(base, 10, prefix="late")  # dropped after, seen by no scan yet
    assert count(session, PollerPickup) == N and stored(session) == Counter(list(files))

    set_shards(session, registry, after)
    new = [None] if after == 1 else list(range(after))
    runners = {k: runner_of(registry, hub, clock, f"new-{k}") for k in new}
    stale = 0 if after == 1 else None  # a task published for the old count
    assert "is not one of them" in runners[new[0]].scan("poller", stale).reason
    for _ in range(2):
        for k in new:
            runners[k].scan("poller", k)
        clock.advance(10)
    assert stored(session) == Counter([*files, *fresh])  # each file once
    assert left(base) == set() and count(session, PollerPickup) == 0


def test_a_lease_of_the_other_shard_count_holds_off_the_new_one_until_it_runs_out(
        poller, registry, hub, clock, base, session):
    """A scan begun before the shard count changed (its lease still live) and the new
    shards never scan at once: they split the files differently."""
    poller(scan_shards=2)
    drop(base, 10)
    old = ScanLease(new_session(), "poller", "proc-x", 30, clock, Shard(1, 2))
    assert old.take(clock())
    set_shards(session, registry, 1)
    a = runner_of(registry, hub, clock, "proc-a")
    assert "being scanned elsewhere" in a.scan("poller").reason
    clock.advance(31)  # the old scanner stalled past its lease
    assert a.scan("poller").ran
    clock.advance(10)
    assert len(a.scan("poller").messages) == 10

    new = ScanLease(new_session(), "poller", "proc-y", 30, clock)
    assert new.take(clock())
    with pytest.raises(LeaseLost):  # the stalled old scanner may commit nothing now
        old.check(old.session, clock())
    old.session.rollback()
    for lease in (old, new):
        lease.session.close()


@pytest.mark.parametrize(("value", "says"), [
    (0, "must be at least 1"), (65, "must be at most 64"), ("two", "must be an integer"),
    (2.5, "must be an integer")])
def test_scan_shards_is_an_integer_from_1_to_64(hub, base, value, says):
    hub.parties(organizations=("mycompany",), partners=("acme",))
    with pytest.raises(ServiceError) as refused:
        hub.instance("poller", "file_poller", config={
            "base_directory": str(base), "scan_shards": value})
    assert "scan_shards" in str(refused.value) and says in str(refused.value)


def test_a_poller_has_one_shard_unless_told(poller, registry, hub, clock, session):
    row = poller()
    assert row.config["scan_shards"] == 1
    assert due_scans(session, registry, clock()) == [("poller", 10.0)]
    session.expire_all()
    assert session.scalar(select(Lock.name).where(Lock.name.like("scan:%"))) == "scan:poller"
