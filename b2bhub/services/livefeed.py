"""One reader of history lines per web process, shared by all its event streams.

Each stream polling the database on its own costs a query per client every half
second, and every line is read and turned into JSON once per client. Instead a
:class:`SharedFeed` thread reads the gap-free feed (``b2bhub.engine.events``) for the
whole process, formats each line once, and keeps the newest :data:`KEEP` lines in
memory; streams wait on it and take the lines after their cursor, with their own
filters. A stream whose cursor is older than what is kept (a client resuming from far
back) reads the database with a feed of its own until it has caught up, then switches
over: both feeds emit every id once in order, so the switch neither repeats nor skips
a line.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Iterator

from sqlalchemy.engine import Engine

from b2bhub.engine.events import FeedFilter, IdFeed, history_feed, latest_id
from b2bhub.services.streams import CLOSING, sse_event, wake_on_close

log = logging.getLogger(__name__)
KEEP = 20_000
Entry = tuple[int, dict, str]  # id, the line's JSON, its formatted event


class SharedFeed:
    def __init__(self, engine: Engine, every: float = 0.25, keep: int = KEEP):
        self.engine, self.every, self.keep = engine, every, keep
        self._changed = threading.Condition()
        self._ids: list[int] = []
        self._entries: list[Entry] = []
        self._base = 0    # every line after this cursor and up to _after is kept
        self._after = 0
        self._feed: IdFeed | None = None
        self._reader: tuple[threading.Thread, threading.Event] | None = None
        self._last_read = 0.0
        self.idle = max(5.0, 20 * every)  # the reader stops after this long unread
        wake_on_close(self._wake)

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def start(self) -> SharedFeed:
        """Start reading (again, after the reader stopped for want of streams)."""
        with self._changed:
            if self._feed is None:
                with self.engine.connect() as conn:
                    self._base = self._after = latest_id(conn)
                self._ids, self._entries = [], []
                self._feed = history_feed(self._base)
                self._last_read = time.monotonic()
                stop = threading.Event()
                thread = threading.Thread(target=self._run, args=(self._feed, stop),
                                          name="b2bhub-shared-feed", daemon=True)
                self._reader = (thread, stop)
                thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the reader and wait for a read under way to end: nothing of an app torn
        down goes on reading its database (the test suite empties the tables after each
        test, and a read still running then deadlocked with it). A later read starts
        the reader again."""
        with self._changed:
            reader, self._reader, self._feed = self._reader, None, None
            self._changed.notify_all()
        if reader is not None:
            thread, stop = reader
            stop.set()
            thread.join(timeout)

    def read(self, after: int, wait: float) -> list[Entry] | None:
        """The lines after ``after`` (waiting up to ``wait`` seconds for one); None when
        ``after`` is older than the lines kept: the caller reads the database."""
        with self._changed:
            self._last_read = time.monotonic()
            if self._feed is None:
                self.start()
            if after < self._base:
                return None
            if after >= self._after:
                self._changed.wait(wait)
                if after < self._base:
                    return None
            return self._entries[bisect.bisect_right(self._ids, after):]

    def _run(self, feed: IdFeed, stop: threading.Event) -> None:
        while not stop.is_set():
            with self._changed:
                if feed is not self._feed:
                    return  # stopped meanwhile
                if time.monotonic() - self._last_read > self.idle:
                    # no stream reads: stop; the next read starts anew
                    self._feed, self._reader = None, None
                    return
            try:
                with self.engine.connect() as conn:
                    rows = feed.poll(conn)
            except Exception:
                log.warning("the shared event feed could not read; retrying", exc_info=True)
                stop.wait(1)
                continue
            if rows:
                self._add(feed, rows)
            stop.wait(self.every)

    def _add(self, feed: IdFeed, rows: list[dict]) -> None:
        with self._changed:
            if feed is not self._feed:
                return  # stopped meanwhile
            for row in rows:
                self._ids.append(row["id"])
                self._entries.append((row["id"], row, sse_event(row["id"], row["type"], row)))
            if len(self._ids) > 2 * self.keep:  # trim in chunks: a list shifts on delete
                cut = len(self._ids) - self.keep
                self._base = self._ids[cut - 1]
                del self._ids[:cut], self._entries[:cut]
            self._after = feed.after
            self._changed.notify_all()


def history_stream(shared: SharedFeed, engine: Engine, after: int, filters: FeedFilter,
                   *, every: float, keepalive: float) -> Iterator[str]:
    """The text of one client's stream: the shared feed's lines after ``after`` that
    pass ``filters``, from the database while ``after`` is older than what is kept."""
    yield ": connected\n\n"
    own: IdFeed | None = None
    last_write = time.monotonic()
    while not CLOSING.is_set():
        entries = shared.read(after, wait=min(every * 4, keepalive))
        if entries is None:
            own = own or history_feed(after, filters)
            with engine.connect() as conn:
                chunks = [sse_event(r["id"], r["type"], r) for r in own.poll(conn)]
            after = own.after
            if not chunks:
                CLOSING.wait(every)
        else:
            own = None
            chunks = [text for _, row, text in entries if filters.matches(row)]
            if entries:
                after = entries[-1][0]
        if chunks:
            yield "".join(chunks)
            last_write = time.monotonic()
        elif time.monotonic() - last_write >= keepalive:
            yield ": keep-alive\n\n"
            last_write = time.monotonic()
