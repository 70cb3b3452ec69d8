"""What every database connection of the hub gets.

SQLite pragmas for the embedded default: WAL (readers never wait for the writer), a busy
timeout (several processes write), and enforced foreign keys.

SQLite: a savepoint opened outside a transaction begins it as a writer (``BEGIN
IMMEDIATE``, :func:`_on_savepoint`). Python's sqlite3 begins a transaction just before its
first write, which then waits its turn as the busy timeout allows; a ``SAVEPOINT`` begins
one at once, as a reader, and a transaction that read before another process committed a
write can never write: SQLite refuses it at once ("database is locked", the busy timeout
does not apply). The bulk Redeliver (a savepoint per delivery) failed so whenever the
worker or beat committed between its read and its write.

PostgreSQL: a pooled connection that sat idle for :data:`PING_AFTER_IDLE` seconds is
pinged before use, and replaced when the ping fails (the server restarted, a network
device dropped the idle socket). SQLAlchemy's ``pool_pre_ping`` pings at every checkout:
a round trip per request, about 0.2 ms here, a tenth of what the AS2 receiver spends
on the database per message. A connection used within the last seconds is taken as it
is; should the server have gone away in that time, the request fails once (the AS2
receiver answers 503, which senders retry; a worker's claim is retried by the sweep) and
SQLAlchemy, seeing the disconnect, replaces every connection of the pool.

PostgreSQL: a connection whose cached plans are :data:`REPLAN_SECONDS` old discards them
(``DISCARD PLANS``, one round trip, which serves as the ping too) at its next checkout,
and a drain's held connection before its next batch (:func:`replan_if_due`). PostgreSQL
keeps a generic plan of each statement psycopg prepared and of each foreign-key check;
one made while a table was empty is a sequential scan, and stayed one while the table
grew (nothing replans it but a vacuum, an ANALYZE or a schema change): a lookup by id on
200,000 rows took 17 ms where it takes 0.2. Replanned every few seconds, a plan reflects
the table's size of a few seconds ago; in between, statements run their cached plans
instead of being planned at every execution (``bench/plan_cache.py``).
"""

from __future__ import annotations

import sqlite3
import time

from sqlalchemy import event, exc
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool

#: seconds a pooled PostgreSQL connection may sit idle before it is pinged on checkout
PING_AFTER_IDLE = 10.0
#: seconds a PostgreSQL connection keeps its cached plans before it discards them
REPLAN_SECONDS = 2.0
_IDLE_SINCE = "b2bhub_idle_since"
_PLANS_SINCE = "b2bhub_plans_since"
_installed = False


def install() -> None:
    global _installed
    if not _installed:
        event.listen(Engine, "connect", _on_connect)
        event.listen(Engine, "savepoint", _on_savepoint)
        event.listen(Pool, "checkin", _on_checkin)
        event.listen(Pool, "checkout", _on_checkout)
        _installed = True


def _on_checkin(dbapi_connection, connection_record) -> None:
    connection_record.info[_IDLE_SINCE] = time.monotonic()


def _on_checkout(dbapi_connection, connection_record, connection_proxy) -> None:
    """Ping a connection that was idle long enough, and discard the plans of one whose
    plans are old enough (one statement does both); a failed ping makes the pool
    discard it and check out another (``DisconnectionError``)."""
    if isinstance(dbapi_connection, sqlite3.Connection):
        return
    idle_since = connection_record.info.get(_IDLE_SINCE)
    ping = idle_since is not None and time.monotonic() - idle_since >= PING_AFTER_IDLE
    if not (ping or _plans_due(connection_record.info)):
        return
    try:
        _discard_plans(dbapi_connection, connection_record.info)
    except Exception as error:
        raise exc.DisconnectionError(f"the idle connection is gone: {error}") from error


def replan_if_due(connection) -> None:
    """Discard the cached plans of a connection held across transactions (a drain's)
    once they are :data:`REPLAN_SECONDS` old, as a checkout does (in its transaction if
    one is open)."""
    fairy = connection.connection
    if not isinstance(fairy.dbapi_connection, sqlite3.Connection) and _plans_due(fairy.info):
        _discard_plans(fairy.dbapi_connection, fairy.info)


def _plans_due(info: dict) -> bool:
    """Whether the connection's plans are :data:`REPLAN_SECONDS` old (a connection seen
    for the first time has none older than now)."""
    now = time.monotonic()
    return now - info.setdefault(_PLANS_SINCE, now) >= REPLAN_SECONDS


def _discard_plans(dbapi_connection, info: dict) -> None:
    """``DISCARD PLANS``: the next execution of each statement is planned again, for
    the tables as they are now; outside a transaction unless one is open, and not at
    all from a failed transaction or under a statement (at the next chance instead)."""
    from psycopg.pq import TransactionStatus
    status = dbapi_connection.info.transaction_status
    info[_PLANS_SINCE] = time.monotonic()
    if status not in (TransactionStatus.IDLE, TransactionStatus.INTRANS):
        return
    if status == TransactionStatus.INTRANS:  # in it: psycopg refuses to touch
        _send_discard(dbapi_connection)       # autocommit there, even to its own value
        return
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True  # no transaction for it
    try:
        _send_discard(dbapi_connection)
    finally:
        dbapi_connection.autocommit = autocommit


def _send_discard(dbapi_connection) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute("DISCARD PLANS")


def _on_savepoint(conn, name) -> None:
    """Begin the transaction a savepoint is about to open on SQLite as a writer (the
    module's docstring says why); one already open is left as it is."""
    raw = conn.connection.dbapi_connection
    if isinstance(raw, sqlite3.Connection) and not raw.in_transaction:
        raw.execute("BEGIN IMMEDIATE")


def _on_connect(dbapi_connection, connection_record) -> None:
    if not isinstance(dbapi_connection, sqlite3.Connection):
        return
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
