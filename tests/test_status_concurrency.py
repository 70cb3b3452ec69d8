"""Two workers settle two deliveries of one message at the same time: the stored status
must account for both, whichever commits last."""

from __future__ import annotations

import threading
import time

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import HistoryLine, Message, utcnow


def _blocked_or_done(engine, worker: threading.Thread, timeout: float = 10.0) -> None:
    """Wait until the second settlement waits for a lock (PostgreSQL) or has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and worker.is_alive():
        if engine.dialect.name != "postgresql":
            time.sleep(0.5)  # SQLite: it waits for the write lock; nothing to observe
            return
        with engine.connect() as conn:
            waiting = conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'")).scalar()
        if waiting:
            return
        time.sleep(0.02)


def test_concurrent_settlements_of_one_message_store_the_status_of_both(hub, session, db):
    hub.parties()
    hub.instance("inbox", "manual_source")
    for target in ("left", "right"):
        hub.instance(target, "noop")
        hub.route("inbox", "*", "*", target)
    message = hub.message()
    engine, now = db.engine, utcnow()
    with Session(engine) as claimer:
        left = claiming.claim(claimer, "left", "worker-1", now, 1, 300)[0]
        right = claiming.claim(claimer, "right", "worker-2", now, 1, 300)[0]
        claimer.commit()

    first = Session(engine)
    assert settlement.settle(first, left, Outcome.delivered("ok"), RetryPolicy(), now)

    def settle_right() -> None:
        with Session(engine) as second:
            settlement.settle(second, right, Outcome.delivered("ok"), RetryPolicy(), now)
            second.commit()

    worker = threading.Thread(target=settle_right)
    worker.start()
    _blocked_or_done(engine, worker)
    first.commit()
    first.close()
    worker.join(30)

    session.expire_all()
    assert session.get(Message, message.id).status == "delivered"
    last = session.scalars(select(HistoryLine).where(
        HistoryLine.message_id == message.id, HistoryLine.type == "status_changed")
        .order_by(HistoryLine.id.desc())).first()
    assert last.data["to"] == "delivered"
