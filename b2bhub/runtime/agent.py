"""The per-process agent: heartbeat and log shipping in one background thread.

``start_agent(app, kind)`` is called once by each long-running process (``wsgi.py`` for
gunicorn's worker, the Celery signals for a worker and for beat). Every
:data:`FLUSH_SECONDS` it writes the queued log records (``b2bhub.observability.logstream``); every
heartbeat it updates the process's row with the instances it runs and lets the process
act on instance starts and stops (``on_heartbeat``). Failures are printed to stderr,
never logged (that would feed the queue it is flushing) and never stop the thread.

The heartbeat is this thread's, not the main thread's: it goes on while an attempt of
any length runs (the attempt waits on I/O or sleeps, and Python hands this thread its
turn every few milliseconds even when the attempt computes). Its liveness write, by
the database's clock, is a transaction of its own, before the instance bookkeeping, so
no lock another transaction holds on an instance row can hold it up. The sweep reads
these heartbeats to know a process dead (``b2bhub.engine.presence``).
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

from flask import Flask
from sqlalchemy import insert
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.engine import presence
from b2bhub.engine.writelock import serialized_writes
from b2bhub.models import LogRecord, utcnow
from b2bhub.observability.logstream import QueueingHandler, stream_level

FLUSH_SECONDS = 0.5
OnHeartbeat = Callable[[Session], list[str]]  # returns the instances the process runs

_agent: Agent | None = None


class Agent:
    def __init__(self, app: Flask, kind: str, on_heartbeat: OnHeartbeat | None = None,
                 heartbeat_seconds: float = presence.HEARTBEAT_SECONDS):
        self.app, self.on_heartbeat = app, on_heartbeat
        self.heartbeat_seconds = heartbeat_seconds
        self.info = presence.ProcessInfo(presence.PROCESS_ID, kind, socket.gethostname(),
                                         os.getpid(), utcnow())
        self.handler = QueueingHandler(stream_level(app.config))
        self._instances: list[str] = []
        self._last_seen = None  # database time of the last heartbeat written
        self._steady_since = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"b2bhub-agent-{kind}",
                                        daemon=True)

    def start(self) -> Agent:
        logging.getLogger().addHandler(self.handler)
        with self.app.app_context():
            self._heartbeat()
        self._thread.start()
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Flush what is queued and record the clean stop (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        logging.getLogger().removeHandler(self.handler)
        with self.app.app_context():
            self._flush()
            self._write(lambda s: presence.mark_stopped(s, self.info.id,
                                                        presence.database_now(s)))

    def _run(self) -> None:
        self.handler.quiet_thread = threading.get_ident()
        next_beat = time.monotonic() + self.heartbeat_seconds
        with self.app.app_context():
            while not self._stop.wait(FLUSH_SECONDS):
                self._flush()
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.heartbeat_seconds
                    self._heartbeat()

    def _heartbeat(self) -> None:
        written = {}

        def beat(session: Session) -> None:
            now = presence.database_now(session)
            if self._last_seen is None or \
                    (now - self._last_seen).total_seconds() > presence.STEADY_GAP:
                self._steady_since = now  # a heartbeat came late or failed: anew
            presence.heartbeat(session, self.info, self._instances, now, self._steady_since)
            written["at"] = now

        if self._write(beat):
            self._last_seen = written["at"]
        if self.on_heartbeat is not None:
            def bookkeeping(session: Session) -> None:
                self._instances = self.on_heartbeat(session)
                presence.record_instances(session, self.info.id, self._instances)
            self._write(bookkeeping)

    def _flush(self) -> None:
        items, dropped = self.handler.take()
        if dropped:
            items.append({"created_at": utcnow(), "level": logging.WARNING,
                          "logger": "b2bhub.observability.logstream",
                          "message": f"{dropped} log record(s) dropped: the queue was full"})
        if not items:
            return
        who = {"process_id": self.info.id, "kind": self.info.kind, "host": self.info.host,
               "pid": self.info.pid}
        if not self._write(lambda s: s.execute(insert(LogRecord),
                                               [{**item, **who} for item in items])):
            self.handler.put_back(items)

    def _write(self, work: Callable[[Session], None]) -> bool:
        try:
            with Session(db.engine) as session, serialized_writes(session):
                work(session)
                session.commit()
            return True
        except Exception as exc:
            print(f"b2bhub agent ({self.info.kind}): {exc!r}", file=sys.stderr, flush=True)
            return False


def start_agent(app: Flask, kind: str, on_heartbeat: OnHeartbeat | None = None) -> Agent:
    """Start this process's agent once; later calls return the running one."""
    global _agent
    if _agent is None:
        _agent = Agent(app, kind, on_heartbeat).start()
    return _agent


def stop_agent() -> None:
    global _agent
    if _agent is not None:
        _agent.stop()
        _agent = None
