"""The live feed of history lines: every line once, in id order, with no gap.

A client reads lines after the id it saw last (``Last-Event-ID``). Reading ``id > last``
alone would lose lines on PostgreSQL: ids come from a sequence when a line is inserted,
but become visible when their transaction commits, so a line with a lower id can commit
after one with a higher id. A reader that moved past the higher one would never see it.

:class:`IdFeed` therefore emits only the contiguous run of ids after ``last``. At
the first missing id it stops and waits until the id either appears or is known to be
dead (its transaction rolled back). An id is known dead once every transaction that
could hold it has ended: the id was drawn before the higher, visible id was drawn, so
its transaction had started by the time the reader saw the higher one. When no other
backend of the database has a transaction that started at or before that moment
(``pg_stat_activity.xact_start``, which covers transactions that have not yet been
given an xid as well), every missing id below the highest one seen then is dead, and
the reader steps over them after one more read. This holds for sequences with the
default cache of 1 (SERIAL/IDENTITY as created by the migrations).

A long transaction (an attempt that keeps its session open, a bulk intake) delays the
feed while a gap is open, never loses a line. On SQLite there is one writer at a time
and commits happen in id order (rowid is max+1 under the write lock), so a missing id
never appears later and the feed does not wait.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select, text
from sqlalchemy.engine import Connection

from b2bhub.domain.status_codes import status_code
from b2bhub.models import HistoryLine, Message

#: autovacuum's workers run transactions too (minutes long on a large table) but never
#: insert a line: counting them held a gap open while one ran (seen in the suite)
_IN_FLIGHT_SINCE = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL AND xact_start <= :seen "
    "AND backend_type <> 'autovacuum worker'")


@dataclass
class FeedFilter:
    """Optional filters; the feed still steps over lines they leave out."""

    message_id: int | None = None
    types: list[str] = field(default_factory=list)

    def matches(self, row: dict) -> bool:
        if self.message_id is not None and row["message_id"] != self.message_id:
            return False
        return not self.types or row["type"] in self.types


def line_json(row) -> dict:
    """The JSON of one event: the history line and its message's current status."""
    return {"id": row.id, "message_id": row.message_id, "delivery_id": row.delivery_id,
            "type": row.type, "text": row.text, "actor": row.actor,
            "created_at": row.created_at.isoformat() + "Z",
            "message_status": row.status, "message_status_code": status_code(row.status)}


def read_history(conn: Connection, after: int, limit: int) -> list[dict]:
    stmt = (select(HistoryLine.id, HistoryLine.message_id, HistoryLine.delivery_id,
                   HistoryLine.type, HistoryLine.text, HistoryLine.actor,
                   HistoryLine.created_at, Message.status)
            .outerjoin(Message, Message.id == HistoryLine.message_id)
            .where(HistoryLine.id > after).order_by(HistoryLine.id).limit(limit))
    return [line_json(row) for row in conn.execute(stmt)]


def history_feed(after: int, filters: FeedFilter | None = None) -> IdFeed:
    """History lines after ``after``, filtered, every one once in id order."""
    return IdFeed(read_history, after, (filters or FeedFilter()).matches)


def latest_id(conn: Connection) -> int:
    """The highest history id committed now (where a client starting "now" begins)."""
    return conn.scalar(select(func.coalesce(func.max(HistoryLine.id), 0)))


class IdFeed:
    """Rows after ``after`` in id order, every one once; see the module docstring.

    ``read(conn, after, limit)`` returns up to ``limit`` rows (dicts with ``id``) with an
    id above ``after``, in id order, unfiltered: the feed must see every id to tell a
    gap from a row that a filter leaves out. ``keep`` is the filter."""

    def __init__(self, read: Callable[[Connection, int, int], list[dict]], after: int,
                 keep: Callable[[dict], bool] = lambda row: True, batch: int = 500):
        self.read, self.after, self.keep, self.batch = read, after, keep, batch
        self._sqlite = False
        # the open gap: the highest id visible when it was first seen, the database time
        # just after that read, and whether every transaction then running has ended
        self._gap_top: int | None = None
        self._gap_seen: datetime | None = None
        self._gap_dead = False

    def poll(self, conn: Connection) -> list[dict]:
        """The rows that can be emitted now (filtered), advancing the cursor."""
        emitted: list[dict] = []
        self._sqlite = conn.dialect.name != "postgresql"
        while True:
            dead = self._gap_dead  # known before this read: the read may step over it
            rows = self.read(conn, self.after, self.batch)
            ready = self._ready(rows, dead)
            emitted += [row for row in ready if self.keep(row)]
            if ready:
                self.after = ready[-1]["id"]
            if self._gap_top is not None and self.after >= self._gap_top:
                self._gap_top, self._gap_seen, self._gap_dead = None, None, False
            if len(ready) < len(rows):
                self._watch_gap(conn, rows)
                return emitted
            if len(rows) < self.batch:
                return emitted

    def _ready(self, rows: list[dict], dead: bool) -> list[dict]:
        """The leading rows with no id missing before them that may still appear."""
        if not rows or self._sqlite:
            return rows
        expected, ready = self.after + 1, []
        for row in rows:
            if row["id"] != expected and not (dead and row["id"] <= self._gap_top):
                break
            ready.append(row)
            expected = row["id"] + 1
        return ready

    def _watch_gap(self, conn: Connection, rows: list[dict]) -> None:
        """Record a new gap, or learn whether the recorded one can still fill."""
        if self._gap_top is None:
            self._gap_top = rows[-1]["id"]
            self._gap_seen = conn.scalar(text("SELECT clock_timestamp()"))
            return
        # pg_stat_activity is read once per transaction: look at it in a fresh one
        conn.rollback()
        self._gap_dead = not conn.scalar(_IN_FLIGHT_SINCE, {"seen": self._gap_seen})
        conn.rollback()
