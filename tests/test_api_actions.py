"""Operator actions, Send Message by hand and payload download through the API."""

from __future__ import annotations

import io

import pytest
from sqlalchemy import select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import Delivery, HistoryLine, Message, utcnow
from tests.factories import digests_in
from tests.test_api import token_client


@pytest.fixture
def setup(hub, record_dir):
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    hub.instance("inbox", "manual_source")
    for name in ("writer_a", "writer_b"):
        hub.instance(name, "recorder", config={"record_dir": str(record_dir)})
    return hub


def _client_with_role(app, session, role):
    return token_client(app, session, role, f"{role}-user")


def _upload(client, body=b"UNB+UNOA:2+ACME'", **form):
    data = {"file": (io.BytesIO(body), "orders.edi"), **form}
    return client.post("/api/v1/messages", data=data, content_type="multipart/form-data")


def test_send_by_hand_to_the_one_routed_target(setup, api, session, wakeups):
    setup.route("inbox", "mycompany", "acme", "writer_a")
    response = _upload(api, **{"from": "mycompany", "to": "acme"})
    assert response.status_code == 201, response.json
    body = response.json
    assert (body["source"], body["direction"], body["original_filename"]) == (
        "@operator", "outbound", "orders.edi")
    message = session.get(Message, body["id"])
    assert [d.target for d in message.deliveries] == ["writer_a"]
    assert wakeups == [(message.deliveries[0].id, "writer_a")]
    [received] = session.scalars(select(HistoryLine).where(
        HistoryLine.message_id == message.id, HistoryLine.type == "received")).all()
    assert received.actor == "tests"

    download = api.get(f"/api/v1/messages/{message.id}/payload?stage=unpacked")
    assert download.status_code == 200
    assert download.data == b"UNB+UNOA:2+ACME'"
    assert "orders.edi" in download.headers["Content-Disposition"]


def test_send_by_hand_inbound_with_a_chosen_target(setup, api):
    response = _upload(api, **{"from": "acme", "to": "mycompany", "target": "writer_b"})
    assert response.status_code == 201
    assert response.json["direction"] == "inbound"


def test_send_by_hand_refusals_are_clear_and_store_no_message(setup, api, session):
    setup.route("inbox", "*", "acme", "writer_a")
    setup.route("inbox", "mycompany", "*", "writer_b")
    cases = [
        # valid in shape, refused for what the hub holds (422)
        ({"from": "mycompany", "to": "acme"}, 422, "choose a target"),
        ({"from": "acme", "to": "globex", "target": "writer_a"}, 422, "organization"),
        ({"from": "nobody", "to": "acme", "target": "writer_a"}, 422, "no party"),
        ({"from": "mycompany", "to": "acme", "target": "inbox"}, 422, "not an enabled target"),
        # the wrong shape (400)
        ({"to": "acme"}, 400, "missing field: from"),
    ]
    for form, status, text in cases:
        response = _upload(api, **form)
        assert response.status_code == status, form
        assert text in response.json["error"]["message"], (form, response.json)
    assert session.scalar(select(Message.id)) is None


def test_send_by_hand_over_64_mib_is_refused(setup, app, api, session):
    big = b"x" * (64 * 1024 * 1024 + 1)
    response = _upload(api, body=big, **{"from": "mycompany", "to": "acme",
                                         "target": "writer_a"})
    assert response.status_code == 400
    assert response.json["error"]["code"] == "too_large"
    assert "at most 67108864 (64 MiB)" in response.json["error"]["message"]
    assert session.scalar(select(Message.id)) is None
    assert list(digests_in(app.extensions["b2bhub.store"])) == []

    huge = _upload(api, body=big + b"x" * (2 * 1024 * 1024), **{"from": "mycompany"})
    assert huge.status_code == 413
    assert huge.json["error"]["code"] == "request_entity_too_large"


def test_a_missing_payload_stage_is_a_clear_404(setup, api):
    setup.route("inbox", "*", "*", "writer_a")
    message = setup.message()
    response = api.get(f"/api/v1/messages/{message.id}/payload?stage=raw")
    assert response.status_code == 404
    assert response.json["error"]["message"] == (
        f"message {message.id} has no 'raw' payload stage (recorded: unpacked)")
    assert api.get("/api/v1/messages/999999/payload").status_code == 404


def test_redeliver_through_the_api_names_the_operator(setup, app, session):
    setup.route("inbox", "*", "*", "writer_a")
    setup.message()
    now = utcnow()
    [claim] = claiming.claim(session, "writer_a", "w1", now, 1, 300)
    settlement.settle(session, claim, Outcome.failed("boom"), RetryPolicy(), now)
    session.commit()
    operator_client = _client_with_role(app, session, "operator")

    response = operator_client.post(f"/api/v1/deliveries/{claim.delivery_id}/redeliver")
    assert response.status_code == 200, response.json
    assert response.json["changed"] is True
    session.expire_all()
    assert session.get(Delivery, claim.delivery_id).state == "queued"
    line = session.scalar(select(HistoryLine).where(
        HistoryLine.type == "redeliver_requested"))
    assert line.actor == "operator-user"

    again = operator_client.post(f"/api/v1/deliveries/{claim.delivery_id}/send-again")
    assert again.status_code == 409
    assert again.json["error"]["code"] == "action_refused"
    assert operator_client.post("/api/v1/deliveries/424242/cancel").status_code == 404


def test_a_viewer_cannot_act_and_nothing_changes(setup, app, session):
    setup.route("inbox", "*", "*", "writer_a")
    message = setup.message()
    viewer = _client_with_role(app, session, "viewer")
    assert viewer.post(f"/api/v1/messages/{message.id}/cancel").status_code == 403
    assert _upload(viewer, **{"from": "mycompany", "to": "acme"}).status_code == 403
    session.expire_all()
    assert session.get(Message, message.id).status == "received"


def test_redispatch_and_cancel_message_through_the_api(setup, api, session):
    message = setup.message()
    setup.route("inbox", "*", "*", "writer_a")
    first = api.post(f"/api/v1/messages/{message.id}/redispatch")
    assert first.json["changed"] is True
    second = api.post(f"/api/v1/messages/{message.id}/redispatch")
    assert (second.json["changed"], second.json["message"]) == (
        False, "redispatch: nothing is new")
    cancel = api.post(f"/api/v1/messages/{message.id}/cancel")
    assert cancel.status_code == 200
    assert api.get(f"/api/v1/messages/{message.id}").json["status"] == "cancelled"
