"""SPEC 8: a delivery awaiting its receipt is settled through the API by the system that
finished the job; a second report and one after the deadline are refused and recorded."""

from __future__ import annotations

from sqlalchemy import select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import settlement
from b2bhub.engine.sweep import run_sweep
from b2bhub.models import HistoryLine
from tests.enginekit import at, claim_one, delivery, message, standard_hub
from tests.test_api import token_client


def _awaiting(hub, session):
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    sent = hub.message(now=at(0))
    won = claim_one(session, "writer_a", "worker-a", at(0))
    settlement.settle(session, won, Outcome.awaiting_receipt("JOB-7"), RetryPolicy(), at(1))
    session.commit()
    return sent.id, won.delivery_id


def _client(app, session, role):
    return token_client(app, session, role, f"{role}-sys")


def _lines(session, message_id, type_):
    return session.scalars(select(HistoryLine).where(
        HistoryLine.message_id == message_id, HistoryLine.type == type_)).all()


def test_a_completed_receipt_delivers_and_a_second_one_is_refused_and_kept(hub, app,
                                                                           session):
    message_id, delivery_id = _awaiting(hub, session)
    erp = _client(app, session, "operator")

    response = erp.post(f"/api/v1/deliveries/{delivery_id}/receipt",
                        json={"result": "completed", "text": "posted as invoice 991"})
    assert response.status_code == 200, response.json
    session.expire_all()
    assert delivery(session, delivery_id).state == "delivered"
    assert message(session, message_id).status == "delivered"
    [line] = _lines(session, message_id, "receipt_received")
    assert line.actor == "operator-sys"
    assert line.text == ("writer_a: operator-sys reported the receipt: completed: posted "
                         "as invoice 991")

    again = erp.post(f"/api/v1/deliveries/{delivery_id}/receipt", json={"result": "failed"})
    assert again.status_code == 409
    assert "only a delivery awaiting its receipt takes one" in again.json["error"]["message"]
    session.expire_all()
    assert delivery(session, delivery_id).state == "delivered"
    [refused] = _lines(session, message_id, "receipt_refused")
    assert "unattributable" in refused.text


def test_a_failed_receipt_fails_the_delivery(hub, app, session):
    message_id, delivery_id = _awaiting(hub, session)
    response = _client(app, session, "operator").post(
        f"/api/v1/deliveries/{delivery_id}/receipt",
        json={"result": "failed", "text": "rejected: unknown article"})
    assert response.status_code == 200
    session.expire_all()
    row = delivery(session, delivery_id)
    assert (row.state, row.failure_kind) == ("failed", "technical")
    assert message(session, message_id).status == "error"


def test_a_receipt_after_the_deadline_is_refused_and_logged(hub, app, session):
    message_id, delivery_id = _awaiting(hub, session)
    run_sweep(session, at(2, hours=24), "sweeper")
    response = _client(app, session, "operator").post(
        f"/api/v1/deliveries/{delivery_id}/receipt", json={"result": "completed"})
    assert response.status_code == 409
    session.expire_all()
    assert delivery(session, delivery_id).last_result == "no receipt within 24h"
    assert len(_lines(session, message_id, "receipt_refused")) == 1


def test_receipt_input_and_role_are_checked(hub, app, session):
    _message_id, delivery_id = _awaiting(hub, session)
    url = f"/api/v1/deliveries/{delivery_id}/receipt"
    viewer = _client(app, session, "viewer")
    assert viewer.post(url, json={"result": "completed"}).status_code == 403
    operator = _client(app, session, "operator")
    bad = operator.post(url, json={"result": "done"})
    assert bad.status_code == 400 and "result" in bad.json["error"]["details"]
    assert operator.post("/api/v1/deliveries/999999/receipt",
                         json={"result": "completed"}).status_code == 404
    session.expire_all()
    assert delivery(session, delivery_id).state == "awaiting_receipt"
