"""The sweep's indexes hold only the rows it looks for (migration 0023): a delivery's
wake-up time, lease and receipt deadline are indexed only while set, so the claims and
settlements of a busy target (which clear them) add no entry to those indexes, and the
messages' correlation id only where a source gave one. Here: each index is partial in
the database the migrations made, and the statements the sweep and the message list
send still find their rows through it among 10,000 settled deliveries, with or
without planner statistics, on both backends."""

from __future__ import annotations

import pytest
from sqlalchemy import DateTime, bindparam, event, text

from b2bhub.engine.machine import receipts, recovery, wake
from b2bhub.engine.settings import DeliverySettings
from b2bhub.services.messages import MessageFilter, list_messages
from tests.enginekit import at, standard_hub

PARTIAL = {"ix_deliveries_state_wake": "next_wake_at",
           "ix_deliveries_state_lease": "lease_until",
           "ix_deliveries_state_receipt": "receipt_deadline",
           "ix_messages_correlation_id": "correlation_id"}


def _postgres(session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def test_each_index_holds_only_the_rows_with_its_column_set(session):
    if _postgres(session):
        found = dict(session.execute(text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(:names)"),
            {"names": list(PARTIAL)}).all())
    else:
        found = dict(session.execute(text(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index'")).all())
    for name, column in PARTIAL.items():
        assert name in found, name
        assert f"WHERE ({column} IS NOT NULL)" in found[name].replace(
            f"WHERE {column} IS NOT NULL", f"WHERE ({column} IS NOT NULL)"), found[name]
    # no query looks a delivery up by its receipt reference: its index is gone
    assert "ix_deliveries_receipt_ref" not in found


def _load(session) -> None:
    """10,000 delivered deliveries (none of the columns set, their messages without a
    correlation id) and the few rows each sweep statement is after."""
    series = ("WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL "
              "SELECT g + 1 FROM s WHERE g < 10010) ")
    t = bindparam("t", type_=DateTime())
    session.execute(text(series + """
        INSERT INTO messages (id, source, from_party, to_party, direction, size, status,
                              status_text, created_at, updated_at, correlation_id)
        SELECT g, 'inbox', 'acme', 'mycompany', 'inbound', 1,
               CASE WHEN g <= 10000 THEN 'delivered' ELSE 'in_progress' END, '', :t, :t,
               CASE WHEN g = 10001 THEN 'order-4711' END
          FROM s""").bindparams(t), {"t": at()})
    # 10001-10003 due for a wake-up, 10004-10006 in progress with their lease run out,
    # 10007-10010 awaiting a receipt past its deadline
    session.execute(text(series + """
        INSERT INTO deliveries (id, message_id, target, state, attempt, failures, due_at,
                                wake_count, last_result, created_at, updated_at,
                                next_wake_at, lease_owner, lease_until, receipt_ref,
                                receipt_deadline)
        SELECT g, g, 'writer_a',
               CASE WHEN g <= 10000 THEN 'delivered' WHEN g <= 10003 THEN 'queued'
                    WHEN g <= 10006 THEN 'in_progress' ELSE 'awaiting_receipt' END,
               1, 0, :t, 0, '', :t, :t,
               CASE WHEN g BETWEEN 10001 AND 10003 THEN :t END,
               CASE WHEN g BETWEEN 10004 AND 10006 THEN 'w' END,
               CASE WHEN g BETWEEN 10004 AND 10006 THEN :t END,
               CASE WHEN g > 10006 THEN 'r' || g END,
               CASE WHEN g > 10006 THEN :t END
          FROM s""").bindparams(t), {"t": at()})
    session.commit()


def _plans(session, run) -> list[str]:
    """The plans of the reads and writes ``run`` sends (run, then rolled back)."""
    sent = []

    def before(conn, cursor, statement, params, context, executemany):
        if not executemany and statement.split()[0].upper() in ("SELECT", "UPDATE", "WITH"):
            sent.append((statement, params))

    engine = session.get_bind()
    event.listen(engine, "before_cursor_execute", before)
    try:
        run()
    finally:
        event.remove(engine, "before_cursor_execute", before)
    session.rollback()
    explain = "EXPLAIN " if _postgres(session) else "EXPLAIN QUERY PLAN "
    conn = session.connection()
    plans = [" ".join(str(row[-1]) for row in conn.exec_driver_sql(explain + sql, params))
             for sql, params in sent]
    session.rollback()
    return plans


@pytest.mark.parametrize("analyzed", [False, True], ids=["no statistics", "analyzed"])
def test_the_sweep_and_the_list_find_their_rows_through_the_partial_indexes(
        hub, session, analyzed):
    standard_hub(hub)
    _load(session)
    if analyzed:
        session.execute(text("ANALYZE"))
        session.commit()
    now = at(60)
    settings = DeliverySettings()
    runs = {
        "ix_deliveries_state_wake": lambda: wake.wake_due(session, now, settings, 100),
        "ix_deliveries_state_lease": lambda: recovery.expire_leases(session, now, 100),
        "ix_deliveries_state_receipt": lambda: receipts.fail_overdue_receipts(
            session, now, 100),
        "ix_messages_correlation_id": lambda: list_messages(
            session, MessageFilter(correlation_id="order-4711"), 50),
    }
    for index, run in runs.items():
        plans = _plans(session, run)
        assert any(index in plan for plan in plans), (index, plans)
        if _postgres(session):
            assert not any("Seq Scan on deliveries" in p or "Seq Scan on messages" in p
                           for p in plans), (index, plans)
        else:
            assert not any("SCAN deliveries" in p.replace("SCAN deliveries USING", "")
                           or "SCAN messages" in p.replace("SCAN messages USING", "")
                           for p in plans), (index, plans)


def test_the_sweep_still_acts_on_the_rows_it_finds(hub, session):
    """What the plans above find is what the sweep does: the three wake-ups counted, the
    three leases put back, the four receipts failed; the settled rows untouched."""
    standard_hub(hub)
    _load(session)
    now = at(60)
    assert len(wake.wake_due(session, now, DeliverySettings(), 100)) >= 1
    assert recovery.expire_leases(session, now, 100) == 3
    assert receipts.fail_overdue_receipts(session, now, 100) == 4
    session.commit()
    states = dict(session.execute(text(
        "SELECT state, count(*) FROM deliveries GROUP BY state")).all())
    assert states == {"delivered": 10000, "queued": 6, "failed": 4}
    woken = session.execute(text(
        "SELECT count(*) FROM deliveries WHERE wake_count = 1 AND id <= 10003")).scalar()
    assert woken == 3
