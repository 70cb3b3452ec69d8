"""The message status (SPEC 11): stored in the transaction of the delivery change that
caused it, each change a ``status_changed`` history line."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy, Strategy
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import HistoryLine, Message
from tests.enginekit import T0, at, claim_one, lines, message, standard_hub


def _seen_elsewhere(message_id: int) -> tuple[str, int]:
    """The status and the number of history lines, as another connection sees them."""
    with Session(db.engine) as other:
        status = other.scalar(select(Message.status).where(Message.id == message_id))
        count = len(other.scalars(select(HistoryLine.id).where(
            HistoryLine.message_id == message_id)).all())
    return status, count


def test_the_status_commits_or_rolls_back_with_the_delivery_change(hub, session):
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    sent = hub.message(now=T0)
    before = _seen_elsewhere(sent.id)
    assert before[0] == "received"

    assert len(claiming.claim(session, "writer_a", "worker-a", at(1), 1, 300)) == 1
    session.flush()
    assert session.scalar(select(Message.status).where(Message.id == sent.id)) == \
        "in_progress"
    assert _seen_elsewhere(sent.id) == before  # nothing visible before the commit
    session.rollback()
    assert message(session, sent.id).status == "received"
    assert _seen_elsewhere(sent.id) == before

    claim_one(session, "writer_a", "worker-a", at(2))
    status, count = _seen_elsewhere(sent.id)
    assert status == "in_progress" and count > before[1]
    [line] = lines(session, sent.id, "status_changed")
    assert line.data == {"from": "received", "to": "in_progress"}
    assert line.text == "Received → In progress"


def test_every_status_change_is_one_history_line(hub, session):
    standard_hub(hub, targets=("writer_a", "writer_b"))
    hub.route("inbox", "*", "*", "writer_a")
    hub.route("inbox", "*", "*", "writer_b")
    sent = hub.message(now=T0)
    policy = RetryPolicy(strategy=Strategy.FIXED, base_delay=60, max_attempts=3)

    a = claim_one(session, "writer_a", "worker-a", at(1))            # in progress
    assert settlement.settle(session, a, Outcome.delivered(), policy, at(2))
    session.commit()                                                  # still in progress (b)
    b = claim_one(session, "writer_b", "worker-b", at(3))
    assert settlement.settle(session, b, Outcome.error("timeout", "slow"), policy, at(4))
    session.commit()                                                  # retrying
    b = claim_one(session, "writer_b", "worker-b", at(64))           # in progress
    assert settlement.settle(session, b, Outcome.delivered(), policy, at(65))
    session.commit()                                                  # delivered

    changes = [(line.data["from"], line.data["to"])
               for line in lines(session, sent.id, "status_changed")]
    assert changes == [("received", "in_progress"), ("in_progress", "retrying"),
                       ("retrying", "in_progress"), ("in_progress", "delivered")]
    assert message(session, sent.id).status == "delivered"
    stamps = [line.created_at for line in lines(session, sent.id, "status_changed")]
    assert stamps == [at(1), at(4), at(64), at(65)]
