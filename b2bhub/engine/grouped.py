"""Group commit of intakes: requests of one process that each store one message, arriving
while the process's writes are in flight, are written together by the next writer, in
one statement and one commit.

Each intake request pays for its own statement, its commit and its wake-up. A process
writes at most :attr:`WriteGroup.writers` (2) groups at once: a request that finds a
slot free writes at once, alone or with whoever waited; the others wait, and the next
free slot takes all who waited, however many, and writes them with one
:func:`b2bhub.engine.dispatch.store_and_dispatch_many`. No request waits for a timer.
Two slots, not one: with a couple of senders per process (the intake benchmark's four
clients on two web processes) a single writer made each request wait for the other's
write instead of sending its own beside it, and gained nothing from groups that rarely
formed; with 16 senders the groups carried about 20% more requests per second than one
statement per request (``bench/http_intake.py --clients 16``).

What each request is answered is its own: its message id once the group's commit
returned, or its error. Where the group's statement was refused by the server for what
one of its messages holds (a data or integrity error: the statement did nothing), each
message is written again alone, so one bad message fails only its own request. Any other
failure (the connection lost, say) fails every request of the group, as it would have
failed each alone: whether the server committed is not known then, and writing again
could store a message twice.

Plain Python (threads of one process); the caller says how a group is written.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session

from b2bhub.engine.dispatch import NewMessage, store_and_dispatch_many, writes_in_one_statement
from b2bhub.observability import tracing

#: the errors after which each message of a group is written again alone: the server
#: refused the statement for what it holds, and did nothing
REFUSED = (DataError, IntegrityError)

Write = Callable[[Sequence[Any]], Sequence[Any]]


class _Entry:
    __slots__ = ("item", "result", "error", "taken", "done")

    def __init__(self, item: Any):
        self.item, self.result, self.error = item, None, None
        self.taken = self.done = False  # by a writer; written (or failed)

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class WriteGroup:
    """One per process (or per kind of write); threads call :meth:`write`."""

    def __init__(self, writers: int = 2) -> None:
        self._cond = threading.Condition()
        self._pending: list[_Entry] = []
        self._writing = 0
        self.writers = writers
        #: groups written and items in them, for a bench or a test to read
        self.groups = self.items = 0

    def write(self, item: Any, write: Write) -> Any:
        """``item``'s result as ``write([..., item, ...])`` gave it: ``write`` takes the
        items of a group and returns their results in order, having committed them (or
        raises, having rolled back). Runs ``write`` in this thread if no other is
        writing, with whatever items arrived meanwhile; else waits for a writer to take
        ``item``. Raises the error of ``item``'s write."""
        entry = _Entry(item)
        with self._cond:
            self._pending.append(entry)
            # an entry another writer took is waited for, even if this thread could write
            while not entry.done and (entry.taken or self._writing >= self.writers):
                self._cond.wait()
            if entry.done:
                return entry.outcome()
            self._writing += 1
            taken, self._pending = self._pending, []
            for other in taken:
                other.taken = True
        try:
            self._write(taken, write)
        finally:
            with self._cond:
                self._writing -= 1
                self.groups += 1
                self.items += len(taken)
                for other in taken:
                    if not other.done:  # the writer was stopped by a BaseException
                        other.error = RuntimeError("the write of this group was stopped")
                        other.done = True
                self._cond.notify_all()
        return entry.outcome()

    @staticmethod
    def _write(taken: list[_Entry], write: Write) -> None:
        try:
            results = write([e.item for e in taken])
        except Exception as exc:
            if len(taken) > 1 and isinstance(exc, REFUSED):
                for e in taken:  # refused for what one of them holds: each again alone
                    try:
                        [e.result] = write([e.item])
                    except Exception as own:
                        e.error = own
                    e.done = True
                return
            for e in taken:
                e.error, e.done = exc if len(taken) == 1 else _copy(exc), True
            return
        for e, result in zip(taken, results, strict=True):
            e.result, e.done = result, True


def _copy(exc: Exception) -> Exception:
    """An error of its own for each request of a failed group (one exception object
    raised in several threads would share, and grow, one traceback)."""
    copy = RuntimeError(f"the intake's write failed: {exc}")
    copy.__cause__ = exc
    return copy


# --- the intakes' group ------------------------------------------------------------------

_INTAKES = WriteGroup()


def intakes() -> WriteGroup:
    """The process's group of intakes (its counts, for a test or a bench)."""
    return _INTAKES


def store_and_dispatch_grouped(session: Session, new: NewMessage, now: datetime,
                               known: dict) -> int:
    """:func:`store_and_dispatch_many` of one message and its commit, written with the
    messages of other threads' intakes that arrive meanwhile (:class:`WriteGroup`); the
    message's id. For a message written by one statement outside a transaction
    (:func:`b2bhub.engine.dispatch.writes_in_one_statement`, the session's connection in
    autocommit), as are the others of its group; ``known`` as for
    :func:`store_and_dispatch_many`, read in this request. The group's rows are stamped
    with the latest ``now`` of its requests, and its wake-ups are published by the
    request that wrote it, as one. With tracing on, each message is written alone: it
    carries the trace of its own request."""
    if tracing.traceparent() is not None:
        return _write_intakes(session, known, [(new, now)])[0]
    return _INTAKES.write((new, now), functools.partial(_write_intakes, session, known))


def _write_intakes(session: Session, known: dict, items: Sequence[tuple[NewMessage, datetime]]
                   ) -> list[int]:
    news = [new for new, _now in items]
    try:
        if not writes_in_one_statement(session, news, known):
            # each request saw its messages written by one statement, but with the
            # routes as this request read them one is not routed (a route removed in
            # between): its status, line and alert are statements of their own, so the
            # group goes in a transaction (the commit ends this one, in autocommit)
            session.commit()
        ids = store_and_dispatch_many(session, news, max(now for _new, now in items), known)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return ids
