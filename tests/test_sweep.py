"""The sweep (SPEC 5): re-wakes lost wake-ups on their schedule, stalls what nobody
claims, and runs in one process at a time in bounded steps."""

from __future__ import annotations

import dataclasses
import time

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy, Strategy
from b2bhub.engine import settings
from b2bhub.engine import wakeups as wakeup_module
from b2bhub.engine.machine import claiming, recovery, settlement
from b2bhub.engine.sweep import SweepGuard, run_sweep
from b2bhub.models import Delivery
from tests.enginekit import (
    T0,
    Broker,
    alerts,
    at,
    claim_one,
    deliveries,
    message,
    standard_hub,
    texts,
)


@pytest.fixture
def broker():
    stand_in = Broker()
    wakeup_module.set_publisher(stand_in)
    return stand_in


def _lost_wakeup(hub, session, broker) -> Delivery:
    """A message dispatched at T0 whose wake-up the broker lost."""
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    broker.lose = True
    sent = hub.message(now=T0)
    broker.lose = False
    [row] = deliveries(session, sent.id)
    return row


def _sweep_woke(session, broker, now) -> list[tuple[int, str]]:
    report = run_sweep(session, now, "sweeper")
    assert report.ran
    woken = broker.take()
    assert report.woken == len(woken)
    return woken


#: seconds after dispatch: a re-wake 10 s, 30 s, 2 min and 10 min apart, then 10 min
#: later (the 5th wake-up counted with the one published at dispatch) stalled
REWAKES = (10, 40, 160, 760)
STALL_AT = 1360  # 22 min 40 s


def test_a_lost_wakeup_is_rewoken_on_schedule_then_stalled(hub, session, broker):
    row = _lost_wakeup(hub, session, broker)

    for due in REWAKES:
        assert _sweep_woke(session, broker, at(due - 1)) == [], f"woken before {due} s"
        assert _sweep_woke(session, broker, at(due)) == [(row.id, "writer_a")], due
        assert deliveries(session, row.message_id)[0].state == "queued"

    assert _sweep_woke(session, broker, at(STALL_AT - 1)) == []
    assert message(session, row.message_id).status == "received"
    report = run_sweep(session, at(STALL_AT), "sweeper")
    assert (report.stalled, report.woken, broker.take()) == (1, 0, [])

    [stalled] = deliveries(session, row.message_id)
    assert (stalled.state, stalled.attempt) == ("stalled", 0)
    assert message(session, row.message_id).status == "stalled"
    assert "writer_a: stalled: woken 5 times without a claim (target stopped, disabled " \
           "or overloaded)" in texts(session, row.message_id)
    [alert] = alerts(session, "delivery_stalled", f"delivery:{row.id}")
    assert alert.resolved_at is None and alert.message_id == row.message_id
    assert _sweep_woke(session, broker, at(STALL_AT, hours=5)) == []  # stays stalled


def test_claiming_a_stalled_delivery_resolves_its_alert(hub, session, broker):
    row = _lost_wakeup(hub, session, broker)
    for due in (*REWAKES, STALL_AT):
        run_sweep(session, at(due), "sweeper")
    assert deliveries(session, row.message_id)[0].state == "stalled"

    won = claim_one(session, "writer_a", "worker-a", at(STALL_AT + 60))  # target started

    assert (won.delivery_id, won.attempt) == (row.id, 1)
    [alert] = alerts(session, "delivery_stalled", f"delivery:{row.id}")
    assert alert.resolved_at == at(STALL_AT + 60)
    assert message(session, row.message_id).status == "in_progress"


def test_the_stall_after_setting_changes_when_a_delivery_stalls(hub, session, broker):
    settings.save_settings(session, dataclasses.replace(settings.load_settings(session),
                                                        stall_after=2))
    session.commit()
    row = _lost_wakeup(hub, session, broker)

    assert _sweep_woke(session, broker, at(10)) == [(row.id, "writer_a")]
    assert run_sweep(session, at(39), "sweeper").stalled == 0
    assert run_sweep(session, at(40), "sweeper").stalled == 1
    assert deliveries(session, row.message_id)[0].state == "stalled"
    assert "writer_a: stalled: woken 2 times without a claim (target stopped, disabled " \
           "or overloaded)" in texts(session, row.message_id)


def test_the_wake_delays_setting_applies_from_the_first_rewake(hub, session, broker):
    settings.save_settings(session, dataclasses.replace(
        settings.load_settings(session), wake_delays=(5, 15, 60), stall_after=3))
    session.commit()
    row = _lost_wakeup(hub, session, broker)

    assert _sweep_woke(session, broker, at(4)) == []
    assert _sweep_woke(session, broker, at(5)) == [(row.id, "writer_a")]
    assert _sweep_woke(session, broker, at(19)) == []
    assert _sweep_woke(session, broker, at(20)) == [(row.id, "writer_a")]
    assert run_sweep(session, at(79), "sweeper").stalled == 0
    assert run_sweep(session, at(80), "sweeper").stalled == 1


def test_a_retry_that_falls_due_is_woken(hub, session, broker):
    row = _lost_wakeup(hub, session, broker)
    won = claim_one(session, "writer_a", "worker-a", at(1))
    policy = RetryPolicy(strategy=Strategy.FIXED, base_delay=120)
    assert settlement.settle(session, won, Outcome.error("timeout", "no answer"), policy, at(2))
    session.commit()

    assert _sweep_woke(session, broker, at(121)) == []
    assert _sweep_woke(session, broker, at(122)) == [(row.id, "writer_a")]


def _other_session() -> Session:
    return Session(db.engine)


def test_only_one_sweep_runs_at_a_time(session):
    """SQLite: the lease row in ``locks``; PostgreSQL: the advisory lock. Two sessions
    stand for two beat processes."""
    with _other_session() as first, _other_session() as second:
        with SweepGuard(first, "beat-1", T0) as held:
            assert held
            assert run_sweep(second, at(1), "beat-2").ran is False
            assert run_sweep(second, at(2), "beat-2").ran is False
        assert run_sweep(second, at(3), "beat-2").ran is True
        assert run_sweep(first, at(4), "beat-1").ran is True


def test_steps_are_bounded_and_the_sweep_loops_until_done(hub, session):
    standard_hub(hub, max_concurrent_deliveries=10)
    hub.route("inbox", "*", "*", "writer_a")
    for i in range(5):
        hub.message(now=T0, filename=f"order-{i}.edi")
    claims = claiming.claim(session, "writer_a", "worker-a", at(1), 16, 60)
    session.commit()
    assert len(claims) == 5

    assert recovery.expire_leases(session, at(100), 2) == 2  # one bounded step
    session.rollback()
    report = run_sweep(session, at(100), "sweeper", batch=2)

    assert report.leases_expired == 5
    session.expire_all()
    states = session.scalars(select(Delivery.state)).all()
    assert states == ["queued"] * 5
    woken_after = session.scalar(select(func.count()).select_from(Delivery).where(
        Delivery.wake_count == 1, Delivery.next_wake_at == at(110)))
    assert woken_after == 5  # the wake step, also in steps of 2, reached every one


def test_a_sweeper_that_died_holding_the_guard_blocks_sweeps_only_briefly(session):
    """SQLite: its lease row runs out after a minute; PostgreSQL: the advisory lock
    goes with the dead process's connection."""
    with _other_session() as first, _other_session() as second:
        guard = SweepGuard(first, "beat-1", T0)
        assert guard.__enter__()  # and beat-1 never leaves it
        assert run_sweep(second, at(30), "beat-2").ran is False
        if guard.postgres:
            guard.connection.invalidate()  # the process is gone, and its connection
            assert _eventually(lambda: run_sweep(second, at(31), "beat-2").ran)
        else:
            assert run_sweep(second, at(60), "beat-2").ran is False
            assert run_sweep(second, at(61), "beat-2").ran is True


def _eventually(check, seconds: float = 5.0) -> bool:
    """The server ends a dead connection's session a moment after it is cut."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
