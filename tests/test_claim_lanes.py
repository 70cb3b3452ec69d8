"""Lanes of a target's Max Concurrent Deliveries (PostgreSQL, ``lanes.lock_target``):
claimers of one target claim side by side in different lanes instead of taking turns on
its row, and together they never pass the maximum, also when it is lowered under live
leases. SQLite has one writer at a time, and so one lane (``tests/test_claims.py``
races claimants on both backends)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, lanes, settlement
from b2bhub.models import Delivery, PluginInstance
from tests.conftest import IS_POSTGRES
from tests.enginekit import at, standard_hub

pytestmark = pytest.mark.skipif(not IS_POSTGRES, reason=(
    "lanes are PostgreSQL's: on SQLite claimers take turns on the one writer"))


def _lanes(session) -> dict[int, int]:
    """Live leases of writer_a by lane."""
    session.expire_all()
    rows = session.execute(select(Delivery.lane, func.count()).where(
        Delivery.target == "writer_a", Delivery.state == "in_progress")
        .group_by(Delivery.lane)).all()
    session.rollback()
    return dict(rows)


def _queue(hub, session, n: int, maximum: int) -> None:
    standard_hub(hub, max_concurrent_deliveries=maximum)
    hub.route("inbox", "*", "*", "writer_a")
    for _ in range(n):
        hub.message(now=at())
    session.commit()


def _set_maximum(session, maximum: int) -> None:
    session.execute(update(PluginInstance).where(PluginInstance.name == "writer_a")
                    .values(max_concurrent_deliveries=maximum))
    session.commit()


def test_claimers_of_one_target_claim_side_by_side_in_different_lanes(hub, session, db):
    _queue(hub, session, 40, maximum=32)  # two lanes of 16
    first, second = Session(db.engine), Session(db.engine)
    turn = lanes.lock_target(first, "writer_a", "w1")
    assert len(claiming.claim(first, "writer_a", "w1", at(1), 16, 300, turn)) == 16
    # the first claimer's transaction is open, its lane held: the second claims at once
    # in the other lane (taking turns on the row, it waited for the first's commit)
    result = {}

    def claim_second():
        other = lanes.lock_target(second, "writer_a", "w2")
        result["lane"] = other.lane
        result["claims"] = claiming.claim(second, "writer_a", "w2", at(1), 16, 300, other)
        second.commit()

    thread = threading.Thread(target=claim_second)
    thread.start()
    thread.join(10)
    waited = thread.is_alive()
    first.commit()
    thread.join(10)
    assert not waited, "the second claimer waited for the first one's commit"
    assert (turn.lanes, {turn.lane, result["lane"]}) == (2, {0, 1})
    assert len(result["claims"]) == 16
    assert {c.lane for c in result["claims"]} == {result["lane"]}
    assert _lanes(session) == {0: 16, 1: 16}
    # the maximum is reached: a third claimer gets nothing, in either lane
    assert claiming.claim(session, "writer_a", "w3", at(2), 16, 300) == []
    session.commit()
    assert _lanes(session) == {0: 16, 1: 16}
    first.close()
    second.close()


def test_a_writer_of_the_instance_row_waits_for_the_claims_under_way(hub, session, db):
    """A change of the maximum cannot land between a claimer's lane and its claim: the
    lanes it was split by stay until every claim made by them is committed."""
    _queue(hub, session, 40, maximum=32)
    claimer, writer = Session(db.engine), Session(db.engine)
    turn = lanes.lock_target(claimer, "writer_a", "w1")
    done = threading.Event()

    def lower():
        _set_maximum(writer, 8)
        done.set()

    thread = threading.Thread(target=lower)
    thread.start()
    assert not done.wait(0.5), "the row was written while a claimer held its turn"
    assert len(claiming.claim(claimer, "writer_a", "w1", at(1), 16, 300, turn)) == 16
    claimer.commit()
    assert done.wait(10)
    thread.join(10)
    # now 16 live leases against a maximum of 8: nothing more until they end
    assert claiming.claim(session, "writer_a", "w2", at(2), 16, 300) == []
    session.commit()
    claimer.close()
    writer.close()


def test_a_maximum_lowered_under_live_leases_is_never_passed_by_a_claim(hub, session):
    """Four lanes of 16 full, then the maximum lowered to 32 (two lanes of 16): the
    old lanes 0 and 2 count in lane 0 now, 1 and 3 in lane 1. When lane 0 is empty and
    lane 1 still 16 over its share, lane 0 may claim only what keeps the whole within 32."""
    _queue(hub, session, 120, maximum=64)
    claims = []
    for owner in ("w0", "w1", "w2", "w3"):  # each takes the least busy lane
        claims += claiming.claim(session, "writer_a", owner, at(1), 16, 300)
        session.commit()
    assert _lanes(session) == {0: 16, 1: 16, 2: 16, 3: 16}

    _set_maximum(session, 32)
    assert claiming.claim(session, "writer_a", "w4", at(2), 16, 300) == []
    session.commit()

    def settle(lanes: set[int], count: int | None = None) -> None:
        chosen = [c for c in claims if c.lane in lanes][:count]
        settlement.settle_many(session, [(c, Outcome.delivered("ok")) for c in chosen],
                               RetryPolicy(), at(3))
        session.commit()
        claims[:] = [c for c in claims if c not in chosen]

    settle({0, 2})  # lane 0 (of two) empty, lane 1 at 32: 16 over its share
    assert claiming.claim(session, "writer_a", "w5", at(4), 16, 300) == []
    session.commit()
    settle({1}, 8)  # 24 left, 8 over
    more = claiming.claim(session, "writer_a", "w6", at(5), 16, 300)
    session.commit()
    assert len(more) == 8 and {c.lane for c in more} == {0}
    assert sum(_lanes(session).values()) == 32
    settle({1, 3})  # lane 1 empty: the two lanes have their shares again
    claims += more
    again = claiming.claim(session, "writer_a", "w7", at(6), 16, 300)
    session.commit()
    assert len(again) == 16 and {c.lane for c in again} == {1}
    assert _lanes(session) == {0: 8, 1: 16}
