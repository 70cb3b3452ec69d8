"""The nightly cleanup (SPEC 13): messages past their source's retention, and payload
files no row references.

Run by beat at the ``cleanup_time`` setting (UTC; a job that ticks every minute starts
it once the time has come and no run finished since that moment today), or by hand
with ``b2bhub cleanup [--dry-run]``. One process at a time: the guard of the sweep
under a name and key of its own.

What it removes, in order:

1. Messages in a final status (:data:`~b2bhub.domain.retention.FINAL_STATUSES`) created
   longer ago than their source's retention, and never one with a delivery still open
   (queued, in progress, retrying, awaiting a receipt, deferred, stalled), however old.
   Each batch is one short transaction that deletes whole messages (as many as fit in
   :data:`BATCH_BUDGET`, 100 ms, by what the last batch took: its locks are held that
   long; :class:`~b2bhub.domain.retention.BatchSizer`): their deliveries, payload
   rows and AS2 records go by ``ON DELETE CASCADE``, their history lines (no foreign
   key: :class:`~b2bhub.models.HistoryLine`) and the alerts that name them by a
   statement each in the same list; the run's counts are updated in that same
   transaction. A run killed at any point leaves whole messages or none, and the next
   run goes on from where the data is (there is no cursor to lose). The bodies of
   refused and unattributable requests are stored as the payloads of a message (status
   Refused) or as a receipt stage of the message they name, so they go with it.
2. After each batch commits, the files of its payloads that no row references any
   more; then, once per run, every stored file that no row references (a leak left by a
   process that died between writing a payload and committing it, or by a run killed
   after its batch commit). Only files older than ``orphan_grace`` seconds are removed,
   so a payload written before its transaction commits is never taken, and a put of the
   same content racing the removal keeps it (a lock of the store between the two, see
   :meth:`b2bhub.payloads.store.PayloadStore.remove_unreferenced`).
3. The steps in :data:`EXTRA_STEPS` (none in the core; a plugin's own expiring rows,
   such as the HTTP receiver's Idempotency-Keys, go by a periodic job of its own).

Plain Python and SQLAlchemy: no Flask, no Celery.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import (
    ARRAY,
    String,
    cast,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.orm import Session

from b2bhub.domain.retention import (
    FINAL_STATUSES,
    OPEN_STATES,
    BatchSizer,
    cutoff,
    effective_days,
)
from b2bhub.engine.history import add_line
from b2bhub.engine.settings import DeliverySettings, load_settings
from b2bhub.engine.sweep import SweepGuard
from b2bhub.models import (
    Alert,
    CleanupRun,
    Delivery,
    HistoryLine,
    Lock,
    Message,
    Payload,
    PluginInstance,
    utcnow,
)
from b2bhub.payloads.store import PayloadMissing, PayloadStore

log = logging.getLogger(__name__)
ADVISORY_KEY = 0x62326263  # "b2bc"
LOCK_NAME = "cleanup"
#: messages deleted per transaction
BATCH = 500  # the first batch's size; then sized to BATCH_BUDGET (BatchSizer)
#: seconds a deleting transaction may take: it holds the locks of the rows it deletes
BATCH_BUDGET = 0.1
#: seconds a payload file must be old before the cleanup may remove it unreferenced
ORPHAN_GRACE = 3600.0

#: Further steps of a run: ``step(session, now) -> rows removed``, each committing its own
#: bounded transactions.
EXTRA_STEPS: list[Callable[[Session, datetime], int]] = []

_FINAL = sorted(FINAL_STATUSES)
_OPEN = sorted(OPEN_STATES)

#: What keeps a payload file alive: (message id, digest, size) columns of rows that go
#: with their message (ON DELETE CASCADE). The core's payload rows; a plugin adds those of
#: its own tables through ``Plugin.payload_references`` (AS2: the stored MDN of a received
#: message), handed in as ``references`` (:func:`plugin_references`).
_CORE_REFERENCES = ((Payload.message_id, Payload.digest, Payload.size),)


def plugin_references(registry) -> tuple:
    """The payload references the installed plugin types declare."""
    found = []
    for cls in registry.types().values():
        declared = getattr(cls, "payload_references", None)  # a plain class may lack it
        for message_id, digest in (declared() if declared else []):
            found.append((message_id, digest, None))
    return tuple(found)


@dataclass
class CleanupReport:
    """What a run removed (or, dry, would remove). ``ran`` is False when another
    process holds the guard."""

    ran: bool = False
    dry_run: bool = False
    run_id: int | None = None
    messages: int = 0
    message_bytes: int = 0  # the size of the removed messages' payload rows
    files: int = 0
    bytes: int = 0  # what left the disk (or would)
    orphan_files: int = 0  # of which no removed message had referenced
    budget: float | None = BATCH_BUDGET  # seconds a deleting transaction may take
    # (None: every batch of the size given)
    largest_batch: int = 0  # messages, the most one transaction deleted
    batches: int = 0  # deleting transactions
    extra: dict[str, int] = field(default_factory=dict)
    references: tuple = _CORE_REFERENCES  # what keeps a payload file alive

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        if not self.ran:
            return "cleanup not run: another process is running it"
        return (f"cleanup {verb} {self.messages} messages ({self.message_bytes} bytes of "
                f"payload rows), {self.files} payload files ({self.bytes} bytes on disk, "
                f"{self.orphan_files} of them referenced by no row before the run)")


def retention_cutoffs(session: Session, settings: DeliverySettings, now: datetime
                      ) -> tuple[dict[str, datetime | None], datetime | None]:
    """Each source instance's cutoff (None: kept forever), and the default's (for the
    messages of a source no longer configured)."""
    default = cutoff(now, settings.retention_days)
    rows = session.execute(select(PluginInstance.name, PluginInstance.retention_days))
    return ({name: cutoff(now, effective_days(days, settings.retention_days))
             for name, days in rows}, default)


def run_cleanup(session: Session, store: PayloadStore, now: datetime, owner: str, *,
                dry_run: bool = False, trigger: str = "schedule", actor: str = "cleanup",
                batch: int = BATCH, budget: float | None = BATCH_BUDGET,
                orphan_grace: float = ORPHAN_GRACE,
                settings: DeliverySettings | None = None,
                references: tuple = ()) -> CleanupReport:
    """One run under the guard (see the module docstring). ``references``: the payload
    references of plugins' tables (:func:`plugin_references`)."""
    report = CleanupReport(dry_run=dry_run, references=_CORE_REFERENCES + tuple(references),
                           budget=budget)
    guard = SweepGuard(session, owner, now, name=LOCK_NAME, key=ADVISORY_KEY)
    guard.lease = timedelta(minutes=2)
    if not guard.postgres:
        _release_dead_lease(session)
    with guard as held:
        if not held:
            return report
        report.ran = True
        settings = settings or load_settings(session)
        if not dry_run:
            report.run_id = _start_run(session, now, owner, trigger)
        try:
            _remove_messages(session, store, guard, settings, now, report, batch,
                             orphan_grace)
            _remove_orphans(session, store, guard, report, orphan_grace)
            if not dry_run:
                store.remove_stale_temp()
                for step in EXTRA_STEPS:
                    report.extra[step.__name__] = step(session, now)
                    session.commit()
        except BaseException as exc:
            session.rollback()
            if report.run_id is not None and isinstance(exc, Exception):
                _finish_run(session, report, "failed", f"{type(exc).__name__}: {exc}",
                            actor)
            raise
        if not dry_run:
            _finish_run(session, report, "finished", "", actor)
    return report


def _release_dead_lease(session: Session) -> None:
    """On SQLite (one host: the database is a local file) a run killed mid-way leaves
    its lease behind; a lease whose process is gone from this host is void at once, so
    the next run need not wait for it to expire. (PostgreSQL's advisory lock goes with
    the connection of the process that held it.)"""
    owner = session.scalar(select(Lock.owner).where(Lock.name == LOCK_NAME,
                                                    Lock.until.is_not(None)))
    host, _, rest = (owner or "").partition(":")
    pid = rest.partition(":")[0]
    if host == socket.gethostname() and pid.isdigit() and not _alive(int(pid)):
        session.execute(update(Lock).where(Lock.name == LOCK_NAME, Lock.owner == owner)
                        .values(until=None))
    session.commit()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_due(session: Session, now: datetime, settings: DeliverySettings) -> bool:
    """Whether the scheduled run is due: today's ``cleanup_time`` (UTC) has come and no
    scheduled run has finished (or failed) since then. A run whose process died counts
    for nothing, so the next tick starts another that finishes the work."""
    hours, minutes = (int(part) for part in settings.cleanup_time.split(":"))
    moment = now.replace(hour=hours, minute=minutes, second=0, microsecond=0)
    if now < moment:
        return False
    done = session.scalar(select(exists().where(
        CleanupRun.trigger == "schedule", CleanupRun.started_at >= moment,
        CleanupRun.state.in_(("finished", "failed")))))
    return not done


def latest_runs(session: Session, limit: int = 10) -> list[CleanupRun]:
    return list(session.scalars(select(CleanupRun).order_by(CleanupRun.id.desc())
                                .limit(limit)))


# --- the run record ------------------------------------------------------------------

def _start_run(session: Session, now: datetime, owner: str, trigger: str) -> int:
    """A new run row; the runs left 'running' by a dead process (the guard is ours, so
    no other run is alive) become 'interrupted'."""
    session.execute(update(CleanupRun).where(CleanupRun.state == "running").values(
        state="interrupted", finished_at=now))
    run = CleanupRun(started_at=now, state="running", trigger=trigger, owner=owner)
    session.add(run)
    session.commit()
    return run.id


def _count(session: Session, report: CleanupReport, messages: int = 0, files: int = 0,
           bytes_: int = 0) -> None:
    """Add to the run's counts, in the caller's transaction."""
    if report.run_id is not None and (messages or files or bytes_):
        session.execute(update(CleanupRun).where(CleanupRun.id == report.run_id).values(
            messages_removed=CleanupRun.messages_removed + messages,
            files_removed=CleanupRun.files_removed + files,
            bytes_removed=CleanupRun.bytes_removed + bytes_))


def _finish_run(session: Session, report: CleanupReport, state: str, error: str,
                actor: str) -> None:
    finished = utcnow()
    session.execute(update(CleanupRun).where(CleanupRun.id == report.run_id).values(
        state=state, finished_at=finished, error=error[:4000]))
    text = report.summary() if state == "finished" else f"cleanup failed: {error}"
    add_line(session, None, "cleanup", f"{actor}: {text}", actor=actor,
             data={"run": report.run_id, "state": state, "messages": report.messages,
                   "bytes": report.bytes, "files": report.files}, now=finished)
    session.commit()


# --- messages ------------------------------------------------------------------------

def _remove_messages(session: Session, store: PayloadStore, guard: SweepGuard,
                     settings: DeliverySettings, now: datetime, report: CleanupReport,
                     batch: int, grace: float) -> None:
    cutoffs, default = retention_cutoffs(session, settings, now)
    session.commit()
    sizer = BatchSizer(batch, budget=report.budget)
    for ids in _candidates(session, cutoffs, default, sizer):
        if report.dry_run:
            _dry_batch(session, store, ids, report, grace)
            continue
        began = time.perf_counter()
        digests = _delete_batch(session, ids, report)
        guard.renew(utcnow())
        session.commit()
        sizer.record(len(ids), time.perf_counter() - began)
        report.largest_batch = max(report.largest_batch, len(ids))
        report.batches += 1
        if digests:
            _remove_files(session, store, report, digests, grace)


def _candidates(session: Session, cutoffs: dict[str, datetime | None],
                default: datetime | None, sizer: BatchSizer) -> Iterator[list[int]]:
    """Batches of ids of final messages past retention, oldest first, each of the size
    ``sizer`` holds when it is read.

    Walks the (created_at, id) index up to the latest cutoff in use, with a cursor
    that passes over what it has read, so messages kept (an open delivery, a longer
    retention) are read once per run, not once per batch. Each batch is read in a
    transaction of its own and deleted in the next one, which checks every condition
    again."""
    forever = [name for name, moment in cutoffs.items() if moment is None]
    moments = [m for m in (*cutoffs.values(), default) if m is not None]
    if not moments:
        return
    latest = max(moments)
    cursor: tuple[datetime, int] | None = None
    while True:
        query = (select(Message.id, Message.source, Message.created_at)
                 .where(Message.created_at < latest, Message.status.in_(_FINAL))
                 .order_by(Message.created_at, Message.id).limit(sizer.size))
        if forever:
            query = query.where(Message.source.not_in(forever))
        if cursor is not None:
            query = query.where(tuple_(Message.created_at, Message.id) > tuple_(*cursor))
        rows = session.execute(query).all()
        session.commit()
        if not rows:
            return
        cursor = (rows[-1].created_at, rows[-1].id)
        ids = [row.id for row in rows
               if (limit := cutoffs.get(row.source, default)) is not None
               and row.created_at < limit]
        if ids:
            yield ids


def _removable(ids: list[int]):
    """The condition a message must still meet when it is deleted.

    The open-delivery check goes by the message's own deliveries: ``state || ''`` keeps
    PostgreSQL from taking the state index instead, which it did when its statistics
    said open deliveries were few, and then compared every message of the batch with
    every open delivery of the hub (a backlog of 66,000 queued made 500 messages take
    3.4 s instead of 17 ms)."""
    return (Message.id.in_(ids), Message.status.in_(_FINAL),
            ~exists().where(Delivery.message_id == Message.id,
                            Delivery.state.concat("").in_(_OPEN)))


def _message_digests(session: Session, ids: list[int], refs: tuple
                     ) -> list[tuple[int, str, int]]:
    """(message id, digest, size) of every file the messages' rows reference."""
    out: list[tuple[int, str, int]] = []
    for owner, digest, size in refs:
        columns = (owner, digest, size if size is not None else literal(0))
        for chunk in _chunks(ids, 500):
            out += [(mid, d, s or 0) for mid, d, s in session.execute(
                select(*columns).where(owner.in_(chunk), digest.is_not(None)))]
    return out


def _delete_batch(session: Session, ids: list[int], report: CleanupReport) -> set[str]:
    """Delete the messages of ``ids`` that are still removable, in the caller's
    transaction (rows that reference them by a foreign key go by cascade; history lines
    and alerts by a statement of their own); the digests they held."""
    held = _message_digests(session, ids, report.references)
    removed = set(session.scalars(delete(Message).where(*_removable(ids))
                                  .returning(Message.id)
                                  .execution_options(synchronize_session=False)))
    if not removed:
        return set()
    for model in (HistoryLine, Alert):
        session.execute(delete(model).where(model.message_id.in_(removed))
                        .execution_options(synchronize_session=False))
    report.messages += len(removed)
    report.message_bytes += sum(size for mid, _d, size in held
                                if mid in removed and size)
    _count(session, report, messages=len(removed))
    return {digest for mid, digest, _s in held if mid in removed}


def _dry_batch(session: Session, store: PayloadStore, ids: list[int],
               report: CleanupReport, grace: float) -> None:
    """Count what :func:`_delete_batch` and the file removal after it would remove."""
    gone = set(session.scalars(select(Message.id).where(*_removable(ids))))
    held = _message_digests(session, list(gone), report.references)
    report.messages += len(gone)
    report.message_bytes += sum(size for _m, _d, size in held)
    for digest in _unreferenced(session, {d for _m, d, _s in held}, report.references,
                                exclude=gone):
        if store.older_than(digest, grace):
            report.files += 1
            report.bytes += _file_size(store, digest)
    session.commit()


# --- payload files -------------------------------------------------------------------

def _referenced(session: Session, digests: Iterable[str], refs: tuple,
                exclude: Iterable[int] = ()) -> set[str]:
    """Which of ``digests`` a committed row references (a dry run leaves out the rows of
    the messages it would remove)."""
    digests, exclude = list(digests), list(exclude)
    found: set[str] = set()
    postgres = session.get_bind().dialect.name == "postgresql"
    for owner, column, _size in refs:
        for chunk in _chunks(digests, 500):
            # Each digest asked whether one row holds it (EXISTS stops at the first),
            # not the distinct digests of every row holding them: a payload shared by
            # many messages (content-addressed: the same document sent daily) made that
            # read every one of its rows, live and deleted, once per batch.
            if postgres:
                digest = func.unnest(cast(chunk, ARRAY(String))).column_valued("wanted_digest")
            else:
                digest = func.json_each(json.dumps(chunk)).table_valued("value").c.value
            holds = [column == digest]
            if exclude:
                holds.append(or_(owner.is_(None), owner.not_in(exclude)))
            found.update(session.scalars(select(digest).where(exists().where(*holds))))
    return found


def _unreferenced(session: Session, digests: set[str], refs: tuple,
                  exclude: Iterable[int] = ()) -> set[str]:
    return digests - _referenced(session, digests, refs, exclude)


def _remove_files(session: Session, store: PayloadStore, report: CleanupReport,
                  digests: Iterable[str], grace: float, orphans: bool = False) -> None:
    """Remove the files of ``digests`` that no row references and that are older than
    the grace period (the store checks the age again under its lock)."""
    def referenced(_digest: str) -> bool:
        return False  # just asked, for the whole chunk

    candidates = _unreferenced(session, set(digests), report.references)
    session.commit()
    limit = time.time() - grace
    files = bytes_ = 0
    for digest in sorted(candidates):
        size = store.remove_unreferenced(digest, referenced, limit)
        if size is not None:
            files, bytes_ = files + 1, bytes_ + size
    report.files += files
    report.bytes += bytes_
    if orphans:
        report.orphan_files += files
    _count(session, report, files=files, bytes_=bytes_)
    session.commit()


def _remove_orphans(session: Session, store: PayloadStore, guard: SweepGuard,
                    report: CleanupReport, grace: float) -> None:
    """Every stored file older than the grace period that no row references; on the
    way, the store's total (what is left of it) for the storage report."""
    walked = _Walk(grace)
    for chunk in _chunks(walked.old(store), 500):
        if report.dry_run:
            for digest in _unreferenced(session, set(chunk), report.references):
                report.files += 1
                report.orphan_files += 1
                report.bytes += _file_size(store, digest)
            session.commit()
            continue
        before = report.bytes, report.files
        _remove_files(session, store, report, chunk, grace, orphans=True)
        walked.files -= report.files - before[1]
        walked.bytes -= report.bytes - before[0]
        guard.renew(utcnow())
        session.commit()
    if report.run_id is not None:
        files, bytes_ = referenced_totals(session)
        session.execute(update(CleanupRun).where(CleanupRun.id == report.run_id).values(
            store_files=walked.files, store_bytes=walked.bytes, referenced_files=files,
            referenced_bytes=bytes_))
        session.commit()


class _Walk:
    """Walks the store once: counts every file, hands on the old ones."""

    def __init__(self, grace: float):
        self.grace, self.files, self.bytes = grace, 0, 0

    def old(self, store: PayloadStore) -> Iterator[str]:
        for digest, size, age in store.walk():
            self.files += 1
            self.bytes += size
            if age > self.grace:
                yield digest


def referenced_totals(session: Session) -> tuple[int, int]:
    """The distinct payload files the rows reference, and their bytes."""
    digests = select(Payload.digest, func.max(Payload.size).label("size")).group_by(
        Payload.digest).subquery()
    files, bytes_ = session.execute(select(func.count(), func.coalesce(
        func.sum(digests.c.size), 0)).select_from(digests)).one()
    # (an AS2 receipt that as2_inbound names is also its message's receipt stage)
    return int(files), int(bytes_)


def _file_size(store: PayloadStore, digest: str) -> int:
    try:
        return store.size(digest)
    except PayloadMissing:
        return 0


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    chunk: list = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
