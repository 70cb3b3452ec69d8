"""Claimers of one lane of a target take turns on the lane's lock, and every claimer
holds the instance row FOR SHARE, so a writer of the row waits for the claims under way
(PostgreSQL, ``lanes.lock_target``). A worker that settles while another holds the
only lane with room, or while a writer holds the row, must not wait for it with its
settlements' message rows locked: it commits the settlements alone, then waits for its
turn to claim in a transaction of its own."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, lanes, settlement
from b2bhub.engine.runner import TargetRunner
from b2bhub.models import Delivery, PluginInstance
from b2bhub.runtime.hub import new_session
from tests.enginekit import at, deliveries, message, standard_hub, texts

LOCK_ROW = text("SELECT name FROM plugin_instances WHERE name = 'writer_a' FOR UPDATE")


def _in_thread(work, holder: Session, timeout: float = 10.0):
    """Run ``work`` in a thread; fail (instead of hanging) if it is still waiting after
    ``timeout`` seconds, letting ``holder``'s locks go so that it can end."""
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("value", work()))
    worker.start()
    worker.join(timeout)
    waited = worker.is_alive()
    if waited:
        holder.rollback()
        worker.join(timeout)
    assert not waited, "blocked: it waited for the other claimer's turn"
    return result["value"]


def _hold(holder: Session, kind: str) -> None:
    """Another worker in the middle of its claim (holding the one lane of a target whose
    maximum is 16), or a writer of the instance row (a change of its configuration)."""
    if kind == "claimer":
        turn = lanes.lock_target(holder, "writer_a", "other")
        assert (turn.lanes, turn.lane) == (1, 0)
    else:
        holder.execute(LOCK_ROW)


@pytest.mark.parametrize("kind", ["claimer", "writer"])
def test_a_settlement_commits_without_waiting_for_another_claimers_turn(hub, session, db,
                                                                         kind):
    standard_hub(hub, max_concurrent_deliveries=16)
    hub.route("inbox", "*", "*", "writer_a")
    first, second = hub.message(now=at()).id, hub.message(now=at()).id
    session.commit()
    [claim] = claiming.claim(session, "writer_a", "w", at(1), 1, 300)
    session.commit()
    postgres = db.engine.dialect.name == "postgresql"

    holder = Session(db.engine)
    if postgres:
        _hold(holder, kind)
    worker = Session(db.engine)

    def settle():
        settling = settlement.plan([(claim, Outcome.delivered("ok"))], RetryPolicy(),
                                   at(2), postgres)
        result = claiming.settle_and_claim(worker, settling, "writer_a", "w", 300,
                                           lambda instance: 16)
        worker.commit()
        return result

    written, claims, instance = _in_thread(settle, holder)
    assert written == [True] and instance.name == "writer_a"
    session.expire_all()
    assert message(session, first).status == "delivered"
    assert texts(session, first)[-2:] == ["writer_a: attempt 1 delivered: ok",
                                          "In progress → Delivered"]
    if postgres:
        # nothing claimed in that transaction: the caller claims when its turn comes
        assert claims is None
        assert [d.state for d in deliveries(session, second)] == ["queued"]
        holder.rollback()
        row = lanes.lock_target(worker, "writer_a")
        claims = claiming.claim(worker, "writer_a", "w", at(3), 16, 300, row)
        worker.commit()
    else:  # one writer at a time: the settlement and the next claim share a commit
        assert claims is not None
    assert [c.message_id for c in claims] == [second]
    session.expire_all()
    assert [d.state for d in deliveries(session, second)] == ["in_progress"]
    assert message(session, second).status == "in_progress"
    holder.close()
    worker.close()


def test_a_drain_settles_while_another_claimer_holds_the_turn_and_delivers_all(
        hub, session, registry, db):
    """The runner's path: the target row is held from inside the first attempt; the
    first settlement is visible while it is held, and when the row is let go the drain
    claims and delivers the rest."""
    standard_hub(hub, max_concurrent_deliveries=1)  # batches of one
    hub.route("inbox", "*", "*", "writer_a")
    ids = [hub.message().id for _ in range(3)]
    session.commit()
    postgres = db.engine.dialect.name == "postgresql"
    runner = TargetRunner(new_session, registry, hub.store, "w")
    runner.settle_window = 3600  # a batch settles with the next claim
    held, seen, engine = threading.Event(), {}, db.engine

    def hold_the_row():
        with Session(engine) as other, Session(engine) as look:
            other.execute(LOCK_ROW)
            held.set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # until the first settlement commits
                look.expire_all()
                state = look.scalar(select(Delivery.state).where(
                    Delivery.message_id == ids[0]))
                look.rollback()
                if state == "delivered":
                    seen["settled_while_held"] = True
                    break
                time.sleep(0.02)
            other.rollback()

    holder = threading.Thread(target=hold_the_row)
    instance = session.scalar(select(PluginInstance).where(PluginInstance.name == "writer_a"))
    plugin = runner._plugin(instance)
    noop = plugin.deliver

    def deliver(delivery, payload, context):
        if postgres and delivery.message_id == ids[0]:
            holder.start()
            held.wait(10)
        return noop(delivery, payload, context)

    plugin.deliver = deliver
    report = runner.drain("writer_a", budget=30)  # the holder lets go after 10 s at most
    if postgres:
        holder.join(15)
        assert seen == {"settled_while_held": True}
    assert (report.claimed, report.settled, report.stale) == (3, 3, 0)
    session.expire_all()
    for message_id in ids:
        assert [d.state for d in deliveries(session, message_id)] == ["delivered"]
        assert message(session, message_id).status == "delivered"
        assert texts(session, message_id, "delivery_changed") == [
            "writer_a: queued", "writer_a: attempt 1 started",
            "writer_a: attempt 1 delivered: ok"]
