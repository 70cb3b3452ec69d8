"""The context a source instance stores messages through (DESIGN "Sources").

Payload stages go to the payload store first (a batch's files made durable together,
before the transaction); then one transaction inserts the messages of the batch, their
deliveries and history, and a ``poller_pickups`` row per file (path, size, mtime,
sha256). Files are removed only after that commit (while the next batch is read), and
their rows deleted after the removals are durable. A process that dies in between
leaves rows behind: the next scan removes each file that still matches its row instead
of storing it again. The scan is therefore safe to kill at any point: a file is stored
once and never lost. A file the source keeps in place (``keep``) keeps its row as the
memory that it was taken, until it is gone or changed (:meth:`SourceIntake.taken`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from b2bhub.domain.retry import RECORD_AT_ONCE, RetryPolicy
from b2bhub.engine import collection
from b2bhub.engine.dispatch import NewMessage
from b2bhub.engine.envelope_checks import SOURCE, IntakeChecks, store_checked_many
from b2bhub.engine.history import connection
from b2bhub.engine.inspection import inspect_bytes, message_rows
from b2bhub.engine.openpgp_stages import Unpacked, Unpacker
from b2bhub.engine.pickups import removals_durable, removed, same_file
from b2bhub.engine.rows import insert_rows
from b2bhub.engine.staging import StagingRead
from b2bhub.engine.stale_temp import remove_stale_temp
from b2bhub.models import Party, PollerPickup, Setting, utcnow
from b2bhub.payloads.store import PayloadBatch, PayloadStore, StoredPayload
from b2bhub.plugin import WHOLE, PickedFile, Shard

log = logging.getLogger(__name__)
BATCH_SIZE = 100


#: the core's own key in a source's state row: its open collection episode
EPISODE_KEY = "_collection_error"


def state_key(instance: str) -> str:
    """The settings row that holds a source instance's own state."""
    return f"source_state:{instance}"


class ScanStopped(Exception):
    """The process is stopping; what was committed stands, the rest waits."""


class Fence:
    """What a batch commit is fenced by (the scan lease); the default fences nothing."""

    def check(self, session: Session, now: datetime) -> None:
        """Renew inside the batch's transaction; raise if the scan may no longer commit."""

    def keep_alive(self) -> None:
        """Renew in a transaction of its own if due; called before each file is read
        and during long reads, so however long a batch takes to read, it keeps the
        right to commit."""


@dataclass
class _Staged:
    file: PickedFile
    from_party: str
    to_party: str
    filename: str
    stored: StoredPayload
    correlation_id: str | None = None
    rows: list[tuple] | None = None  # its inspection's, from the bytes read (staging.py)
    got: Unpacked | None = None  # its stages, rows and lines (openpgp_stages.Unpacker)


class SourceIntake:
    """The :class:`b2bhub.plugin.SourceContext` of one source instance for one scan."""

    def __init__(self, session: Session, store: PayloadStore, instance_name: str, *,
                 fence: Fence | None = None, clock: Callable[[], datetime] = utcnow,
                 should_stop: Callable[[], bool] = lambda: False,
                 batch_size: int = BATCH_SIZE, parties_from: str = SOURCE,
                 checks: IntakeChecks | None = None, config: dict | None = None,
                 retry_policy: RetryPolicy = RECORD_AT_ONCE, shard: Shard = WHOLE):
        self.session, self.store, self.instance_name = session, store, instance_name
        self.shard = shard  # the part of the source this scan takes (SourceContext)
        #: how failed fetches are retried (b2bhub.engine.collection); the next try's time
        self.retry_policy, self.retry_at = retry_policy, None
        self.fence, self.clock, self.should_stop = fence or Fence(), clock, should_stop
        self.unpack = Unpacker(session, store, config, keep_alive=self.fence.keep_alive)
        self.batch_size, self.checks = batch_size, checks or IntakeChecks(parties_from)
        self.made: list[int] = []
        self._staged: list[_Staged] = []
        self._payloads: PayloadBatch = store.batch()
        self._parties: dict[str, str] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._removal: Future[list[int]] | None = None  # the last batch's files
        self._removing: set[str] = set()  # their relative paths
        self._state: dict | None = None  # the state row's object, once read
        #: the last failed fetch's text (``record_collection_error``), "" for none
        self.failure = ""

    # parties -----------------------------------------------------------------
    def party_kind(self, name: str) -> str | None:
        return self._party_kinds().get(name)

    def organizations(self) -> list[str]:
        return sorted(n for n, kind in self._party_kinds().items() if kind == "organization")

    def _party_kinds(self) -> dict[str, str]:
        """All parties, read once per scan (a scan is one pickup time)."""
        if self._parties is None:
            self._parties = dict(self.session.execute(select(Party.name, Party.kind)).all())
            self.session.commit()
        return self._parties

    def log(self, text: str) -> None:
        log.info("%s: %s", self.instance_name, text)

    # the instance's own state ------------------------------------------------
    def load_state(self) -> dict:
        """What this source instance saved last (see :meth:`save_state`); {} if nothing."""
        value = self._stored_state()
        return {k: v for k, v in value.items() if k != EPISODE_KEY}

    def save_state(self, state: dict) -> None:
        """Keep a small JSON object for this instance across scans and restarts (e.g.
        the ETag a collector last saw), in a transaction of its own, under the lease.
        The core's own key in the row (an open collection episode) is kept."""
        kept = {k: v for k, v in self._stored_state().items() if k == EPISODE_KEY}
        value = {k: v for k, v in state.items() if k != EPISODE_KEY} | kept
        self._write_state(lambda now: value)

    def _stored_state(self) -> dict:
        """The row's whole object, read once per scan (the lease keeps other writers off)."""
        if self._state is None:
            value = self.session.scalar(select(Setting.value).where(
                Setting.key == state_key(self.instance_name)))
            self.session.commit()
            self._state = dict(value) if isinstance(value, dict) else {}
        return self._state

    def _write_state(self, make: Callable[[datetime], dict]) -> None:
        """One transaction under the lease: ``make(now)`` writes what it records and
        returns the row's new whole object, stored with it."""
        now = self.clock()
        try:
            self.fence.check(self.session, now)
            value = dict(make(now))
            key = state_key(self.instance_name)
            row = self.session.get(Setting, key) or Setting(key=key)
            row.value = value
            self.session.add(row)
            self.session.commit()
        except BaseException:
            self.session.rollback()
            self._state = None
            raise
        self._state = value

    # collection errors (b2bhub.engine.collection) ------------------------------
    def record_collection_error(self, reason: str, from_party: str, to_party: str, *,
                                answer_start: str = "", filename: str | None = None,
                                error_class: str | None = None) -> int | None:
        """A fetch failed: counted while the retry policy retries, then a Collection
        error message for the episode, counted on it for the next ones; its id."""
        stored = self._stored_state()
        new = NewMessage(source=self.instance_name, from_party=from_party,
                         to_party=to_party, stages={}, original_filename=filename)
        self._write_state(lambda now: {**stored, EPISODE_KEY: collection.failed(
            self.session, stored.get(EPISODE_KEY), new, reason, answer_start, now,
            self.retry_policy, error_class)})
        self.failure = collection.failure_text(reason, answer_start)
        self.retry_at = collection.retry_at(self._state[EPISODE_KEY])
        return self._state[EPISODE_KEY]["message_id"]

    def collection_succeeded(self) -> None:
        """A fetch succeeded: the open episode, if any, ends (a line, the alert
        resolved). Costs nothing when none is open."""
        stored = self._stored_state()
        episode = stored.get(EPISODE_KEY)
        if episode is None:
            return

        def end(now: datetime) -> dict:
            collection.succeeded(self.session, episode, self.instance_name, now)
            return {k: v for k, v in stored.items() if k != EPISODE_KEY}

        self._write_state(end)

    # one message -------------------------------------------------------------
    def store_and_dispatch(self, payload: IO[bytes] | bytes, from_party: str, to_party: str,
                           filename: str | None = None, *, correlation_id: str | None = None,
                           **kw: Any) -> int:
        """Store one message in a transaction of its own; returns its id."""
        held = isinstance(payload, bytes | bytearray | memoryview)
        stored = self.store.put(reading := payload if held else StagingRead(payload, self.fence))
        got = self.unpack(from_party, to_party, stored, self._held_rows(stored, reading))
        now = self.clock()
        try:
            self.fence.check(self.session, now)
            [message_id] = store_checked_many(self.session, [NewMessage(
                source=self.instance_name, from_party=from_party, to_party=to_party,
                stages=got.stages, original_filename=filename, lines=got.lines,
                correlation_id=correlation_id, rows=got.rows + kw.pop("rows", []),
                **kw)], self.checks, now)
            self.session.commit()
        except BaseException:
            self.session.rollback()
            raise
        self.made.append(message_id)
        return message_id

    # files -------------------------------------------------------------------
    def take_file(self, file: PickedFile, from_party: str, to_party: str,
                  filename: str, correlation_id: str | None = None) -> bool:
        """Stage a complete file into the batch; False (and nothing kept) if it changed."""
        if self.should_stop():
            self.flush()
            raise ScanStopped(f"{self.instance_name}: stopping; the scan ends here")
        if file.relative in self._removing:
            return False  # stored, and being removed (a scan again at once saw it)
        self.fence.keep_alive()
        staged = self._stage(file)
        if staged is None:
            return False
        stored, rows = staged
        self._staged.append(_Staged(file, from_party, to_party, filename, stored,
                                    correlation_id, rows))
        if len(self._staged) >= self.batch_size:
            self.flush()
        return True

    def _stage(self, file: PickedFile) -> tuple[StoredPayload, list[tuple] | None] | None:
        """The file in the batch's payloads and its rows (:meth:`_held_rows`); or None."""
        try:
            with file.open() as stream:
                # A source's file with a ``path`` (the poller's take_by_link) goes in
                # by a hard link where it can; its name is removed after the commit
                # whichever way it was stored.
                reading = StagingRead(stream, self.fence)
                stored = self._payloads.put(reading, link=getattr(file, "path", None))
            if stored.size == file.size and file.unchanged():
                return stored, self._held_rows(stored, reading)
            self._payloads.drop(stored)
            reason = "it changed while being read"
        except OSError as exc:
            reason = f"it could not be read: {exc}"
        log.info("%s: %s not taken: %s; it is looked at again", self.instance_name,
                 file.relative, reason)
        return None

    def _held_rows(self, stored: StoredPayload, reading: Any) -> list[tuple] | None:
        """The inspection's rows from the bytes read, if held and not to be unpacked."""
        held = reading.held(stored.size) if isinstance(reading, StagingRead) else reading
        if held is None or self.unpack.transforms:
            return None
        return message_rows(inspect_bytes(bytes(held)))

    def flush(self) -> list[int]:
        """Commit the staged files as messages with their pickups, then remove them
        (on a thread of its own, while the next batch is read); the pickups of the
        files removed are forgotten in the next batch's transaction, or in one of their
        own when there is none."""
        batch, self._staged = self._staged, []
        if not batch:
            self._forget(self._removed_pickups())
            return []
        try:
            self._payloads.commit()  # durable and in place before the transaction
        except BaseException:
            self._payloads.discard()
            raise
        for staged in batch:  # read before the transaction, not while it holds locks
            staged.got = self.unpack(staged.from_party, staged.to_party, staged.stored,
                                     staged.rows)
        pickups, made = self._commit(batch)
        self._removing = {staged.file.relative for staged in batch}
        self._removal = self._remover().submit(self._remove, batch, pickups)
        self.made.extend(made)
        return made

    def discard(self) -> None:
        """Drop what was staged and not committed (the scan ended early); the files
        stay where they are for the next scan. Files being removed are waited for and
        their pickups forgotten (left to the next scan's recovery if that fails)."""
        self._staged = []
        self._payloads.discard()
        try:
            self._forget(self._removed_pickups())
        except Exception:
            log.warning("%s: the pickups of removed files are left to the next scan",
                        self.instance_name, exc_info=True)
            self.session.rollback()
        finally:
            if self._executor is not None:
                self._executor.shutdown()
                self._executor = None

    def _remover(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="intake-remove")
        return self._executor

    def _removed_pickups(self) -> list[int]:
        """Wait for the removal under way; the pickups of the files it removed for good."""
        removal, self._removal = self._removal, None
        try:
            return removal.result() if removal is not None else []
        finally:
            self._removing = set()

    def _commit(self, batch: list[_Staged]) -> tuple[list[int], list[int]]:
        """One transaction: the new files' messages in one bulk dispatch, their pickup
        rows in one statement; returns each file's pickup id and the new message ids."""
        now = self.clock()
        try:
            self.fence.check(self.session, now)
            self._delete_pickups(self._removed_pickups())  # the last batch's files
            known = self._known_pickups([s.file for s in batch])
            fresh = [s for s in batch
                     if _key(s.file, s.stored.digest) not in known]
            made = store_checked_many(self.session, [
                self._new_message(s) for s in fresh], self.checks, now)
            inserted = self._insert_pickups(fresh, made, now)
            pickups = [known.get(_key(s.file, s.stored.digest)) or inserted[id(s)]
                       for s in batch]
            self.session.commit()
        except BaseException:
            self.session.rollback()
            raise
        return pickups, made

    def _new_message(self, staged: _Staged) -> NewMessage:
        return NewMessage(self.instance_name, staged.from_party, staged.to_party,
                          staged.got.stages, staged.filename, lines=staged.got.lines,
                          correlation_id=staged.correlation_id, rows=staged.got.rows)

    def _insert_pickups(self, fresh: list[_Staged], made: list[int], now: datetime
                        ) -> dict[int, int]:
        """A pickup row per newly stored file, in one statement: id(staged) -> row id."""
        if not fresh:
            return {}
        rows = [{"instance": self.instance_name, "path": s.file.relative,
                 "size": s.file.size, "mtime_ns": s.file.mtime_ns,
                 "sha256": s.stored.digest, "message_id": message_id}
                for s, message_id in zip(fresh, made, strict=True)]
        ids = insert_rows(connection(self.session), PollerPickup.__table__, rows,
                          {"created_at": now}, returning_ids=True)
        return {id(s): row_id for s, row_id in zip(fresh, ids, strict=True)}

    def _known_pickups(self, files: list[PickedFile]) -> dict[tuple, int]:
        """Pickup rows already recorded for these files (left by a process that died)."""
        rows = self.session.execute(select(
            PollerPickup.id, PollerPickup.path, PollerPickup.size, PollerPickup.mtime_ns,
            PollerPickup.sha256).where(
            PollerPickup.instance == self.instance_name,
            PollerPickup.path.in_({f.relative for f in files}))).all()
        return {(r.path, r.size, r.mtime_ns, r.sha256): r.id for r in rows}

    def _remove(self, batch: list[_Staged], pickups: list[int]) -> list[int]:
        """After the commit: remove each file and make the removals durable; the
        pickups of those gone for good (to forget). Touches no database."""
        done = [(staged.file, row_id) for staged, row_id in zip(batch, pickups, strict=True)
                if removed(staged.file, self.instance_name)]
        durable = removals_durable([file for file, _row_id in done], self.instance_name)
        return [row_id for file, row_id in done if file in durable]

    def _forget(self, ids: list[int]) -> None:
        if ids:
            self._delete_pickups(ids)
            self.session.commit()

    def _delete_pickups(self, ids: list[int]) -> None:
        if ids:
            self.session.execute(delete(PollerPickup).where(PollerPickup.id.in_(ids)))

    def taken(self) -> set[tuple[str, int, int]]:
        """(path, size, mtime_ns) of this instance's files stored and not yet removed
        (a kept file's until :meth:`recover_files` finds it gone or changed)."""
        rows = self.session.execute(select(PollerPickup.path, PollerPickup.size,
                                           PollerPickup.mtime_ns).where(
            PollerPickup.instance == self.instance_name)).all()
        self.session.commit()
        return {tuple(r) for r in rows if self.shard.owns(r.path)}

    # after a crash -----------------------------------------------------------
    def recover_files(self, find: Callable[[str], PickedFile | None]) -> int:
        """Remove the files a dead process stored but did not remove; forget the rows.
        Once an hour per process, also the payload store's temp files a dead process
        left (copies and links of batches never put in place). Only the rows of this
        scan's shard: another shard's are its own holder's (alive, or proved dead by
        the lease of its next holder)."""
        remove_stale_temp(self.store, self.instance_name, _TEMP_CHECKED)
        rows = self.session.scalars(select(PollerPickup).where(
            PollerPickup.instance == self.instance_name).order_by(PollerPickup.id)).all()
        self.session.commit()
        gone, done = [], []
        for row in (r for r in rows if self.shard.owns(r.path)):
            file = find(row.path)
            if file is not None and same_file(file, row):
                if not removed(file, self.instance_name):
                    continue
                gone.append(file)
                log.info("%s: %s was stored as message %s before a restart; removed",
                         self.instance_name, row.path, row.message_id)
            done.append(row.id)
        if len(removals_durable(gone, self.instance_name)) < len(gone):
            return len(gone)  # the rows stay; the next scan finds the files gone
        self._forget(done)
        return len(gone)


_TEMP_CHECKED: dict[str, float] = {}  # payload store root -> monotonic time of the check


def _key(file: PickedFile, digest: str) -> tuple:
    return (file.relative, file.size, file.mtime_ns, digest)
