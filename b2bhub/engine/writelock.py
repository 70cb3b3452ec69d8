"""Turn SQLite's polling for its write lock into a queue (embedded default only).

SQLite has one writer at a time; a process that finds the database locked sleeps in its
busy handler (1, 2, 5, 10 ... 100 ms) and tries again, so workers that settle in turn
spend most of their time asleep. Workers therefore take an exclusive ``flock`` on a
file beside the database around their write transactions: a waiting worker is woken
by the kernel the moment the lock is released. Other writers (web, sweep) are unchanged
and still meet the busy timeout; the lock is released when the process dies. On
PostgreSQL this does nothing: row locks already queue there.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.orm import Session

_files: dict[str, int] = {}
_guard = threading.Lock()


@contextmanager
def serialized_writes(session: Session) -> Iterator[None]:
    bind = session.get_bind().engine  # the session may be bound to one connection
    if bind.dialect.name != "sqlite" or not bind.url.database or \
            bind.url.database == ":memory:":
        yield
        return
    fd = _lock_file(bind.url.database + ".writelock")
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _lock_file(path: str) -> int:
    with _guard:
        if path not in _files:
            _files[path] = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        return _files[path]
