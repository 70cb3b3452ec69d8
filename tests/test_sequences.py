"""Ordered sequences (SPEC 7): one at a time in dispatch order, a failure parks the rest,
Resubmit and Skip unblock, and waiting is not mistaken for being unclaimed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine import operator
from b2bhub.engine.machine import claiming, settlement
from b2bhub.engine.settings import DeliverySettings
from b2bhub.engine.sweep import run_sweep
from b2bhub.models import Alert, Delivery, HistoryLine, Message, utcnow

OWNER = "worker-a"


@pytest.fixture
def seq(hub, record_dir):
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    hub.instance("inbox", "manual_source")
    hub.instance("ordered_out", "recorder", ordered=True, max_concurrent_deliveries=4,
                 config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "ordered_out")
    return hub


def _states(session, ids):
    session.expire_all()
    return [session.get(Delivery, i).state for i in ids]


def _send(hub, n, from_party="acme"):
    return [hub.message(from_party=from_party, filename=f"m{i}.edi").deliveries[0].id
            for i in range(n)]


def _claim(session, limit=10):
    return claiming.claim(session, "ordered_out", OWNER, utcnow(), limit, 300)


def _settle(session, claim, outcome):
    settlement.settle(session, claim, outcome, RetryPolicy(max_attempts=1), utcnow())
    session.commit()


def test_one_at_a_time_per_sequence_in_dispatch_order(seq, session):
    acme = _send(seq, 3)
    globex = _send(seq, 2, from_party="globex")
    claims = _claim(session)
    session.commit()
    # one per sequence key (acme>mycompany, globex>mycompany), each the earliest
    assert sorted(c.delivery_id for c in claims) == [acme[0], globex[0]]
    for claim in claims:
        _settle(session, claim, Outcome.delivered("ok"))
    assert sorted(c.delivery_id for c in _claim(session)) == [acme[1], globex[1]]


def test_a_failure_parks_the_rest_and_skip_releases_them_in_order(seq, session):
    ids = _send(seq, 4)
    [first] = _claim(session)
    _settle(session, first, Outcome.failed("partner rejected"))

    assert _states(session, ids) == ["failed", "deferred", "deferred", "deferred"]
    assert session.get(Message, session.get(Delivery, ids[1]).message_id).status == "deferred"
    parked = session.scalars(select(HistoryLine.text).where(
        HistoryLine.delivery_id == ids[2], HistoryLine.type == "delivery_changed")
        .order_by(HistoryLine.id.desc())).first()
    assert parked == f"ordered_out: parked behind delivery {ids[0]}, which failed"
    assert _claim(session) == []
    session.rollback()

    # a message dispatched while the sequence is blocked is parked by the sweep
    late = _send(seq, 1)[0]
    run_sweep(session, utcnow(), "beat")
    assert _states(session, [late]) == ["deferred"]

    result = operator.skip(session, ids[0], "alice", utcnow())
    session.commit()
    assert result.changed
    assert _states(session, ids + [late]) == ["skipped", "queued", "queued", "queued", "queued"]
    assert session.get(Message, session.get(Delivery, ids[0]).message_id).status == "delivered"
    line = session.scalar(select(HistoryLine).where(HistoryLine.type == "skip_requested"))
    assert line.actor == "alice" and line.delivery_id == ids[0]

    delivered = []
    while claims := _claim(session):
        assert len(claims) == 1  # still one at a time
        delivered.append(claims[0].delivery_id)
        _settle(session, claims[0], Outcome.delivered("ok"))
    assert delivered == ids[1:] + [late]


def test_resubmit_retries_the_blocker_first_and_a_second_failure_parks_again(seq, session):
    ids = _send(seq, 3)
    [first] = _claim(session)
    _settle(session, first, Outcome.failed("down"))

    operator.resubmit(session, ids[0], "bob", utcnow())
    session.commit()
    assert _states(session, ids) == ["queued", "queued", "queued"]
    [again] = _claim(session)
    assert again.delivery_id == ids[0] and again.attempt == 2  # never behind itself
    _settle(session, again, Outcome.failed("still down"))
    assert _states(session, ids) == ["failed", "deferred", "deferred"]

    operator.redeliver(session, ids[0], "bob", utcnow())  # redeliver of a blocker = resubmit
    session.commit()
    [third] = _claim(session)
    assert third.delivery_id == ids[0]
    _settle(session, third, Outcome.delivered("ok"))
    [next_one] = _claim(session)
    assert next_one.delivery_id == ids[1]
    session.rollback()


def test_resubmit_and_skip_refuse_a_delivery_that_blocks_nothing(hub, session, record_dir):
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("plain", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "plain")
    delivery_id = hub.message().deliveries[0].id
    now = utcnow()
    [claim] = claiming.claim(session, "plain", OWNER, now, 1, 300)
    settlement.settle(session, claim, Outcome.failed("x"), RetryPolicy(), now)
    session.commit()
    for action in (operator.resubmit, operator.skip):
        with pytest.raises(operator.ActionRefused, match="blocks its sequence"):
            action(session, delivery_id, "alice", utcnow())
    session.rollback()
    assert _states(session, [delivery_id]) == ["failed"]


def test_a_business_rule_blocking_the_sequence_parks_it_on_an_unordered_target(
        hub, session, record_dir):
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("plain", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "plain")
    ids = [hub.message(filename=f"{i}.edi").deliveries[0].id for i in range(3)]
    now = utcnow()
    [claim] = claiming.claim(session, "plain", OWNER, now, 1, 300)
    settlement.settle(session, claim, Outcome.business_error("R1", "bad totals",
                                                             block="sequence"),
                      RetryPolicy(), now)
    session.commit()
    assert _states(session, ids) == ["failed", "deferred", "deferred"]
    operator.skip(session, ids[0], "carol", utcnow())
    session.commit()
    assert _states(session, ids) == ["skipped", "queued", "queued"]


def test_waiting_behind_an_open_delivery_is_neither_woken_nor_stalled(seq, session):
    ids = _send(seq, 2)
    [head] = claiming.claim(session, "ordered_out", OWNER, utcnow(), 1, 30 * 86400)
    session.commit()
    settings = DeliverySettings(stall_after=2)
    later = utcnow() + timedelta(hours=2)
    for _ in range(4):
        run_sweep(session, later, "beat", settings=settings)
        later += timedelta(hours=2)
    assert _states(session, ids) == ["in_progress", "queued"]
    assert session.scalar(select(Alert).where(Alert.kind == "delivery_stalled")) is None


def test_resubmit_and_skip_through_the_api_need_an_operator(seq, app, session):
    from b2bhub.services.tokens import create_token
    ids = _send(seq, 2)
    [first] = _claim(session)
    _settle(session, first, Outcome.failed("down"))
    clients = {}
    for role in ("viewer", "operator"):
        token = create_token(session, f"{role}-user", role)
        clients[role] = app.test_client()
        clients[role].environ_base["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    session.commit()

    assert clients["viewer"].post(f"/api/v1/deliveries/{ids[0]}/skip").status_code == 403
    assert _states(session, ids) == ["failed", "deferred"]
    response = clients["operator"].post(f"/api/v1/deliveries/{ids[0]}/resubmit")
    assert response.status_code == 200, response.json
    assert _states(session, ids) == ["queued", "queued"]
    refused = clients["operator"].post(f"/api/v1/deliveries/{ids[0]}/skip")
    assert refused.status_code == 409
    assert "blocks its sequence" in refused.json["error"]["message"]
