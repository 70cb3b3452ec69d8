"""The drain's hot statements run as the driver's own SQL (b2bhub.engine.driver): the
times they write must be the ones the ORM writes, so that time comparisons stay right
(on SQLite a time is text, and a whole second written without its ``.000000`` compares
as earlier than the same time written by the ORM)."""

from __future__ import annotations

import dataclasses

from sqlalchemy import DateTime, bindparam, func, select, text

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine import machine
from b2bhub.models import Delivery
from tests.enginekit import at, standard_hub


def _count_at(session, column: str, when) -> int:
    return session.execute(text(f"SELECT count(*) FROM deliveries WHERE {column} = :t")
                           .bindparams(bindparam("t", type_=DateTime())), {"t": when}).scalar()


def test_claim_and_delivered_update_write_whole_seconds_as_the_orm_does(hub, session):
    standard_hub(hub, max_concurrent_deliveries=16)
    hub.route("inbox", "*", "*", "writer_a")
    for _ in range(3):
        hub.message()
    session.commit()
    claimed_at, settled_at = at(60).replace(microsecond=0), at(120).replace(microsecond=0)
    claims = machine.claim(session, "writer_a", "w", claimed_at, 16, 300)
    session.commit()
    assert len(claims) == 3
    # the lease and update times the claim wrote equal the ORM's form of the same times
    assert _count_at(session, "lease_until", at(360).replace(microsecond=0)) == 3
    assert _count_at(session, "updated_at", claimed_at) == 3
    written = machine.settle_many(session, [(c, Outcome.delivered("ok")) for c in claims],
                                  RetryPolicy(), settled_at)
    session.commit()
    assert written == [True, True, True]
    assert _count_at(session, "settled_at", settled_at) == 3
    # and an ORM comparison sees them at exactly that time, not a moment before
    assert session.scalar(select(func.count()).select_from(Delivery).where(
        Delivery.settled_at >= settled_at)) == 3
    assert sorted(session.scalars(select(Delivery.state))) == ["delivered"] * 3


def test_a_stale_claim_is_still_fenced_on_the_driver_path(hub, session):
    """The delivered UPDATE holds each row to its own attempt: an outcome of an older
    attempt of the same delivery writes nothing."""
    standard_hub(hub, max_concurrent_deliveries=16)
    hub.route("inbox", "*", "*", "writer_a")
    for _ in range(2):
        hub.message()
    session.commit()
    claims = machine.claim(session, "writer_a", "w", at(60), 16, 300)
    session.commit()
    old = dataclasses.replace(claims[0], attempt=claims[0].attempt - 1)
    written = machine.settle_many(session, [(old, Outcome.delivered("late")),
                                            (claims[1], Outcome.delivered("ok"))],
                                  RetryPolicy(), at(61))
    session.commit()
    assert written == [False, True]
    states = dict(session.execute(select(Delivery.id, Delivery.state)).all())
    assert states[claims[0].delivery_id] == "in_progress"
    assert states[claims[1].delivery_id] == "delivered"
