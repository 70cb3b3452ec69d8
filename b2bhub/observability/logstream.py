"""Log records of every process to the database, for the Logs page and ``/api/v1/logs``.

:class:`QueueingHandler` sits on the root logger at ``max(B2BHUB_LOG_STREAM_LEVEL,
B2BHUB_LOG_LEVEL)``. Its ``emit`` only formats the record and appends it to a bounded
in-memory queue: logging never waits for the database. The process's agent thread
(``b2bhub.runtime.agent``) writes what is queued to ``log_records`` every half second, in one
insert. When the database is slow or down the queue keeps the newest
:data:`QUEUE_LIMIT` records and counts the ones it dropped; the next flush says how
many were lost. We chose the database over Redis so that the Logs page works the
same on the embedded default and on PostgreSQL + Redis, and reads with the same keyset
pages and streams as history lines.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from b2bhub.models import utcnow

QUEUE_LIMIT = 10_000
MESSAGE_LIMIT = 8_000


#: Loggers whose info records say only that a task arrived or ended: the 1-second source
#: scheduler and every wake-up would fill the Logs page with them. Their warnings and
#: errors are still kept; the process's own log output keeps everything.
ROUTINE_LOGGERS = ("celery.app.trace", "celery.worker.strategy", "celery.beat")


class QueueingHandler(logging.Handler):
    def __init__(self, level: int):
        super().__init__(level)
        self._queue: deque[dict] = deque(maxlen=QUEUE_LIMIT)
        self._lock = threading.Lock()
        self.dropped = 0
        self.quiet_thread: int | None = None  # the flushing thread's own records are not kept
        self._formatter = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.quiet_thread:
            return
        if record.levelno < logging.WARNING and record.name.startswith(ROUTINE_LOGGERS):
            return
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + self._formatter.formatException(record.exc_info)
        except Exception:  # a bad format string must not break the caller
            message = str(record.msg)
        with self._lock:
            if len(self._queue) == self._queue.maxlen:
                self.dropped += 1
            self._queue.append({"created_at": utcnow(), "level": record.levelno,
                                "logger": record.name[:200],
                                "message": message[:MESSAGE_LIMIT]})

    def take(self) -> tuple[list[dict], int]:
        """Everything queued, and how many records were dropped since the last take."""
        with self._lock:
            items, dropped = list(self._queue), self.dropped
            self._queue.clear()
            self.dropped = 0
        return items, dropped

    def put_back(self, items: list[dict]) -> None:
        """Records a failed flush could not write, ahead of the newer ones."""
        with self._lock:
            room = QUEUE_LIMIT - len(self._queue)
            keep = items[-room:] if room > 0 else []
            self.dropped += len(items) - len(keep)
            self._queue.extendleft(reversed(keep))


def stream_level(config: dict) -> int:
    """The level records are kept from: never below the process's own log level."""
    return max(_level(config, "LOG_STREAM_LEVEL"), _level(config, "LOG_LEVEL"))


def _level(config: dict, key: str) -> int:
    number = logging.getLevelName(str(config[key]).upper())
    if not isinstance(number, int):
        raise ValueError(f"B2BHUB_{key}={config[key]!r} is not a log level (debug, info, "
                         "warning, error or critical)")
    return number
