"""What every database connection of the hub gets.

SQLite pragmas for the embedded default: WAL (readers never wait for the writer), a busy
timeout (several processes write), and enforced foreign keys.

PostgreSQL: a pooled connection that sat idle for :data:`PING_AFTER_IDLE` seconds is
pinged before use, and replaced when the ping fails (the server restarted, a network
device dropped the idle socket). SQLAlchemy's ``pool_pre_ping`` pings at every checkout:
a round trip per request, about 0.2 ms here, a tenth of what the AS2 receiver spends
on the database per message. A connection used within the last seconds is taken as it
is; should the server have gone away in that time, the request fails once (the AS2
receiver answers 503, which senders retry; a worker's claim is retried by the sweep) and
SQLAlchemy, seeing the disconnect, replaces every connection of the pool.
"""

from __future__ import annotations

import sqlite3
import time

from sqlalchemy import event, exc
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool

#: seconds a pooled PostgreSQL connection may sit idle before it is pinged on checkout
PING_AFTER_IDLE = 10.0
_IDLE_SINCE = "b2bhub_idle_since"
_installed = False


def install() -> None:
    global _installed
    if not _installed:
        event.listen(Engine, "connect", _on_connect)
        event.listen(Pool, "checkin", _on_checkin)
        event.listen(Pool, "checkout", _on_checkout)
        _installed = True


def _on_checkin(dbapi_connection, connection_record) -> None:
    connection_record.info[_IDLE_SINCE] = time.monotonic()


def _on_checkout(dbapi_connection, connection_record, connection_proxy) -> None:
    """Ping a connection that was idle long enough; a failed ping makes the pool
    discard it and check out another (``DisconnectionError``)."""
    if isinstance(dbapi_connection, sqlite3.Connection):
        return
    idle_since = connection_record.info.get(_IDLE_SINCE)
    if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE:
        return  # new, or used a moment ago
    try:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True  # no transaction for the ping
        try:
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        finally:
            dbapi_connection.autocommit = autocommit
    except Exception as error:
        raise exc.DisconnectionError(f"the idle connection is gone: {error}") from error


def _on_connect(dbapi_connection, connection_record) -> None:
    if not isinstance(dbapi_connection, sqlite3.Connection):
        return
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
