"""Seed 003's status contract (docs/status-codes.md): every status of ours is exactly one
of the seed's identifiers, the API carries it as ``status_code`` wherever a message's
status is, takes it in every status filter (standing for the statuses mapped to it), and
answers the seed's ``/mensagens`` paths as ``/messages``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import select, update

from b2bhub.domain.states import DeliveryState, FailureKind, MessageStatus
from b2bhub.domain.status_codes import CODES, STATUS_CODES, statuses_of
from b2bhub.models import Alert, Delivery, HistoryLine, Message
from tests.test_ui import login  # noqa: F401

DOCS = Path(__file__).resolve().parent.parent / "docs" / "status-codes.md"


def test_every_status_is_exactly_one_seed_identifier_and_every_identifier_is_used():
    assert set(STATUS_CODES) == set(MessageStatus)
    assert set(STATUS_CODES.values()) == set(CODES)
    assert len(CODES) == 9


def test_the_docs_table_is_the_codes_table():
    rows = re.findall(r"^\| `([a-z_]+)` \| `([A-Z_]+)` \|", DOCS.read_text(), re.M)
    assert dict(rows) == {str(s): code for s, code in STATUS_CODES.items()}


def test_a_filter_value_stands_for_the_statuses_mapped_to_it():
    assert statuses_of(["ERRO_ENTREGA"]) == ["error"]
    assert statuses_of(["NAO_PROCESSADA"]) == ["not_routed", "refused"]
    assert set(statuses_of(["ENFILEIRADA"])) == {"received", "deferred", "stalled"}
    assert statuses_of(["error", "ERRO_ENTREGA", "delivered"]) == ["error", "delivered"]
    with pytest.raises(ValueError):
        statuses_of(["ERRO_QUALQUER"])


@pytest.fixture
def every_status(hub, session):
    """A message in each of our statuses (set on the row: the derivation of statuses is
    tested in tests/test_status.py; here what matters is what the API makes of them)."""
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("out", "noop")
    hub.route("inbox", "*", "*", "out")
    ids = {}
    for status in MessageStatus:
        message = hub.message(filename=f"{status}.edi")
        session.execute(update(Message).where(Message.id == message.id)
                        .values(status=status))
        ids[str(status)] = message.id
    # the failed message's delivery, for the delivery filters and bulk redeliver
    session.execute(update(Delivery).where(Delivery.message_id == ids["error"]).values(
        state=DeliveryState.FAILED, failure_kind=FailureKind.TECHNICAL))
    session.execute(update(Delivery).where(Delivery.message_id == ids["business_error"])
                    .values(state=DeliveryState.FAILED, failure_kind=FailureKind.BUSINESS))
    session.commit()
    return ids


def listed(api, path: str) -> list[dict]:
    response = api.get(path)
    assert response.status_code == 200, response.text
    return response.json["items"]


@pytest.mark.parametrize("code", CODES)
def test_messages_filtered_by_a_seed_identifier_are_those_of_its_statuses(
        api, every_status, code):
    mapped = ",".join(str(s) for s, c in STATUS_CODES.items() if c == code)
    by_code = listed(api, f"/api/v1/messages?status={code}")
    assert by_code == listed(api, f"/api/v1/messages?status={mapped}")
    assert {m["status_code"] for m in by_code} == {code}
    assert {m["id"] for m in by_code} == {every_status[s] for s in mapped.split(",")}
    assert listed(api, f"/api/v1/mensagens?status={code}") == by_code


def test_every_message_carries_its_status_code_in_lists_and_pages(api, every_status):
    for message in listed(api, "/api/v1/messages?limit=100"):
        assert message["status_code"] == STATUS_CODES[MessageStatus(message["status"])]
    for status, message_id in every_status.items():
        one = api.get(f"/api/v1/messages/{message_id}").json
        assert (one["status"], one["status_code"]) == (status, STATUS_CODES[status])


def test_mensagens_answers_as_messages(api, every_status):
    assert api.get("/api/v1/mensagens?limit=5").json == api.get("/api/v1/messages?limit=5").json
    some = every_status["delivered"]
    seed = api.get(f"/api/v1/mensagens/{some}")
    assert seed.status_code == 200 and seed.json == api.get(f"/api/v1/messages/{some}").json
    assert api.get("/api/v1/mensagens/999999999").status_code == 404
    assert api.get("/api/v1/mensagens?status=ERRO_QUALQUER").status_code == 400
    doc = api.get("/api/v1/openapi.json").json
    assert {"/api/v1/mensagens", "/api/v1/mensagens/{message_id}"} <= set(doc["paths"])


def test_an_unknown_identifier_is_refused_naming_the_known_ones(api, every_status):
    response = api.get("/api/v1/messages?status=ERRO_QUALQUER")
    assert response.status_code == 400
    assert "ERRO_ENTREGA" in response.text and "ERRO_QUALQUER" in response.text


def test_deliveries_and_bulk_redeliver_take_the_identifiers(api, every_status, session):
    failed = [d["id"] for d in listed(api, "/api/v1/deliveries?status=error")]
    assert failed and listed(api, "/api/v1/deliveries?status=ERRO_ENTREGA") == \
        listed(api, "/api/v1/deliveries?status=error")
    response = api.post("/api/v1/deliveries/redeliver", json={"status": ["ERRO_ENTREGA"]})
    assert response.status_code == 200, response.text
    assert response.json["redelivered"] == failed
    [line] = session.scalars(select(HistoryLine).where(
        HistoryLine.delivery_id == failed[0], HistoryLine.type == "redeliver_requested")).all()
    assert line.actor == "tests"


def test_alerts_carry_their_message_s_status_code(api, every_status, session):
    session.add_all([Alert(kind="message_failed", subject=f"message:{every_status['error']}",
                           text="disk full", message_id=every_status["error"]),
                     Alert(kind="instance_offline", subject="instance:out", text="down")])
    session.commit()
    alerts = {a["kind"]: a for a in listed(api, "/api/v1/alerts")}
    assert (alerts["message_failed"]["message_status"],
            alerts["message_failed"]["status_code"]) == ("error", "ERRO_ENTREGA")
    assert (alerts["instance_offline"]["message_status"],
            alerts["instance_offline"]["status_code"]) == (None, None)


def test_stats_count_by_status_code(api, every_status):
    figures = api.get("/api/v1/stats").json["messages"]
    assert figures["by_status_code"] == {"NAO_PROCESSADA": 2, "ENFILEIRADA": 3,
                                         "PROCESSANDO": 2, "PROCESSADA": 1,
                                         "AGUARDANDO_REENVIO": 1, "ERRO_ENTREGA": 1,
                                         "ERRO_NEGOCIO": 1, "ERRO_COLETA": 1,
                                         "CANCELADA": 1}


def test_the_delivery_errors_page_takes_the_identifiers(login, every_status):  # noqa: F811
    client = login("admin")
    technical = client.get("/ui/delivery-errors?kind=technical").text
    seed = client.get("/ui/delivery-errors?kind=ERRO_ENTREGA").text
    assert f"/ui/messages/{every_status['error']}" in seed
    assert f"/ui/messages/{every_status['business_error']}" not in seed
    assert f"/ui/messages/{every_status['error']}" in technical
    business = client.get("/ui/delivery-errors?kind=ERRO_NEGOCIO").text
    assert f"/ui/messages/{every_status['business_error']}" in business
    assert f"/ui/messages/{every_status['error']}" not in business
