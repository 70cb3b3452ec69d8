"""Two workers settle two deliveries of one message at the same time: the stored status
must account for both, whichever commits last."""

from __future__ import annotations

import threading
import time

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine import operator
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

    assert _status_and_last_change(session, message.id) == ("delivered", "delivered")


def _one_delivery_claimed(hub, db):
    """A message routed to 'left' alone, its one delivery claimed; then a route to
    'right' that a redispatch of the message will add a delivery for."""
    hub.parties()
    hub.instance("inbox", "manual_source")
    for target in ("left", "right"):
        hub.instance(target, "noop")
    hub.route("inbox", "*", "*", "left")
    message = hub.message()
    with Session(db.engine) as claimer:
        left = claiming.claim(claimer, "left", "worker-1", utcnow(), 1, 300)[0]
        claimer.commit()
    hub.route("inbox", "*", "*", "right")
    return message, left


def _settle_in_hot_path(engine, claim) -> None:
    """Settle the claim delivered as a drain does: with the next claim's transaction
    (:func:`claiming.settle_and_claim`, the path a shortcut for messages of one delivery
    would take)."""
    with Session(engine) as worker:
        settling = settlement.plan([(claim, Outcome.delivered("ok"))], RetryPolicy(),
                                   utcnow(), engine.dialect.name == "postgresql")
        written, _claims, _instance = claiming.settle_and_claim(
            worker, settling, "left", "worker-1", 300, lambda _instance: 0)
        assert written == [True]
        worker.commit()


def _status_and_last_change(session, message_id: int) -> tuple[str, str]:
    session.expire_all()
    last = session.scalars(select(HistoryLine).where(
        HistoryLine.message_id == message_id, HistoryLine.type == "status_changed")
        .order_by(HistoryLine.id.desc())).first()
    return session.get(Message, message_id).status, last.data["to"]


def _delivery_states(session, message_id: int) -> list[tuple[str, str]]:
    return sorted((d.target, d.state) for d in session.get(Message, message_id).deliveries)


def test_a_delivery_added_after_the_claim_of_the_only_one_counts_in_its_settlement(
        hub, session, db):
    """The claim saw one delivery; a redispatch added another before the settlement. The
    settlement must not store Delivered from its own delivery alone (a status written
    from the claimed delivery alone, unlocked, did: bench/RESULTS.md, seventh session)."""
    message, left = _one_delivery_claimed(hub, db)
    with Session(db.engine) as operator_session:
        operator.redispatch(operator_session, message.id, "alice", utcnow())
        operator_session.commit()

    _settle_in_hot_path(db.engine, left)

    assert _status_and_last_change(session, message.id) == ("in_progress", "in_progress")
    assert _delivery_states(session, message.id) == [("left", "delivered"), ("right", "queued")]


def test_a_delivery_being_added_while_the_only_one_settles_counts_once_committed(
        hub, session, db):
    """The redispatch holds the message when the settlement writes its status: the
    settlement waits, then finds the message changed and derives it from both."""
    message, left = _one_delivery_claimed(hub, db)
    first = Session(db.engine)
    operator.redispatch(first, message.id, "alice", utcnow())  # not committed yet

    worker = threading.Thread(target=_settle_in_hot_path, args=(db.engine, left))
    worker.start()
    _blocked_or_done(db.engine, worker)
    first.commit()
    first.close()
    worker.join(30)
    assert not worker.is_alive()

    assert _status_and_last_change(session, message.id)[0] == "in_progress"
    assert _delivery_states(session, message.id) == [("left", "delivered"), ("right", "queued")]


def test_the_only_delivery_claimed_and_delivered_writes_its_status_lines_once(
        hub, session, db):
    """The hot path stores each change of a message of one delivery and its one line."""
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("left", "noop")
    hub.route("inbox", "*", "*", "left")
    message = hub.message()
    with Session(db.engine) as claimer:
        settling = settlement.plan([], None, utcnow(), db.engine.dialect.name == "postgresql")
        _written, claims, _instance = claiming.settle_and_claim(
            claimer, settling, "left", "worker-1", 300, lambda _instance: 1)
        claimer.commit()
    _settle_in_hot_path(db.engine, claims[0])

    texts = [line.text for line in session.scalars(select(HistoryLine).where(
        HistoryLine.message_id == message.id, HistoryLine.type == "status_changed")
        .order_by(HistoryLine.id))]
    assert texts == ["Received → In progress", "In progress → Delivered"]
    assert _status_and_last_change(session, message.id) == ("delivered", "delivered")
