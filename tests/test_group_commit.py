"""Group commit: outcomes of a claimed batch settle together, each fenced on its own."""

from __future__ import annotations

from sqlalchemy import select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, recovery, settlement
from b2bhub.engine.runner import TargetRunner
from b2bhub.models import Message, PluginInstance
from b2bhub.runtime.hub import new_session
from tests.enginekit import at, deliveries, lines, standard_hub


def test_one_stale_outcome_leaves_the_others_of_the_batch_written(hub, session):
    standard_hub(hub, max_concurrent_deliveries=10)
    hub.route("inbox", "*", "*", "writer_a")
    ids = [hub.message(now=at()).id for _ in range(3)]
    claims = claiming.claim(session, "writer_a", "worker-a", at(1), 3, 60)
    session.commit()
    # the middle one's lease expires and another worker takes it over
    recovery.expire_leases(session, at(120), limit=10)  # all three expire...
    session.commit()
    again = claiming.claim(session, "writer_a", "worker-b", at(121), 3, 60)
    session.commit()
    assert len(again) == 3
    # ...worker-b settles the first and last, worker-a's whole batch arrives late
    settlement.settle_many(session, [(again[0], Outcome.delivered("b1")),
                                     (again[2], Outcome.delivered("b3"))], RetryPolicy(), at(122))
    session.commit()
    written = settlement.settle_many(session, [(c, Outcome.delivered("late")) for c in claims],
                                     RetryPolicy(), at(123))
    session.commit()

    assert written == [False, False, False]
    states = [deliveries(session, i)[0].state for i in ids]
    assert states == ["delivered", "in_progress", "delivered"]
    assert [len(lines(session, i, "stale_outcome_ignored")) for i in ids] == [1, 1, 1]
    written = settlement.settle_many(session, [(again[1], Outcome.delivered("b2"))],
                                     RetryPolicy(), at(124))
    session.commit()
    assert written == [True]
    assert deliveries(session, ids[1])[0].state == "delivered"


def test_a_batch_mixing_outcomes_settles_each_as_its_own(hub, session):
    standard_hub(hub, max_concurrent_deliveries=10)
    hub.route("inbox", "*", "*", "writer_a")
    ids = [hub.message(now=at()).id for _ in range(3)]
    claims = claiming.claim(session, "writer_a", "w", at(1), 3, 60)
    written = settlement.settle_many(session, [
        (claims[0], Outcome.delivered("ok")),
        (claims[1], Outcome.error("connection", "refused")),
        (claims[2], Outcome.failed("no such stage"))], RetryPolicy(), at(2))
    session.commit()
    assert written == [True, True, True]
    assert [deliveries(session, i)[0].state for i in ids] == ["delivered", "retrying",
                                                              "failed"]
    assert [session.get(Message, i).status for i in ids] == ["delivered", "retrying",
                                                             "error"]


def test_a_stop_mid_batch_settles_the_outcomes_already_gathered(hub, session, registry):
    standard_hub(hub, max_concurrent_deliveries=16)
    hub.route("inbox", "*", "*", "writer_a")
    ids = [hub.message().id for _ in range(5)]
    runner = TargetRunner(new_session, registry, hub.store, "w")
    runner.settle_window = 3600  # nothing would settle before the batch ends

    class StopAfterTwo:
        calls = 0

        def __call__(self, delivery, payload, context):
            self.calls += 1
            if self.calls == 2:
                runner.stop.requested.set()
            return Outcome.delivered("ok")

    plugin = runner._plugin(session.scalar(select(PluginInstance).where(
        PluginInstance.name == "writer_a")))
    plugin.deliver = StopAfterTwo()
    assert runner._plugin(session.scalar(select(PluginInstance).where(
        PluginInstance.name == "writer_a"))) is plugin
    try:
        report = runner.drain("writer_a", budget=10)
    finally:
        runner.stop.requested.clear()
    assert (report.claimed, report.settled) == (5, 2)
    states = [deliveries(session, i)[0].state for i in ids]
    assert states == ["delivered", "delivered", "queued", "queued", "queued"]


def test_delivered_outcomes_written_together_are_each_fenced(hub, session):
    from b2bhub.engine import operator

    standard_hub(hub, max_concurrent_deliveries=10)
    hub.route("inbox", "*", "*", "writer_a")
    ids = [hub.message(now=at()).id for _ in range(3)]
    claims = claiming.claim(session, "writer_a", "w", at(1), 3, 60)
    session.commit()
    operator.cancel_delivery(session, claims[1].delivery_id, "carol", at(2))
    session.commit()

    written = settlement.settle_many(session, [(c, Outcome.delivered(f"wrote {i}"))
                                               for i, c in enumerate(claims)],
                                     RetryPolicy(), at(3))
    session.commit()

    assert written == [True, False, True]
    rows = [deliveries(session, i)[0] for i in ids]
    assert [r.state for r in rows] == ["delivered", "cancelled", "delivered"]
    assert [r.last_result for r in rows] == ["wrote 0", "", "wrote 2"]
    assert [len(lines(session, i, "stale_outcome_ignored")) for i in ids] == [0, 1, 0]
    assert [session.get(Message, i).status for i in ids] == ["delivered", "cancelled",
                                                             "delivered"]


def test_a_batch_of_one_owner_holds_each_row_to_its_own_attempt(hub, session):
    """One delivered UPDATE settles a batch of one owner: a row whose attempt moved on
    (put back and claimed again by the same owner) is refused, the others are written,
    each with its own result."""
    standard_hub(hub, max_concurrent_deliveries=10)
    hub.route("inbox", "*", "*", "writer_a")
    ids = [hub.message(now=at()).id for _ in range(3)]
    claims = claiming.claim(session, "writer_a", "w", at(1), 3, 60)
    session.commit()
    assert settlement.interrupt(session, claims[1], at(2), False, "test")
    session.commit()
    [again] = claiming.claim(session, "writer_a", "w", at(3), 3, 60)
    session.commit()
    assert (again.delivery_id, again.attempt) == (claims[1].delivery_id, 2)

    written = settlement.settle_many(session, [(c, Outcome.delivered(f"r{i}"))
                                               for i, c in enumerate(claims)],
                                     RetryPolicy(), at(4))
    session.commit()
    assert written == [True, False, True]
    rows = [deliveries(session, i)[0] for i in ids]
    assert [(r.state, r.attempt, r.last_result) for r in rows] == [
        ("delivered", 1, "r0"), ("in_progress", 2, ""), ("delivered", 1, "r2")]
    assert [len(lines(session, i, "stale_outcome_ignored")) for i in ids] == [0, 1, 0]

    written = settlement.settle_many(session, [(again, Outcome.delivered("second")),
                                               (claims[0], Outcome.delivered("late"))],
                                     RetryPolicy(), at(5))
    session.commit()
    assert written == [True, False]
    rows = [deliveries(session, i)[0] for i in ids[:2]]
    assert [(r.state, r.last_result) for r in rows] == [("delivered", "r0"),
                                                        ("delivered", "second")]
