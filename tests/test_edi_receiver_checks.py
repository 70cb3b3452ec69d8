"""The receivers that store their messages themselves make the intake's checks too
(docs/edi.md "Checks at intake", "The receivers"): per instance, an interchange with
envelope errors is delivered with them in its history or stored Refused with them as
the reason; one received before within ``duplicate_days`` gets ``duplicate_received``
and its alert, or is Refused. The HTTP receiver answers a refusal 422 ``refused``; the
AS2 receiver returns a positive MDN (the transfer succeeded) and keeps the message
Refused. Nothing is lost either way."""

from __future__ import annotations

import requests
from sqlalchemy import select, update

from b2bhub.models import Alert, Message, MessageAttribute, PluginInstance
from b2bhub.plugin import PREREAD
from plugins.http_receiver import create_token
from tests.enginekit import counted_statements
from tests.test_as2 import PATHS, as2, certs, partner  # noqa: F401 (fixtures)
from tests.test_edi_inspect import X12, X12_ERRORS
from tests.test_edi_receivers import (  # noqa: F401 (fixtures)
    INBOUND_X12,
    LARGE,
    as2_routes,
    attributes,
    history,
    receivers,
    targets,
    typed_route,
)

BAD = X12.replace(b"SE*10*0001", b"SE*10*0009")  # SE02 does not match ST02
BAD_ERROR = "SE02 0009 does not match ST02 0001"
#: a streamed body (over the preread size) whose IEA does not match its ISA
LARGE_BAD, LARGE_ERROR = X12_ERRORS[1][0](LARGE), X12_ERRORS[1][1]


def receiver(hub, session, name: str, config: dict | None = None, **checks) -> str:
    """An HTTP receiver ``name`` (mycompany → acme) with these checks, its 850s routed
    to ``erp``; returns its token."""
    hub.instance(name, "http_receiver", config={"from_party": "mycompany",
                                                "to_party": "acme", **(config or {})},
                 **checks)
    typed_route(hub, name, "erp", "850")
    token = create_token(session, name, "client", "tests")
    session.commit()
    return token


def send(served: str, name: str, token: str, body: bytes) -> requests.Response:
    return requests.post(f"{served}/in/{name}", data=body, timeout=30,
                         headers={"Authorization": f"Bearer {token}"})


def message(session, message_id: int) -> Message:
    session.expire_all()
    return session.get(Message, message_id)


def open_alerts(session, kind: str) -> list[tuple[str, int]]:
    session.expire_all()
    return [tuple(r) for r in session.execute(select(Alert.subject, Alert.message_id).where(
        Alert.kind == kind, Alert.resolved_at.is_(None)).order_by(Alert.id))]


def edi_errors_of(session, message_id: int) -> list[str]:
    session.expire_all()
    return list(session.scalars(select(MessageAttribute.value).where(
        MessageAttribute.message_id == message_id, MessageAttribute.name == "edi_error")))


# --- the HTTP receiver ------------------------------------------------------------------

def test_http_receiver_refuses_envelope_errors_saying_so_and_keeping_the_message(
        served, receivers, session, hub):  # noqa: F811
    token = receiver(hub, session, "strict", edi_errors="refuse")
    sync = receiver(hub, session, "strict_sync", {"mode": "sync", "target": "erp"},
                    edi_errors="refuse")
    assert len(LARGE_BAD) > PREREAD
    for name, key, body, error in (("strict", token, BAD, BAD_ERROR),
                                   ("strict", token, LARGE_BAD, LARGE_ERROR),
                                   ("strict_sync", sync, BAD, BAD_ERROR)):
        answer = send(served, name, key, body)
        assert answer.status_code == 422, answer.text
        reply = answer.json()
        assert reply["outcome"] == "refused", reply
        assert reply["text"] == f"envelope errors: {error}", reply
        kept = message(session, reply["message_id"])
        assert (kept.status, kept.status_text) == ("refused", f"envelope errors: {error}")
        assert ("refused", f"envelope errors: {error}") in history(session, kept.id)
        assert targets(session, kept.id) == []
        # nothing lost: the payload as it came, and the envelope it was refused for
        assert hub.store.open(kept.sha256).read() == body
        assert error in edi_errors_of(session, kept.id)
        assert ("document_type", "850") in attributes(session, kept.id)
    # a clean interchange still goes through
    clean = send(served, "strict", token, X12.replace(b"000000101", b"000000102"))
    assert clean.status_code == 202, clean.text
    assert targets(session, clean.json()["message_id"]) == ["erp"]


def test_http_receiver_accepts_envelope_errors_with_a_line(
        served, receivers, session, hub):  # noqa: F811
    token = receiver(hub, session, "lenient")  # edi_errors: accept, the default
    answer = send(served, "lenient", token, BAD)
    assert answer.status_code == 202, answer.text
    assert answer.json()["outcome"] == "received"
    message_id = answer.json()["message_id"]
    assert message(session, message_id).status == "received"
    assert targets(session, message_id) == ["erp"]
    assert ("edi_errors", f"envelope errors: {BAD_ERROR} (accepted, as the source's "
            "edi_errors says)") in history(session, message_id)


def test_http_receiver_alerts_a_duplicate_interchange_or_refuses_it(
        served, receivers, session, hub):  # noqa: F811
    alerting = receiver(hub, session, "alerting")  # duplicates: alert, the default
    refusing = receiver(hub, session, "refusing", duplicates="refuse")
    first = send(served, "alerting", alerting, X12).json()["message_id"]
    again = send(served, "alerting", alerting, X12)
    assert again.status_code == 202, again.text
    second = again.json()["message_id"]
    text = f"interchange 000000101 from ZZ:MYCOMPANY was received before as message {first}"
    assert ("duplicate_received", text) in history(session, second)
    assert "duplicate_received" not in [t for t, _ in history(session, first)]
    assert targets(session, second) == ["erp"]  # let through, delivered
    assert open_alerts(session, "duplicate_received") == [(f"message:{second}", second)]

    # refused: any earlier message counts, whichever source took it; no alert
    answer = send(served, "refusing", refusing, X12)
    assert answer.status_code == 422, answer.text
    assert answer.json()["outcome"] == "refused"
    assert answer.json()["text"] == f"duplicate: {text}"
    refused = message(session, answer.json()["message_id"])
    assert (refused.status, refused.status_text) == ("refused", f"duplicate: {text}")
    assert targets(session, refused.id) == []
    assert hub.store.open(refused.sha256).read() == X12
    assert open_alerts(session, "duplicate_received") == [(f"message:{second}", second)]


def test_the_duplicate_check_costs_one_select_per_interchange(
        served, receivers, session, hub, app):  # noqa: F811
    """One indexed SELECT more for a message with an envelope, none for one without."""
    token = receiver(hub, session, "counted", duplicate_days=0)
    engine = app.extensions["sqlalchemy"].engines[None]

    def counted(body: bytes) -> dict:
        with counted_statements(engine) as seen:
            assert send(served, "counted", token, body).status_code == 202
        return dict(seen)

    counted(X12)  # warm: route cache, plans
    off = counted(X12.replace(b"000000101", b"000000102"))
    note_off = counted(b"no envelope here")
    session.execute(update(PluginInstance).where(PluginInstance.name == "counted")
                    .values(duplicate_days=30))
    session.commit()
    counted(X12.replace(b"000000101", b"000000103"))  # warm: the lookup's plan
    on = counted(X12.replace(b"000000101", b"000000104"))
    # one read more (a SELECT starting WITH its control numbers), every write the same
    reads = ("SELECT", "WITH")
    assert sum(on.get(k, 0) for k in reads) == sum(off.get(k, 0) for k in reads) + 1, (
        on, off)
    assert {k: v for k, v in on.items() if k not in reads} == {
        k: v for k, v in off.items() if k not in reads}, (on, off)
    assert counted(b"no envelope here either") == note_off


# --- the AS2 receiver -------------------------------------------------------------------

def as2_checks(setup, **checks) -> None:
    setup.session.execute(update(PluginInstance).where(PluginInstance.name == "as2in")
                          .values(**checks))
    setup.session.commit()


@PATHS
def test_as2_receiver_refuses_envelope_errors_with_a_positive_mdn(as2_routes):  # noqa: F811
    """The AS2 transfer succeeded: the receipt says processed; the refusal is the EDI
    level's, the message kept Refused with the reason."""
    setup = as2_routes
    as2_checks(setup, edi_errors="refuse")
    bad = INBOUND_X12.replace(b"SE*10*0001", b"SE*10*0009")
    result = setup.partner.send(setup.url, data=bad, sign=True, encrypt=True,
                                mdn_mode="sync", mdn_signed=True)
    assert result["mdn_status"] == "processed", result
    [refused] = setup.messages()
    assert (refused.status, refused.status_text) == ("refused",
                                                     f"envelope errors: {BAD_ERROR}")
    assert targets(setup.session, refused.id) == []
    lines = history(setup.session, refused.id)
    assert ("refused", f"envelope errors: {BAD_ERROR}") in lines
    assert ("mdn_sent", "signed MDN returned in the response") in lines
    assert setup.stages(refused.id)["unpacked"].replace(b"\r\n", b"\n") == bad
    assert BAD_ERROR in edi_errors_of(setup.session, refused.id)
    assert (refused.from_party, refused.to_party) == ("acme", "mycompany")


@PATHS
def test_as2_receiver_alerts_a_duplicate_interchange_or_refuses_it(as2_routes):  # noqa: F811
    setup = as2_routes
    for _ in range(2):
        result = setup.partner.send(setup.url, data=INBOUND_X12, sign=True, encrypt=True,
                                    mdn_mode="sync", mdn_signed=True)
        assert result["mdn_status"] == "processed", result
    first, second = setup.messages()
    text = f"interchange 000000101 from ZZ:ACME was received before as message {first.id}"
    assert ("duplicate_received", text) in history(setup.session, second.id)
    assert targets(setup.session, second.id) == ["erp", "sink"]
    assert open_alerts(setup.session, "duplicate_received") == [
        (f"message:{second.id}", second.id)]

    as2_checks(setup, duplicates="refuse")
    result = setup.partner.send(setup.url, data=INBOUND_X12, sign=True, encrypt=True,
                                mdn_mode="sync", mdn_signed=True)
    assert result["mdn_status"] == "processed", result
    third = setup.messages()[-1]
    assert (third.status, third.status_text) == ("refused", f"duplicate: {text}")
    assert targets(setup.session, third.id) == []
    assert setup.stages(third.id)["unpacked"].replace(b"\r\n", b"\n") == INBOUND_X12
    assert open_alerts(setup.session, "duplicate_received") == [
        (f"message:{second.id}", second.id)]
