"""Claims (SPEC 5): Max Concurrent Deliveries, attempt numbers, one winner per delivery,
and fencing of late outcomes by attempt and lease owner."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, settlement
from b2bhub.engine.sweep import run_sweep
from b2bhub.models import Delivery
from b2bhub.services import config as svc
from tests.conftest import IS_POSTGRES
from tests.enginekit import T0, at, claim_one, delivery, lines, standard_hub, texts


def _messages(hub, n: int, now=T0) -> list[int]:
    return [hub.message(now=now, filename=f"order-{i}.edi").id for i in range(n)]


def _in_progress(session, target: str = "writer_a") -> int:
    session.expire_all()
    return session.scalar(select(func.count()).select_from(Delivery).where(
        Delivery.target == target, Delivery.state == "in_progress"))


def test_claims_never_pass_max_concurrent_deliveries(hub, session):
    standard_hub(hub, max_concurrent_deliveries=2)
    hub.route("inbox", "*", "*", "writer_a")
    _messages(hub, 5)

    won = []
    for i in range(4):
        won += claiming.claim(session, "writer_a", f"worker-{i}", at(1), 16, 300)
        session.commit()
        assert _in_progress(session) <= 2
    assert len(won) == 2 and _in_progress(session) == 2

    assert settlement.settle(session, won[0], Outcome.delivered(), RetryPolicy(), at(2))
    session.commit()
    [third] = claiming.claim(session, "writer_a", "worker-9", at(3), 16, 300)
    session.commit()
    assert third.delivery_id not in {c.delivery_id for c in won}
    assert _in_progress(session) == 2


def test_every_claim_increments_the_attempt(hub, session):
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    [message_id] = _messages(hub, 1)

    attempts = []
    for n in range(3):
        won = claim_one(session, "writer_a", "worker-a", at(n))
        attempts.append(won.attempt)
        assert delivery(session, won.delivery_id).attempt == won.attempt
        assert settlement.interrupt(session, won, at(n), wire_started=False, reason="stop")
        session.commit()
    assert attempts == [1, 2, 3]
    started = [t for t in texts(session, message_id) if t.endswith("started")]
    assert started == [f"writer_a: attempt {n} started" for n in (1, 2, 3)]


def _race(claimants: int, rounds_limit: int) -> list[list[claiming.Claim]]:
    """Claimants on connections of their own start together and claim until empty."""
    engine = db.engine
    barrier = threading.Barrier(claimants)
    results: list[list[claiming.Claim]] = [[] for _ in range(claimants)]
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            with Session(engine) as own:
                barrier.wait()
                while True:
                    won = claiming.claim(own, "writer_a", f"worker-{index}", at(1),
                                         rounds_limit, 300)
                    own.commit()
                    if not won:
                        return
                    results[index] += won
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(claimants)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


def test_two_claimants_never_both_win_a_delivery(hub, session):
    standard_hub(hub, max_concurrent_deliveries=100)
    hub.route("inbox", "*", "*", "writer_a")
    ids = _messages(hub, 30)

    results = _race(claimants=2, rounds_limit=3)

    won = [c.delivery_id for claims in results for c in claims]
    assert len(won) == len(set(won)) == 30
    assert all(c.attempt == 1 for claims in results for c in claims)
    for message_id in ids:
        assert len([t for t in texts(session, message_id) if t.endswith("started")]) == 1


@pytest.mark.parametrize(("maximum", "queued", "batch"), [(3, 12, 2), (40, 100, 16)])
def test_racing_claimants_together_respect_max_concurrent_deliveries(hub, session, maximum,
                                                                     queued, batch):
    """Also when the maximum is split into lanes (PostgreSQL: two of 20 for 40)."""
    standard_hub(hub, max_concurrent_deliveries=maximum)
    hub.route("inbox", "*", "*", "writer_a")
    _messages(hub, queued)

    results = _race(claimants=4, rounds_limit=batch)

    assert sum(len(claims) for claims in results) == maximum
    assert _in_progress(session) == maximum
    if IS_POSTGRES and maximum == 40:
        assert sorted(c.lane for claims in results for c in claims) == [0] * 20 + [1] * 20


@pytest.mark.parametrize("second_owner", ["worker-b", "worker-a"])
def test_a_late_outcome_of_an_expired_attempt_is_fenced_off(hub, session, second_owner):
    """Also when the same process claims it again: then only the attempt number tells
    the two attempts apart."""
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    [message_id] = _messages(hub, 1)
    first = claim_one(session, "writer_a", "worker-a", at(0), lease_seconds=300)

    assert run_sweep(session, at(300), "sweeper").leases_expired == 0  # not yet past
    assert run_sweep(session, at(301), "sweeper").leases_expired == 1
    assert "writer_a: attempt 1 interrupted: lease expired" in texts(session, message_id)
    second = claim_one(session, "writer_a", second_owner, at(302))
    assert (first.attempt, second.attempt) == (1, 2)

    assert settlement.settle(session, first, Outcome.delivered("late"), RetryPolicy(),
                             at(303)) is False
    session.commit()
    row = delivery(session, second.delivery_id)
    assert (row.state, row.attempt, row.lease_owner) == ("in_progress", 2, second_owner)
    [stale] = lines(session, message_id, "stale_outcome_ignored")
    assert stale.data == {"attempt": 1, "current_attempt": 2, "outcome": "delivered"}
    assert "attempt 1 arrived after the delivery moved on" in stale.text

    assert settlement.settle(session, second, Outcome.delivered("on time"), RetryPolicy(),
                             at(304)) is True
    session.commit()
    row = delivery(session, second.delivery_id)
    assert (row.state, row.attempt, row.last_result) == ("delivered", 2, "on time")


def test_an_outcome_past_the_lease_time_stands_until_the_sweep_puts_it_back(hub, session):
    """The attempt really ended that way; refusing it would only send the message twice."""
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    _messages(hub, 1)
    won = claim_one(session, "writer_a", "worker-a", at(0), lease_seconds=300)

    assert settlement.settle(session, won, Outcome.delivered(), RetryPolicy(), at(400))
    session.commit()
    assert delivery(session, won.delivery_id).state == "delivered"
    assert run_sweep(session, at(401), "sweeper").leases_expired == 0


def test_a_disabled_target_claims_nothing(hub, session):
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    _messages(hub, 1)
    svc.save_instance(session, hub.registry, {"enabled": False},
                      existing=svc.get_instance(session, "writer_a"))
    session.commit()

    assert claiming.claim(session, "writer_a", "worker-a", at(1), 16, 300) == []


def test_a_delivery_is_claimable_at_the_exact_moment_it_falls_due(hub, session):
    """Due at 09:00:00.000000 and claimed at 09:00:00 (a whole second): both databases
    must compare the two as equal times, not as differently formatted strings."""
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    [message_id] = _messages(hub, 1, now=T0)

    won = claim_one(session, "writer_a", "worker-a", T0, lease_seconds=300)

    row = delivery(session, won.delivery_id)
    assert (row.due_at, row.lease_until, row.updated_at) == (T0, at(300), T0)
    assert run_sweep(session, at(300), "sweeper").leases_expired == 0
    assert run_sweep(session, at(300, microseconds=1), "sweeper").leases_expired == 1
    assert lines(session, message_id)[-1].type == "status_changed"


def test_a_queued_delivery_from_a_clock_ahead_is_claimed_a_retry_waits(hub, session):
    """A worker whose clock runs 10 minutes ahead took a message in: its delivery is
    queued 'due' 10 minutes in the others' future, and they claim it at once; a retry is
    a promise of its time and waits for the claimer's clock."""
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    ahead = _messages(hub, 1, now=at(minutes=10))
    [claim] = claiming.claim(session, "writer_a", "w1", at(), 16, 300)
    session.commit()
    assert claim.message_id == ahead[0]
    settlement.settle(session, claim, Outcome.retry("busy", at=at(minutes=10)), RetryPolicy(),
                      at())
    session.commit()
    assert claiming.claim(session, "writer_a", "w1", at(minutes=9), 16, 300) == []
    assert len(claiming.claim(session, "writer_a", "w1", at(minutes=10), 16, 300)) == 1
    session.commit()
    far = _messages(hub, 1, now=at(minutes=30))  # beyond any skew: not claimed before
    assert claiming.claim(session, "writer_a", "w2", at(minutes=10), 16, 300) == []
    assert claiming.claim(session, "writer_a", "w2", at(minutes=15, seconds=1), 16,
                          300)[0].message_id == far[0]
