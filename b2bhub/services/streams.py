"""Server-Sent Events over the database: a poll loop per client, with keep-alives.

Each open stream holds one thread of the web process (gunicorn's ``gthread`` worker,
see the README's Processes section) and sleeps between polls; a poll checks a pooled
connection out only for its query. :class:`StreamSlots` keeps a few threads free for
ordinary requests: once every slot is taken a new stream is refused with 503 and
``Retry-After`` instead of leaving ``/health`` and the API waiting behind streams.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

from sqlalchemy.engine import Connection, Engine

#: threads of the web process kept for requests other than streams
THREADS_KEPT_FREE = 4

#: set when the web process stops: every stream ends at once (its client reconnects,
#: with ``Last-Event-ID``, to the process that serves next), so that a stop need not
#: wait out gunicorn's graceful timeout for requests that never end on their own
CLOSING = threading.Event()
_wake_on_close: list[Callable[[], None]] = []


def close_streams() -> None:
    """End every open stream of this process (called from the web worker's SIGTERM)."""
    CLOSING.set()
    for wake in list(_wake_on_close):
        wake()


def wake_on_close(wake: Callable[[], None]) -> None:
    """``wake`` is called by :func:`close_streams`: a stream waiting in it returns."""
    _wake_on_close.append(wake)


def sse_event(event_id: int | str | None, event: str | None, data: dict) -> str:
    """One event in the text/event-stream format (the JSON has no newlines)."""
    head = ""
    if event_id is not None:
        head += f"id: {event_id}\n"
    if event:
        head += f"event: {event}\n"
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n"


class StreamSlots:
    """At most ``size`` streams at once in this process."""

    def __init__(self, size: int):
        self.size = max(1, size)
        self._free = threading.BoundedSemaphore(self.size)

    @classmethod
    def for_threads(cls, threads: int) -> StreamSlots:
        return cls(threads - THREADS_KEPT_FREE)

    def take(self) -> bool:
        return self._free.acquire(blocking=False)

    def give_back(self) -> None:
        self._free.release()


def poll_stream(engine: Engine, poll: Callable[[Connection], list[str]], *,
                every: float, keepalive: float,
                clock: Callable[[], float] = time.monotonic) -> Iterator[str]:
    """Yield what ``poll`` returns (events already formatted) every ``every`` seconds,
    and a comment line after ``keepalive`` seconds of silence (proxies and clients keep
    the connection; a client that went away is noticed at the next write)."""
    yield ": connected\n\n"
    last_write = clock()
    while not CLOSING.is_set():
        with engine.connect() as conn:
            chunks = poll(conn)
        if chunks:
            yield "".join(chunks)
            last_write = clock()
        elif clock() - last_write >= keepalive:
            yield ": keep-alive\n\n"
            last_write = clock()
        CLOSING.wait(every)
