"""Fast, fenced recovery (SPEC 5): the sweep puts back at once the leases of a process
known dead, by the heartbeats in the processes table and the database's clock; the
lease length stays the bound for an owner alive but hung."""

from __future__ import annotations

import signal
import time
from collections import Counter
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine import presence
from b2bhub.engine import wakeups as wakeup_module
from b2bhub.engine.machine import claiming, recovery, settlement
from b2bhub.engine.sweep import run_sweep
from b2bhub.models import Delivery, Process, utcnow
from b2bhub.runtime.agent import Agent
from b2bhub.runtime.hub import CeleryPublisher
from tests.enginekit import Broker, claim_one, delivery, standard_hub, texts
from tests.procs import wait_until
from tests.test_processes import (
    all_delivered,
    attempts,
    delivery_of,
    dispatch_many,
    history,
    rows,
    setup_recorder,
    state_counts,
)

DEAD = "worker-host:4242:dead01"
ALIVE = "worker-host:4343:live01"
WITNESS = "beat-host:4444:beat01"


@pytest.fixture
def broker():
    stand_in = Broker()
    wakeup_module.set_publisher(stand_in)
    return stand_in


def _beat(session, process_id: str, seen: datetime, steady_since: datetime | None = None,
          kind: str = "worker") -> None:
    host, pid, _ = process_id.split(":")
    info = presence.ProcessInfo(process_id, kind, host, int(pid), seen - timedelta(hours=1))
    presence.heartbeat(session, info, [], seen, steady_since)
    session.commit()


def _claimed(hub, session, owner: str, now: datetime) -> claiming.Claim:
    """One delivery of writer_a, claimed by ``owner`` with the default 300 s lease."""
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    hub.message(now=now)
    return claim_one(session, "writer_a", owner, now)


def _ago(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=seconds)


def test_a_dead_owners_lease_is_put_back_by_the_next_sweep_and_fenced(hub, session, broker):
    now = presence.database_now(session)
    won = _claimed(hub, session, DEAD, now)
    _beat(session, DEAD, _ago(now, 16))  # three heartbeats missed (15 s) and one more
    _beat(session, WITNESS, now, steady_since=_ago(now, 60), kind="beat")
    broker.take()  # the wake-up of the dispatch

    report = run_sweep(session, now, "sweeper")

    assert report.owners_gone == 1 and report.leases_expired == 0
    row = delivery(session, won.delivery_id)
    assert (row.state, row.lease_owner, row.lease_until) == ("queued", None, None)
    assert f"writer_a: attempt 1 interrupted: owner {DEAD} gone" in texts(
        session, won.message_id)
    assert broker.take() == [(won.delivery_id, "writer_a")]  # woken by the same sweep

    # the dead attempt's outcome, arriving late after all, is refused
    assert not settlement.settle(session, won, Outcome.delivered("late"), RetryPolicy(), now)
    session.commit()
    assert delivery(session, won.delivery_id).state == "queued"
    again = claim_one(session, "writer_a", ALIVE, now)
    assert (again.delivery_id, again.attempt) == (won.delivery_id, 2)


def test_a_live_owner_keeps_its_lease_however_long_the_attempt(hub, session, broker):
    now = presence.database_now(session)
    won = _claimed(hub, session, ALIVE, _ago(now, 250))  # an attempt of 250 s so far
    _beat(session, ALIVE, _ago(now, 4), steady_since=_ago(now, 250))
    _beat(session, WITNESS, now, steady_since=_ago(now, 60), kind="beat")

    assert run_sweep(session, now, "sweeper").owners_gone == 0
    assert delivery(session, won.delivery_id).state == "in_progress"
    assert settlement.settle(session, won, Outcome.delivered("done"), RetryPolicy(), now)


def test_a_silent_owner_is_not_dead_while_no_other_process_beats_steadily(
        hub, session, broker):
    """After an outage of the database every heartbeat is old; nobody is judged dead
    until heartbeats have flowed again for two intervals."""
    now = presence.database_now(session)
    won = _claimed(hub, session, DEAD, _ago(now, 60))
    _beat(session, DEAD, _ago(now, 40))
    _beat(session, WITNESS, now, steady_since=_ago(now, 3), kind="beat")  # just came back

    assert run_sweep(session, now, "sweeper").owners_gone == 0
    assert delivery(session, won.delivery_id).state == "in_progress"

    _beat(session, WITNESS, now, steady_since=_ago(now, 10), kind="beat")
    assert run_sweep(session, now, "sweeper").owners_gone == 1


def test_a_witness_must_itself_be_fresh_and_not_the_silent_owner(hub, session, broker):
    now = presence.database_now(session)
    won = _claimed(hub, session, DEAD, _ago(now, 60))
    _beat(session, DEAD, _ago(now, 40), steady_since=_ago(now, 600))
    _beat(session, WITNESS, _ago(now, 20), steady_since=_ago(now, 600), kind="beat")

    assert run_sweep(session, now, "sweeper").owners_gone == 0
    assert delivery(session, won.delivery_id).state == "in_progress"


def test_an_owner_that_reported_its_stop_is_gone_at_once(hub, session, broker):
    now = presence.database_now(session)
    won = _claimed(hub, session, DEAD, now)
    _beat(session, DEAD, now)
    presence.mark_stopped(session, DEAD, now)
    session.commit()

    assert run_sweep(session, now, "sweeper").owners_gone == 1
    assert delivery(session, won.delivery_id).state == "queued"


def test_an_owner_with_no_heartbeat_row_waits_for_its_lease(hub, session, broker):
    now = presence.database_now(session)
    won = _claimed(hub, session, "some-other-tool", now)
    _beat(session, WITNESS, now, steady_since=_ago(now, 60), kind="beat")

    assert run_sweep(session, now + timedelta(seconds=299), "sweeper").owners_gone == 0
    assert delivery(session, won.delivery_id).state == "in_progress"
    report = run_sweep(session, now + timedelta(seconds=301), "sweeper")
    assert report.leases_expired == 1
    assert "writer_a: attempt 1 interrupted: lease expired" in texts(session, won.message_id)


def test_the_step_is_bounded_and_the_sweep_loops_until_done(hub, session, broker):
    now = presence.database_now(session)
    standard_hub(hub, max_concurrent_deliveries=10)
    hub.route("inbox", "*", "*", "writer_a")
    for i in range(5):
        hub.message(now=now, filename=f"order-{i}.edi")
    assert len(claiming.claim(session, "writer_a", DEAD, now, 16, 300)) == 5
    session.commit()
    _beat(session, DEAD, _ago(now, 30))
    _beat(session, WITNESS, now, steady_since=_ago(now, 60), kind="beat")

    assert recovery.put_back_from_dead_owners(session, now, now, 2) == 2
    session.rollback()
    assert run_sweep(session, now, "sweeper", batch=2).owners_gone == 5


def test_the_agent_beats_by_the_database_clock_and_counts_its_steady_time(app, session):
    agent = Agent(app, "worker")
    agent._heartbeat()
    agent._heartbeat()
    row = _process(session, agent.info.id)
    first_steady = row.steady_since
    assert row.last_seen >= first_steady
    assert abs((row.last_seen - presence.database_now(session)).total_seconds()) < 2

    agent._last_seen -= timedelta(seconds=presence.STEADY_GAP + 1)  # a late heartbeat
    agent._heartbeat()
    row = _process(session, agent.info.id)
    assert row.steady_since > first_steady and row.steady_since == row.last_seen

    agent._heartbeat()
    assert _process(session, agent.info.id).steady_since == row.steady_since


def _process(session, process_id: str) -> Process:
    session.expire_all()
    return session.scalars(select(Process).where(Process.id == process_id)).one()


# --- with real processes ------------------------------------------------------------------

@pytest.fixture
def to_broker(app):
    """Wake-ups go to the real broker (instead of the ``wakeups`` list)."""
    wakeup_module.set_publisher(CeleryPublisher(app).publish)


def _process_id(pid: int) -> str:
    return rows(select(Process.id).where(Process.pid == pid))[0][0]


@pytest.mark.processes
def test_kill_9_of_a_worker_mid_attempt_recovers_within_30_s_not_the_lease(
        procs, hub, session, record_dir, to_broker):
    """The 300 s stall of issue reports: a target with Max Concurrent Deliveries 4 whose
    four in-progress deliveries belonged to a worker killed mid-attempt. The lease stays
    300 s; the dead worker's heartbeat is what puts them back."""
    n = 12
    setup_recorder(hub, record_dir, max_concurrent_deliveries=4,
                   config={"sleep": 1.0, "claim_batch": 4})
    procs.beat()
    first = procs.worker()
    dispatch_many(hub, session, n)  # one transaction
    wait_until(lambda: len(attempts(record_dir)) >= 2
               and state_counts("recorder").get("in_progress") == 4, 60,
               "the first worker two attempts in, with four claimed")
    time.sleep(0.4)  # inside an attempt
    dead = _process_id(first.pid)

    killed_at = utcnow()
    first.signal(signal.SIGKILL)
    assert first.wait_exit(10) == -signal.SIGKILL
    second = procs.worker()
    wait_until(all_delivered("recorder", n), 120, f"all {n} delivered")

    settled = sorted(r[0] for r in rows(select(Delivery.settled_at)))
    first_after = next(t for t in settled if t > killed_at)
    print(f"first delivery {(first_after - killed_at).total_seconds():.1f} s after the kill")
    assert (first_after - killed_at).total_seconds() <= 30, \
        f"first delivery {first_after - killed_at} after the kill"

    every = {d.id: history(d.id) for d in map(delivery_of, _message_ids())}
    gone = {i: [line for line in h if line.endswith(f"owner {dead} gone")]
            for i, h in every.items()}
    assert sum(map(len, gone.values())) >= 1
    assert not [line for h in every.values() for line in h if "lease expired" in line]
    assert all(sum(" delivered" in line for line in h) == 1 for h in every.values())
    # none doubled: a second attempt only where the killed one was cut short, and the
    # new worker attempted each delivery once
    records = attempts(record_dir)
    by_delivery = Counter(r["delivery"] for r in records)
    assert set(by_delivery) == set(every)
    assert Counter((r["delivery"], r["pid"]) for r in records
                   if r["pid"] == second.pid).most_common(1)[0][1] == 1
    for delivery_id, count in by_delivery.items():
        if count > 1:
            cut = [r["attempt"] for r in records
                   if r["delivery"] == delivery_id and r["pid"] == first.pid]
            assert gone[delivery_id] == [
                f"recorder: attempt {cut[0]} interrupted: owner {dead} gone"], \
                every[delivery_id]


@pytest.mark.processes
def test_a_live_worker_in_a_long_attempt_is_never_declared_dead(
        procs, hub, session, record_dir, to_broker):
    """An attempt longer than the time a silent process takes to be known dead: its
    heartbeat comes from the agent's thread, so the sweeps (run by another worker)
    leave it alone."""
    long = presence.DEAD_AFTER.total_seconds() + 3 * presence.HEARTBEAT_SECONDS
    setup_recorder(hub, record_dir, config={"sleep": long})
    procs.beat()
    busy = procs.worker(queues="deliveries")
    sweeper = procs.worker(queues="default")
    message_row = hub.message()
    wait_until(lambda: delivery_of(message_row.id).state == "in_progress", 30, "claimed")

    wait_until(lambda: delivery_of(message_row.id).state == "delivered", long + 60,
               "delivered")
    row = delivery_of(message_row.id)
    assert row.attempt == 1
    assert not [line for line in history(row.id) if "interrupted" in line]
    assert [(r["attempt"], r["pid"]) for r in attempts(record_dir)] == [(1, busy.pid)]
    assert sweeper.output().count("b2bhub.sweep") >= 3  # sweeps ran during the attempt


def _message_ids() -> list[int]:
    return [r[0] for r in rows(select(Delivery.message_id))]
