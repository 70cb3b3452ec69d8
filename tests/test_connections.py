"""Pooled connections: an idle PostgreSQL connection is pinged before use, one used a
moment ago is not (a round trip per request saved), unless its cached plans are old
enough to discard (the ping is that discard, b2bhub.config.database); SQLite connections are
left alone."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from b2bhub.config import database


@pytest.fixture
def engine(app):
    """An engine of its own with one pooled connection, for the test to break."""
    engine = create_engine(app.config["SQLALCHEMY_DATABASE_URI"], pool_size=1,
                           max_overflow=0, **app.config["SQLALCHEMY_ENGINE_OPTIONS"])
    yield engine
    engine.dispose()


def _last_query(app, pid: int) -> str:
    """What the server says the backend ``pid`` ran last (from another connection)."""
    with create_engine(app.config["SQLALCHEMY_DATABASE_URI"]).connect() as other:
        return other.execute(text("SELECT query FROM pg_stat_activity WHERE pid = :pid"),
                             {"pid": pid}).scalar()


def test_only_an_idle_postgresql_connection_is_pinged_before_use(app, engine, monkeypatch):
    if engine.dialect.name != "postgresql":
        # the hook leaves SQLite alone: a closed SQLite connection is not pinged (a ping
        # would raise here), it fails on use as before
        with engine.connect() as conn:
            raw = conn.connection.dbapi_connection
        raw.close()  # in the pool
        monkeypatch.setattr(database, "PING_AFTER_IDLE", 0.0)
        with pytest.raises(Exception, match="closed database"), engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return
    monkeypatch.setattr(database, "REPLAN_SECONDS", 3600.0)  # its plans are young
    with engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
    checked_in = _last_query(app, pid)  # the pool's reset
    with engine.connect() as conn:  # used a moment ago: taken as it is
        assert _last_query(app, pid) == checked_in != "DISCARD PLANS"
    monkeypatch.setattr(database, "PING_AFTER_IDLE", 0.0)
    with engine.connect() as conn:  # idle long enough (any time, now): pinged, by the
        assert _last_query(app, pid) == "DISCARD PLANS"  # statement that drops plans
    with engine.connect() as conn:
        conn.execute(text("SELECT 2")).scalar()
    monkeypatch.setattr(database, "PING_AFTER_IDLE", 3600.0)
    with engine.connect() as conn:  # used a moment ago, plans young: taken as it is
        assert _last_query(app, pid) != "DISCARD PLANS"
    monkeypatch.setattr(database, "REPLAN_SECONDS", 0.0)
    with engine.connect() as conn:  # used a moment ago but its plans are old enough
        assert _last_query(app, pid) == "DISCARD PLANS"


def _identity(conn) -> object:
    """The server process of a PostgreSQL connection; the SQLite connection object."""
    if conn.dialect.name == "postgresql":
        return conn.execute(text("SELECT pg_backend_pid()")).scalar()
    return id(conn.connection.dbapi_connection)


def _drop(app, engine, identity, raw) -> None:
    """What a server restart does to a connection in the pool (SQLite: the file closed)."""
    if engine.dialect.name == "postgresql":
        with create_engine(app.config["SQLALCHEMY_DATABASE_URI"],
                           isolation_level="AUTOCOMMIT").connect() as other:
            assert other.execute(text("SELECT pg_terminate_backend(:pid)"),
                                 {"pid": identity}).scalar()
    else:
        raw.close()


@pytest.mark.parametrize("idle", [True, False])
def test_a_dropped_connection_is_replaced(app, engine, monkeypatch, idle):
    """Idle long enough, a dropped PostgreSQL connection is replaced before use; one
    used a moment ago (or any SQLite one) fails its request once, then the pool has a
    new connection. (A connection whose plans are old enough to discard is checked the
    same way as an idle one: held young here, so only idleness decides.)"""
    monkeypatch.setattr(database, "REPLAN_SECONDS", 3600.0)
    with engine.connect() as conn:
        before, raw = _identity(conn), conn.connection.dbapi_connection
    _drop(app, engine, before, raw)
    if idle:
        monkeypatch.setattr(database, "PING_AFTER_IDLE", 0.0)
    if not (idle and engine.dialect.name == "postgresql"):
        with pytest.raises(DBAPIError), engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1
        assert _identity(conn) != before


def test_a_held_connection_discards_its_plans_inside_its_open_transaction(
        app, engine, monkeypatch):
    """A drain holds its connection across transactions and discards its plans before
    a batch (``replan_if_due``); when that finds a transaction open (the drain's first
    batch goes on in the transaction that read the settings) the discard runs in it, and
    the transaction goes on: its uncommitted row is still there, and rolls back."""
    if engine.dialect.name != "postgresql":
        pytest.skip("plans are discarded on PostgreSQL only: SQLite caches none to discard")
    monkeypatch.setattr(database, "REPLAN_SECONDS", 0.0)
    with engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        conn.execute(text("INSERT INTO settings (key, value, updated_at) "
                          "VALUES ('replan.held', '1', CURRENT_TIMESTAMP)"))
        database.replan_if_due(conn)  # raised "can't change 'autocommit' now" before
        assert _last_query(app, pid) == "DISCARD PLANS"
        assert conn.execute(text("SELECT count(*) FROM settings "
                                 "WHERE key = 'replan.held'")).scalar() == 1
        conn.rollback()
        database.replan_if_due(conn)  # and idle: outside any transaction
        assert _last_query(app, pid) == "DISCARD PLANS"
        assert not conn.in_transaction()
        assert conn.execute(text("SELECT count(*) FROM settings "
                                 "WHERE key = 'replan.held'")).scalar() == 0
        conn.rollback()
