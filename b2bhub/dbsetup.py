"""SQLite pragmas for the embedded default: WAL (readers never wait for the writer),
a busy timeout (several processes write), and enforced foreign keys."""

from __future__ import annotations

import sqlite3

from sqlalchemy import event
from sqlalchemy.engine import Engine

_installed = False


def install() -> None:
    global _installed
    if not _installed:
        event.listen(Engine, "connect", _on_connect)
        _installed = True


def _on_connect(dbapi_connection, connection_record) -> None:
    if not isinstance(dbapi_connection, sqlite3.Connection):
        return
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
