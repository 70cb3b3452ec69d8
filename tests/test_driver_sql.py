"""The drain's hot statements run as the driver's own SQL (b2bhub.engine.driver): the
times they write must be the ones the ORM writes, so that time comparisons stay right
(on SQLite a time is text, and a whole second written without its ``.000000`` compares
as earlier than the same time written by the ORM). On PostgreSQL they go to psycopg's
cursor itself; what a caller relies on from SQLAlchemy is checked here too: the
transaction it commits, the cursor events, its errors and a lost connection."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
from sqlalchemy import DateTime, bindparam, event, func, select, text
from sqlalchemy.exc import IntegrityError, OperationalError

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.driver import DriverSQL
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import Delivery
from tests.enginekit import at, standard_hub
from tests.procs import ROOT


def _count_at(session, column: str, when) -> int:
    return session.execute(text(f"SELECT count(*) FROM deliveries WHERE {column} = :t")
                           .bindparams(bindparam("t", type_=DateTime())), {"t": when}).scalar()


def test_claim_and_delivered_update_write_whole_seconds_as_the_orm_does(hub, session):
    standard_hub(hub, max_concurrent_deliveries=16)
    hub.route("inbox", "*", "*", "writer_a")
    for _ in range(3):
        hub.message()
    session.commit()
    claimed_at, settled_at = at(60).replace(microsecond=0), at(120).replace(microsecond=0)
    claims = claiming.claim(session, "writer_a", "w", claimed_at, 16, 300)
    session.commit()
    assert len(claims) == 3
    # the lease and update times the claim wrote equal the ORM's form of the same times
    assert _count_at(session, "lease_until", at(360).replace(microsecond=0)) == 3
    assert _count_at(session, "updated_at", claimed_at) == 3
    written = settlement.settle_many(session, [(c, Outcome.delivered("ok")) for c in claims],
                                     RetryPolicy(), settled_at)
    session.commit()
    assert written == [True, True, True]
    assert _count_at(session, "settled_at", settled_at) == 3
    # and an ORM comparison sees them at exactly that time, not a moment before
    assert session.scalar(select(func.count()).select_from(Delivery).where(
        Delivery.settled_at >= settled_at)) == 3
    assert sorted(session.scalars(select(Delivery.state))) == ["delivered"] * 3


def test_a_stale_claim_is_still_fenced_on_the_driver_path(hub, session):
    """The delivered UPDATE holds each row to its own attempt: an outcome of an older
    attempt of the same delivery writes nothing."""
    standard_hub(hub, max_concurrent_deliveries=16)
    hub.route("inbox", "*", "*", "writer_a")
    for _ in range(2):
        hub.message()
    session.commit()
    claims = claiming.claim(session, "writer_a", "w", at(60), 16, 300)
    session.commit()
    old = dataclasses.replace(claims[0], attempt=claims[0].attempt - 1)
    written = settlement.settle_many(session, [(old, Outcome.delivered("late")),
                                               (claims[1], Outcome.delivered("ok"))],
                                     RetryPolicy(), at(61))
    session.commit()
    assert written == [False, True]
    states = dict(session.execute(select(Delivery.id, Delivery.state)).all())
    assert states[claims[0].delivery_id] == "in_progress"
    assert states[claims[1].delivery_id] == "delivered"


_INSERT = DriverSQL("INSERT INTO settings (key, value, updated_at) "
                    "VALUES (:key, CAST(:value AS json), CURRENT_TIMESTAMP) RETURNING key")


def test_a_statement_on_a_connection_without_a_transaction_is_committed_by_its_commit(db):
    """As ``exec_driver_sql`` would, the first statement begins the connection's
    transaction: its ``commit()`` makes the row visible to another connection, and a
    ``rollback()`` of a later one takes only that one back."""
    with db.engine.connect() as conn:
        assert not conn.in_transaction()
        assert list(_INSERT.run(conn, {"key": "driver.a", "value": "1"}).scalars()) == [
            "driver.a"]
        assert conn.in_transaction()
        conn.commit()
        _INSERT.run(conn, {"key": "driver.b", "value": "2"})
        conn.rollback()
    with db.engine.connect() as other:
        keys = other.execute(text("SELECT key FROM settings WHERE key LIKE 'driver.%'"))
        assert [row[0] for row in keys] == ["driver.a"]


def test_the_cursor_events_see_each_statement(db):
    seen = []

    def before(conn, cursor, statement, params, context, executemany):
        seen.append(("before", statement.split()[0], dict(params)["key"]))

    def after(conn, cursor, statement, params, context, executemany):
        seen.append(("after", statement.split()[0], dict(params)["key"]))

    event.listen(db.engine, "before_cursor_execute", before)
    event.listen(db.engine, "after_cursor_execute", after)
    try:
        with db.engine.connect() as conn:
            _INSERT.run(conn, {"key": "driver.c", "value": "3"})
            conn.rollback()
    finally:
        event.remove(db.engine, "before_cursor_execute", before)
        event.remove(db.engine, "after_cursor_execute", after)
    assert seen == [("before", "INSERT", "driver.c"), ("after", "INSERT", "driver.c")]


def test_an_error_is_raised_as_sqlalchemy_raises_it_and_the_connection_goes_on(db):
    with db.engine.connect() as conn:
        _INSERT.run(conn, {"key": "driver.d", "value": "4"})
        with pytest.raises(IntegrityError) as raised:
            _INSERT.run(conn, {"key": "driver.d", "value": "5"})
        assert "driver.d" in str(raised.value.params)
        conn.rollback()
        assert _INSERT.run(conn, {"key": "driver.d", "value": "6"}).all() == [("driver.d",)]
        conn.rollback()


def test_a_lost_connection_is_invalidated_and_the_next_checkout_is_a_new_one(db):
    """The server ends the session under a statement (a restart, a failover): the error
    says the connection was invalidated, and the pool hands out a working one next."""
    if db.engine.dialect.name != "postgresql":
        pytest.skip("a server ends a connection: PostgreSQL's; SQLite has none")
    with db.engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        conn.rollback()
        with db.engine.connect() as killer:
            killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            killer.commit()
        with pytest.raises(OperationalError) as raised:
            _INSERT.run(conn, {"key": "driver.e", "value": "7"})
        assert raised.value.connection_invalidated
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT pg_backend_pid()")).scalar() != pid
        assert _INSERT.run(conn, {"key": "driver.e", "value": "8"}).all() == [("driver.e",)]
        conn.rollback()


def test_arrays_travel_as_postgresql_array_text_and_only_plain_words_go_unquoted():
    from b2bhub.engine.driver import int_array, word_array
    assert int_array([3, 1, 2]) == "{3,1,2}"
    assert int_array(iter([])) == "{}"
    assert word_array(["in_progress", "delivered"]) == "{in_progress,delivered}"
    # a value that would be read as more than one element, or quoted, is refused
    for bad in (["a,b"], ['a"'], ["{a}"], [""], ["a b"], ["NULL)"], ["null"]):
        with pytest.raises(ValueError):
            word_array(bad)
    with pytest.raises(ValueError):
        int_array(["1,2"])


def test_a_read_built_once_gives_its_columns_by_name_and_one_checks_the_count(db):
    """``run_read`` (the receivers' lookups): on PostgreSQL psycopg's own rows, named
    tuples; on SQLite SQLAlchemy's; either way a column is read as an attribute, a json
    column as what it holds. ``one()`` insists on exactly one row, as SQLAlchemy's."""
    from sqlalchemy import literal, null
    from sqlalchemy.exc import MultipleResultsFound, NoResultFound

    from b2bhub.engine.driver import run_read
    from b2bhub.models import Setting
    with db.engine.connect() as conn:
        conn.execute(Setting.__table__.insert(), [
            {"key": "a", "value": {"n": 1}}, {"key": "b", "value": {"n": 2}}])
        read = select(literal(7).label("seven"), null().label("missing"),
                      select(Setting.value).where(Setting.key == bindparam("key"))
                      .scalar_subquery().label("s0"))
        row = run_read(conn, read, {"key": "b"}).one()
        assert (row.seven, row.missing, row.s0) == (7, None, {"n": 2})
        many = select(Setting.key).where(Setting.key >= bindparam("low"))
        with pytest.raises(MultipleResultsFound):
            run_read(conn, many, {"low": "a"}).one()
        none = select(Setting.key).where(Setting.key == bindparam("key"))
        with pytest.raises(NoResultFound):
            run_read(conn, none, {"key": "c"}).one()
        conn.rollback()


def test_the_claimers_instance_row_reads_as_the_core_row_does(hub, session):
    """lock_target reads the target's row through the driver: every column must come
    back as SQLAlchemy's own read gives it, value and type (JSON as its value, booleans
    as booleans, not 0 and 1: ``online is False`` takes a target offline; times as
    times), NULLs as None."""
    from b2bhub.engine.machine import lanes
    from b2bhub.models import PluginInstance

    standard_hub(hub, ordered=True, max_concurrent_deliveries=3)
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "writer_a"))
    row.online, row.enabled = False, True
    row.retry_policy = {"strategy": "fixed", "max_attempts": 3, "delay": 1.5}
    row.business_rules = [{"field": "status", "equals": "REJECTED", "block": "instance"}]
    row.config = {"delay": 0, "nested": {"a": [1, 2]}}
    row.probe_checked_at = at(5)
    session.commit()
    core = session.execute(select(PluginInstance.__table__).where(
        PluginInstance.name == "writer_a")).one()
    session.commit()
    turn = lanes.lock_target(session, "writer_a", "w")
    session.rollback()
    for column in PluginInstance.__table__.c:
        ours, theirs = getattr(turn.instance, column.key), getattr(core, column.key)
        assert (ours, type(ours)) == (theirs, type(theirs)), column.key
    assert turn.instance.online is False and turn.instance.ordered is True
    assert turn.instance.blocked_by_delivery_id is None and turn.instance.queue is None


def test_a_process_on_sqlite_never_loads_psycopg(tmp_path):
    """psycopg (its C extension and libpq) is loaded where PostgreSQL is used, not by
    every process: a worker, beat, web or CLI process on the embedded default starts
    about 0.1 s sooner without it. Both apps a process makes (a worker's and the web's)
    and a drain of the driver's statements on SQLite."""
    code = ("import sys\n"
            "from b2bhub import create_app\n"
            "from b2bhub.engine.driver import run_raw\n"
            "url = 'sqlite:///' + sys.argv[1] + '/hub.db'\n"
            "worker = create_app({'DATA_DIR': sys.argv[1], 'SQLALCHEMY_DATABASE_URI': url},"
            " serve_http=False)\n"
            "web = create_app({'DATA_DIR': sys.argv[1], 'SQLALCHEMY_DATABASE_URI': url})\n"
            "with worker.app_context():\n"
            "    engine = worker.extensions['sqlalchemy'].engines[None]\n"
            "    with engine.connect() as conn:\n"
            "        assert run_raw(conn, 'SELECT 1', ()).scalars() == [1]\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'psycopg'))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("B2BHUB_")}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
