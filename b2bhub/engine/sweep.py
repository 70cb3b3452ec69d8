"""The sweep (SPEC 5): every 5 s, in one process at a time.

Each step is a bounded query on an index that starts with the state, so its cost follows
what is due, not the size of the tables. Deliveries of a process known dead go back in
the run after it is known dead (``presence.known_dead``: 15 s without a heartbeat by the
database's clock), so after kill -9 of a worker its targets deliver again within about
25 s; the lease stays the bound for an owner alive but hung. The guard is a PostgreSQL
advisory lock held for the sweep; on SQLite, a lease row in ``locks`` taken by a
conditional UPDATE. The probe scheduler (``b2bhub.engine.probes``) runs under a guard
of its own, the same kind.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import insert, or_, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from b2bhub.engine import faults, presence
from b2bhub.engine.machine import receipts, recovery, sequence, wake
from b2bhub.engine.settings import DeliverySettings, load_settings
from b2bhub.engine.wakeups import after_commit
from b2bhub.models import Lock

log = logging.getLogger(__name__)
ADVISORY_KEY = 0x62326268  # "b2bh"
#: the advisory lock key of each guarded job; the SQLite lease row has the job's name
GUARD_KEYS = {"sweep": ADVISORY_KEY, "probes": ADVISORY_KEY + 1}
BATCH = 1000


@dataclass
class SweepReport:
    ran: bool = False
    leases_expired: int = 0
    owners_gone: int = 0
    receipts_overdue: int = 0
    parked: int = 0
    stalled: int = 0
    woken: int = 0


def run_sweep(session: Session, now: datetime, owner: str,
              settings: DeliverySettings | None = None, batch: int = BATCH) -> SweepReport:
    """Run every step once under the guard; each step commits its own transactions."""
    report = SweepReport()
    with SweepGuard(session, owner, now) as held:
        if not held:
            return report
        report.ran = True
        faults.pause("sweeping")
        settings = settings or load_settings(session)
        report.leases_expired = _loop(session, lambda: recovery.expire_leases(
            session, now, batch))
        report.owners_gone = _put_back_from_dead_owners(session, now, batch)
        report.receipts_overdue = _loop(session, lambda: receipts.fail_overdue_receipts(
            session, now, batch))
        report.parked = _loop(session, lambda: sequence.park_blocked(session, now, batch))
        report.stalled = _loop(session, lambda: wake.stall_unclaimed(
            session, now, settings, batch))
        report.woken = _loop(session, lambda: _wake(session, now, settings, batch))
    return report


def _put_back_from_dead_owners(session: Session, now: datetime, batch: int) -> int:
    """Deliveries of processes known dead go back at once (``presence.known_dead``); the
    database's clock judges the heartbeats."""
    db_now = presence.database_now(session)
    return _loop(session, lambda: recovery.put_back_from_dead_owners(session, now, db_now,
                                                                     batch))


def _wake(session: Session, now: datetime, settings: DeliverySettings, batch: int) -> int:
    wakeups = wake.wake_due(session, now, settings, batch)
    after_commit(session, wakeups)
    return len(wakeups)


def _loop(session: Session, step) -> int:
    """Repeat a bounded step, one transaction each, until it finds nothing more."""
    total = 0
    for _ in range(100):
        count = step()
        session.commit()
        total += count
        if count == 0:
            break
    return total


class SweepGuard:
    """Held by at most one process at a time. ``name`` says which job it guards (the
    sweep by default; the lease row's name), ``key`` its advisory lock key (by default
    the name's in :data:`GUARD_KEYS`); a job that runs longer than the lease calls
    :meth:`renew` as it goes."""

    lease = timedelta(seconds=60)

    def __init__(self, session: Session, owner: str, now: datetime, name: str = "sweep",
                 key: int | None = None):
        self.session, self.owner, self.now = session, owner, now
        self.name, self.key = name, GUARD_KEYS[name] if key is None else key
        self.postgres = session.get_bind().dialect.name == "postgresql"
        self.connection = None
        self.held = False

    def __enter__(self) -> bool:
        if self.postgres:
            # a connection of its own keeps the session-level lock across the commits
            self.connection = self.session.get_bind().connect()
            self.held = bool(self.connection.execute(
                text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar())
            self.connection.commit()
        else:
            self.held = self._take_lease()
        return self.held

    def _take_lease(self) -> bool:
        until = self.now + self.lease
        try:
            self.session.execute(insert(Lock).values(name=self.name, owner=None, until=None)
                                 .prefix_with("OR IGNORE"))
        except IntegrityError:
            self.session.rollback()
        taken = self.session.execute(update(Lock).where(
            Lock.name == self.name,
            or_(Lock.until.is_(None), Lock.until < self.now, Lock.owner == self.owner),
        ).values(owner=self.owner, until=until)).rowcount
        self.session.commit()
        return taken == 1

    def renew(self, now: datetime) -> None:
        """Extend the lease from ``now``, in the caller's transaction (SQLite only: the
        advisory lock lasts as long as its connection)."""
        if not self.postgres and self.held:
            self.session.execute(update(Lock).where(
                Lock.name == self.name, Lock.owner == self.owner).values(
                until=now + self.lease))

    def __exit__(self, *exc) -> None:
        if self.postgres and self.connection is not None:
            if self.held:
                self.connection.execute(text("SELECT pg_advisory_unlock(:k)"),
                                        {"k": self.key})
                self.connection.commit()
            self.connection.close()
        elif self.held:
            self.session.rollback()
            self.session.execute(update(Lock).where(
                Lock.name == self.name, Lock.owner == self.owner).values(until=None))
            self.session.commit()
