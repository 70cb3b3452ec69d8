"""Scheduled sources: which scans are due, the lease that guards a scan, and the scan.

Each scheduled source instance has a row ``scan:<instance>`` in ``locks``. While nobody
scans (``owner`` is NULL) its ``until`` is when the next scan is due; while a scan runs,
``owner`` names the scanner and ``until`` is when its lease runs out. Both the scheduler
and the scanner change the row only by a conditional UPDATE, so one instance is never
scanned by two processes at once, and every batch a scan commits renews the lease in the
same transaction: a scanner that lost its lease cannot commit anything. A lease left by
a process that died runs out and the scheduler hands the instance on.

An instance whose configuration sets ``scan_shards`` to ``n > 1`` is scanned as ``n``
shards (``b2bhub.domain.shards``), each with its row ``scan:<instance>#<k>`` guarding it
exactly as above: two processes may scan one instance at once, never one shard. A lease
is never taken, nor renewed, while a live lease of the instance's other layout (another
shard count, left by a scan begun before the configuration changed) is held, so shards
of two layouts, which split the files differently, never scan at once; on PostgreSQL the
takes of one instance queue on its ``scan:<instance>`` row for that.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from b2bhub.domain.retry import RECORD_AT_ONCE, merge
from b2bhub.domain.shards import MOST_SHARDS, WHOLE, Shard, shard_count
from b2bhub.engine.envelope_checks import IntakeChecks
from b2bhub.engine.instances import mark_instance_error, mark_running
from b2bhub.engine.intake import Fence, ScanStopped, SourceIntake
from b2bhub.engine.settings import load_settings
from b2bhub.models import InstanceState, Lock, PluginInstance, utcnow
from b2bhub.payloads.store import PayloadStore
from b2bhub.plugin import Plugin, PluginStartError

log = logging.getLogger(__name__)
DEFAULT_INTERVAL = 10.0
LEASE_SECONDS = 30.0
#: how far beyond its interval an idle source's next scan may lie before it is taken as
#: written by a clock ahead of ours (:func:`_publish`)
CLOCK_SKEW_SLACK = timedelta(seconds=5)
#: seconds between two runs of the source scheduler (``source-scheduler`` in beat's
#: schedule, celeryconfig.py)
SCHEDULER_TICK = 1.0


class LeaseLost(Exception):
    """The scan's lease ran out and was handed on; this scanner must stop."""


def lease_name(instance: str, shard: Shard = WHOLE) -> str:
    """``scan:<instance>``, or ``scan:<instance>#<k>`` for shard k of more than one."""
    return f"scan:{instance}" if shard.count == 1 else f"scan:{instance}#{shard.index}"


def shards_of(config: dict | None) -> list[Shard]:
    count = shard_count(config)
    return [Shard(k, count) for k in range(count)]


def is_scheduled_source(cls: type) -> bool:
    """A source type that collects on a schedule: it implements ``poll``."""
    poll = getattr(cls, "poll", None)
    return "source" in getattr(cls, "roles", ()) and callable(poll) and poll is not Plugin.poll


def polling_interval(config: dict) -> float:
    return float(config.get("polling_interval") or DEFAULT_INTERVAL)


def ensure_lease_rows(session: Session, names: list[str]) -> None:
    """Create the missing ``locks`` rows (an insert that ignores rows already there)."""
    if not names:
        return
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    session.execute(insert(Lock).values([{"name": n} for n in names])
                    .on_conflict_do_nothing(index_elements=["name"]))


# --- the scheduler ------------------------------------------------------------------

def due_scans(session: Session, registry, now: datetime) -> list[tuple]:
    """The enabled scheduled sources whose interval has elapsed, each as ``(instance,
    interval)``, or per due shard ``(instance, interval, k)`` for an instance of more
    than one shard; each is marked as published (its next scan due one interval later)
    before the commit, so a second scheduler run publishes it again only then.

    A scan due within half a :data:`SCHEDULER_TICK` from ``now`` is due at this run:
    the scheduler runs once a tick, so a scan is published at the run nearest its time.
    Its next time is counted from the start of the scan before it, which begins a few
    milliseconds after the run that published it; waiting until that time had passed
    put each scan one whole tick late, and a 1 s polling interval scanned every 2 s."""
    scheduled = _scheduled(session, registry)
    ensure_lease_rows(session, [lease_name(name, shard) for name, (_i, shards)
                                in scheduled.items() for shard in shards])
    due = [(name, interval, *([shard.index] if shard.count > 1 else []))
           for name, (interval, shards) in scheduled.items() for shard in shards
           if publish_due(session, lease_name(name, shard), interval, now,
                          early=SCHEDULER_TICK / 2)]
    session.commit()
    return due


def _scheduled(session: Session, registry) -> dict[str, tuple[float, list[Shard]]]:
    rows = session.execute(select(PluginInstance.name, PluginInstance.type,
                                  PluginInstance.config).where(
        PluginInstance.enabled.is_(True),
        PluginInstance.state.not_in([InstanceState.ERROR, InstanceState.STOPPED]),
    ).order_by(PluginInstance.name)).all()
    return {name: (polling_interval(config or {}), shards_of(config)) for name, type_name,
            config in rows
            if type_name in registry and is_scheduled_source(registry.get(type_name))}


def publish_due(session: Session, lock: str, interval: float, now: datetime,
                slack: float | None = None, early: float = 0.0) -> bool:
    """True when the ``locks`` row ``lock`` is idle and due, or held by a lease that ran
    out; it is then due one interval later (a conditional UPDATE: of any number of
    schedulers running at once, one gets True).

    An idle row due later than one interval plus a slack from ``now`` is due too: its
    time was set by a clock ahead of this one (another host's, or this one's before it
    was stepped back), or the interval was shortened since. Without this, one process
    whose clock ran 10 minutes ahead stopped every scan of the source for 10 minutes. A
    false alarm costs one run early; the scan lease still guards it. ``slack`` (seconds)
    defaults to :data:`CLOCK_SKEW_SLACK`. ``early`` (seconds): an idle row due that
    much after ``now`` is due already."""
    margin = CLOCK_SKEW_SLACK if slack is None else timedelta(seconds=slack)
    skewed = Lock.until > now + timedelta(seconds=interval) + margin
    idle_due = and_(Lock.owner.is_(None),
                    or_(Lock.until.is_(None), Lock.until <= now + timedelta(seconds=early),
                        skewed))
    expired = and_(Lock.owner.is_not(None), Lock.until < now)
    return session.execute(update(Lock).where(
        Lock.name == lock, or_(idle_due, expired),
    ).values(owner=None, until=now + timedelta(seconds=interval))).rowcount == 1


# --- the lease ----------------------------------------------------------------------

class ScanLease(Fence):
    """The guard of one scan of one instance (or of one shard of it); see the module
    docstring. Renewed at every batch commit, and by :meth:`keep_alive` once a third of
    it has passed since the last renewal. The owner of a shard's lease ends in
    ``/<shard count>``: the layout it scans by."""

    def __init__(self, session: Session, instance: str, owner: str,
                 seconds: float = LEASE_SECONDS, clock: Callable[[], datetime] = utcnow,
                 shard: Shard = WHOLE):
        self.session, self.name = session, lease_name(instance, shard)
        self.owner = owner if shard.count == 1 else f"{owner}/{shard.count}"
        self.instance, self.shard, self.base = instance, shard, lease_name(instance)
        self.seconds, self.clock = timedelta(seconds=seconds), clock
        self._renewed: datetime | None = None

    def take(self, now: datetime) -> bool:
        """Take the lease unless another scanner holds one that has not run out, or a
        scanner of the other layout holds a live lease of the instance."""
        ensure_lease_rows(self.session, list(dict.fromkeys([self.base, self.name])))
        self._queue(for_update=True)
        taken = self.session.execute(update(Lock).where(
            Lock.name == self.name, or_(Lock.owner.is_(None), Lock.until < now),
        ).values(owner=self.owner, until=now + self.seconds)).rowcount == 1
        if taken and self._other_layout(now):
            self.session.rollback()
            taken = False
        self.session.commit()
        self._renewed = now if taken else None
        return taken

    def check(self, session: Session, now: datetime) -> None:
        """Renew in the caller's transaction; LeaseLost if it is no longer ours."""
        if self.shard.count > 1:
            self._queue(session, for_update=False)
        stopped = select(PluginInstance.id).where(PluginInstance.name == self.instance,
                                                  PluginInstance.state == InstanceState.STOPPED)
        renewed = session.execute(update(Lock).where(
            Lock.name == self.name, Lock.owner == self.owner, ~stopped.exists(),
        ).values(until=now + self.seconds)).rowcount
        if renewed != 1 or self._other_layout(now, session):
            raise LeaseLost(f"{self.name}: the lease was handed on or the instance was "
                            "stopped; the scan stops")
        self._renewed = now

    def _queue(self, session: Session | None = None, *, for_update: bool) -> None:
        """On PostgreSQL, lock the instance's ``scan:<instance>`` row: exclusively to
        take a lease, shared by the batches of the shards, so that a take and a renewal
        of two layouts never pass each other (SQLite has one writer at a time)."""
        session = session or self.session
        if session.get_bind().dialect.name != "postgresql":
            return
        query = select(Lock.name).where(Lock.name == self.base)
        session.execute(query.with_for_update(read=not for_update))

    def _other_layout(self, now: datetime, session: Session | None = None) -> bool:
        """A live lease of this instance held by a scanner of another shard count."""
        names = [self.base] + [f"{self.base}#{k}" for k in range(MOST_SHARDS)]
        held = (session or self.session).execute(select(Lock.name, Lock.owner).where(
            Lock.name.in_([n for n in names if n != self.name]),
            Lock.owner.is_not(None), Lock.until >= now)).all()
        return any((self.shard.count > 1) if name == self.base
                   else owner.rpartition("/")[2] != str(self.shard.count)
                   for name, owner in held)

    def keep_alive(self) -> None:
        now = self.clock()
        if self._renewed is not None and now - self._renewed < self.seconds / 3:
            return
        try:
            self.check(self.session, now)
            self.session.commit()
        except BaseException:
            self.session.rollback()
            raise

    def release(self, next_due: datetime) -> None:
        """Give the lease up; the scheduler publishes the next scan at ``next_due``."""
        self.session.rollback()
        self.session.execute(update(Lock).where(
            Lock.name == self.name, Lock.owner == self.owner,
        ).values(owner=None, until=next_due))
        self.session.commit()


# --- the scan -----------------------------------------------------------------------

@dataclass
class ScanReport:
    ran: bool = False
    reason: str = ""
    messages: list[int] = field(default_factory=list)
    retry_at: datetime | None = None  # a failed fetch tried again then (collection.py)


class SourceRunner:
    """Starts and scans the scheduled sources of this process. A plugin object lives as
    long as the process and its configuration; a changed configuration starts anew.
    The scan lease is ``lease_seconds`` when given, else the ``scan_lease_seconds``
    delivery setting read at each scan."""

    def __init__(self, session_factory: Callable[[], Session], registry,
                 store: PayloadStore, owner: str, *, clock: Callable[[], datetime] = utcnow,
                 should_stop: Callable[[], bool] = lambda: False,
                 lease_seconds: float | None = None, batch_size: int = 100):
        self.session_factory, self.registry, self.store = session_factory, registry, store
        self.owner, self.clock, self.should_stop = owner, clock, should_stop
        self.lease_seconds, self.batch_size = lease_seconds, batch_size
        self._plugins: dict[str, tuple[dict, Any]] = {}

    def scan(self, instance: str, shard: int | None = None) -> ScanReport:
        """One scan of ``instance`` (of its shard ``shard`` when it has more than one)
        under its lease; nothing if another process scans it, or if the instance's
        shard count no longer has that shard (the task was published before a change)."""
        with self.session_factory() as session:
            seconds = self._lease_seconds(session)
            row = self._instance(session, instance)  # ends the reading transaction
            if row is None:
                return ScanReport(reason=f"{instance} is not an enabled scheduled source")
            shards = shards_of(row.config)
            if (shard or 0) >= len(shards) or (shard is None) != (len(shards) == 1):
                return ScanReport(reason=f"{instance} has {len(shards)} shard(s) now; "
                                         f"shard {shard} is not one of them")
            part = shards[shard or 0]
            started = self.clock()
            lease = ScanLease(session, instance, f"{self.owner}:{uuid.uuid4().hex[:8]}",
                              seconds, self.clock, part)
            if not lease.take(started):
                where = instance if part.count == 1 else f"{instance} ({part})"
                return ScanReport(reason=f"{where} is being scanned elsewhere")
            report = None
            try:
                report = self._scan(session, row, lease)
                return report
            finally:
                # a failed fetch the retry policy tries again: at its time when that
                # comes before the next scan (never later: the schedule stands)
                due = started + timedelta(seconds=polling_interval(row.config))
                lease.release(min(due, report.retry_at or due) if report else due)

    def _lease_seconds(self, session: Session) -> float:
        if self.lease_seconds is not None:
            return self.lease_seconds
        return float(load_settings(session).scan_lease_seconds)

    def _scan(self, session: Session, row: PluginInstance, lease: ScanLease) -> ScanReport:
        plugin = self.start(session, row)
        if plugin is None:
            return ScanReport(reason=f"{row.name} could not start")
        intake = SourceIntake(session, self.store, row.name, fence=lease, clock=self.clock,
                              should_stop=self.should_stop, batch_size=self.batch_size,
                              checks=IntakeChecks.of(row), config=row.config,
                              shard=lease.shard,
                              retry_policy=merge(row.retry_policy, getattr(
                                  plugin, "collection_retry_policy", RECORD_AT_ONCE)))
        report = ScanReport(ran=True)
        try:
            plugin.poll(intake)
            intake.flush()
            report.reason, report.retry_at = intake.failure, intake.retry_at
        except (ScanStopped, LeaseLost) as exc:
            report.reason = str(exc)
        except Exception as exc:
            log.exception("%s: the scan failed", row.name)
            report.reason = f"the scan failed: {exc}"
        finally:
            intake.discard()
        report.messages = intake.made
        return report

    def _instance(self, session: Session, name: str) -> PluginInstance | None:
        row = session.scalar(select(PluginInstance).where(
            PluginInstance.name == name, PluginInstance.enabled.is_(True),
            PluginInstance.state != InstanceState.STOPPED))
        session.commit()
        if row is None or row.type not in self.registry:
            return None
        return row if is_scheduled_source(self.registry.get(row.type)) else None

    def start(self, session: Session, row: PluginInstance):
        """The started plugin of ``row`` in this process, starting it if need be; None
        (and the instance in state Error with ``plugin_failed``) if it cannot start."""
        cached = self._plugins.get(row.name)
        if cached is not None and cached[0] == row.config:
            return cached[1]
        self._plugins.pop(row.name, None)
        now = self.clock()
        try:
            plugin = self.registry.get(row.type)(row.name, dict(row.config))
            plugin.start()
        except Exception as exc:
            reason = str(exc) if isinstance(exc, PluginStartError) else repr(exc)
            log.error("%s cannot start: %s", row.name, reason)
            mark_instance_error(session, row.name, reason, now)
            session.commit()
            return None
        mark_running(session, row.name, now)
        session.commit()
        self._plugins[row.name] = (dict(row.config), plugin)
        return plugin

    def running(self) -> list[str]:
        """The sources this process has started."""
        return list(self._plugins)

    def forget(self, names: set[str]) -> None:
        """Drop the started plugins of stopped instances; a start starts them anew."""
        for name in names:
            self._plugins.pop(name, None)

    def start_all(self) -> dict[str, bool]:
        """Start every enabled scheduled source (process start); name -> started."""
        with self.session_factory() as session:
            names = sorted(_scheduled_enabled(session, self.registry))
            return {name: self.start(session, self._instance(session, name)) is not None
                    for name in names}


def _scheduled_enabled(session: Session, registry) -> list[str]:
    rows = session.execute(select(PluginInstance.name, PluginInstance.type).where(
        PluginInstance.enabled.is_(True),
        PluginInstance.state != InstanceState.STOPPED)).all()
    return [n for n, t in rows if t in registry and is_scheduled_source(registry.get(t))]
