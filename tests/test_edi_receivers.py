"""The receivers that store their messages themselves inspect them too (docs/edi.md): the
HTTP receiver (``POST /in/<instance>``, served on loopback, and in gunicorn with a
worker delivering to a loopback destination) and the AS2 receiver (a pyas2lib partner in
a process of its own, in memory and streamed). Their messages carry their envelopes'
attributes, are found by them, routed by document type, and an ``envelope`` receiver
takes from and to from the envelope."""

from __future__ import annotations

import hashlib

import pytest
import requests
from sqlalchemy import select, update

from b2bhub.models import HistoryLine, Message, MessageAttribute, PluginInstance
from b2bhub.plugin import PREREAD
from b2bhub.services import config as svc
from b2bhub.services.tokens import create_token as api_token
from plugins.as2.plugin import As2Receiver  # noqa: F401 (registered by the as2 fixture)
from plugins.http_poster import HttpPoster
from plugins.http_receiver import HttpReceiver, create_token
from tests.enginekit import counted_statements, deliveries
from tests.http_peer import Peer
from tests.procs import wait_until
from tests.test_as2 import PATHS, as2, certs, partner  # noqa: F401 (fixtures)
from tests.test_edi_inspect import EDIFACT, X12, x12

#: the samples go from ZZ:MYCOMPANY to ZZ:ACME; these come the other way, as a partner
#: sends them
INBOUND_X12 = X12.replace(b"*ZZ*MYCOMPANY      *ZZ*ACME           *",
                          b"*ZZ*ACME           *ZZ*MYCOMPANY      *")
INBOUND_EDIFACT = EDIFACT.replace(b"+MYCOMPANY:ZZ+ACME:ZZ+", b"+ACME:ZZ+MYCOMPANY:ZZ+")
#: from globex, which has an identity, and from a sender nobody has
FROM_GLOBEX = INBOUND_X12.replace(b"*ZZ*ACME           *", b"*ZZ*GLOBEX         *")
STRANGER = INBOUND_X12.replace(b"*ZZ*ACME           *", b"*ZZ*NOBODY         *")
#: over the preread size: streamed into the store, inspected on the way
LARGE = x12(sets=[("850", f"{i:04d}", f"PO-L{i}") for i in range(1, 4001)])


def identities(session) -> None:
    """mycompany is ZZ:MYCOMPANY, acme ZZ:ACME, globex ZZ:GLOBEX."""
    svc.update_party(session, "organization", "mycompany", "", ["ZZ:MYCOMPANY"])
    svc.update_party(session, "partner", "acme", "", ["ZZ:ACME"])
    svc.update_party(session, "partner", "globex", "", ["ZZ:GLOBEX"])
    session.commit()


def typed_route(hub, source: str, target: str, document_type: str) -> None:
    svc.create_route(hub.session, hub.registry, source, "*", "*", target, "tests",
                     document_type)
    hub.session.commit()


def attributes(session, message_id: int) -> set[tuple[str, str]]:
    session.expire_all()
    return {tuple(r) for r in session.execute(
        select(MessageAttribute.name, MessageAttribute.value).where(
            MessageAttribute.message_id == message_id))}


def history(session, message_id: int) -> list[tuple[str, str]]:
    session.expire_all()
    return [tuple(r) for r in session.execute(
        select(HistoryLine.type, HistoryLine.text).where(
            HistoryLine.message_id == message_id).order_by(HistoryLine.id))]


def found(get, query: str) -> list[int]:
    """The ids of the messages ``GET /api/v1/messages?<query>`` finds."""
    reply = get(f"/api/v1/messages?{query}")
    assert reply.status_code == 200, reply.text
    return sorted(m["id"] for m in reply.json()["items"])


def targets(session, message_id: int) -> list[str]:
    session.expire_all()
    return sorted(d.target for d in deliveries(session, message_id))


# --- the HTTP receiver, served on loopback ------------------------------------------------

@pytest.fixture
def receivers(hub, session, registry):
    """``inbox`` (mycompany → acme by its configuration) routes 850s and ORDERS to
    ``erp``, 810s to ``billing``; ``edi_in`` takes its parties from the envelope and
    routes acme's and globex's 850s to ``erp``; ``direct`` is edi_in's sync twin. Returns
    the tokens by instance."""
    registry.register(HttpReceiver)
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    identities(session)
    for name in ("erp", "billing"):
        hub.instance(name, "noop")
    hub.instance("inbox", "http_receiver", config={"from_party": "mycompany",
                                                    "to_party": "acme"})
    hub.instance("edi_in", "http_receiver", parties_from="envelope")
    hub.instance("direct", "http_receiver", parties_from="envelope",
                 config={"mode": "sync", "target": "erp"})
    typed_route(hub, "inbox", "erp", "850")
    typed_route(hub, "inbox", "erp", "ORDERS")
    typed_route(hub, "inbox", "billing", "810")
    typed_route(hub, "edi_in", "erp", "850")
    tokens = {name: create_token(session, name, "client", "tests")
              for name in ("inbox", "edi_in", "direct")}
    session.commit()
    return tokens


def post(served: str, instance: str, token: str, body: bytes, **headers) -> dict:
    answer = requests.post(f"{served}/in/{instance}", data=body, timeout=30, headers={
        "Authorization": f"Bearer {token}", **headers})
    assert answer.status_code in (200, 202, 422), answer.text
    return answer.json()


@pytest.fixture
def api_get(served, session):
    token = api_token(session, "tests", "admin")
    session.commit()
    return lambda path: requests.get(served + path, timeout=30,
                                     headers={"Authorization": f"Bearer {token}"})


def test_http_receiver_messages_are_inspected_found_and_routed_by_type(
        served, receivers, session, api_get, hub):
    po = post(served, "inbox", receivers["inbox"], X12)["message_id"]
    orders = post(served, "inbox", receivers["inbox"], EDIFACT)["message_id"]
    large = post(served, "inbox", receivers["inbox"], LARGE)["message_id"]
    note = post(served, "inbox", receivers["inbox"], b"no envelope here")["message_id"]
    assert len(LARGE) > PREREAD

    assert {("standard", "X12"), ("sender", "ZZ:MYCOMPANY"), ("receiver", "ZZ:ACME"),
            ("interchange_control", "000000101"), ("document_type", "850"),
            ("reference", "PO-4711")} <= attributes(session, po)
    assert {("standard", "EDIFACT"), ("document_type", "ORDERS:D:96A"),
            ("reference", "PO-4712")} <= attributes(session, orders)
    assert ("sets", "4000") in attributes(session, large)
    assert attributes(session, note) == set()

    assert found(api_get, "document_type=850&reference=PO-4711") == [po]
    assert found(api_get, "document_type=ORDERS:D:96A&reference=PO-4712") == [orders]
    assert found(api_get, "document_type=850&reference=PO-L4000") == [large]
    assert found(api_get, "document_type=810") == []

    # the 850 route takes the X12 order, the ORDERS one the EDIFACT order; the 810 one
    # neither; a message without an envelope matches no typed route
    assert targets(session, po) == targets(session, orders) == ["erp"]
    assert targets(session, large) == ["erp"]
    assert targets(session, note) == []
    assert ("not_routed", "no route from inbox matches mycompany → acme") in history(
        session, note)
    # stored byte for byte as they came
    session.expire_all()
    assert session.get(Message, large).sha256 == hashlib.sha256(LARGE).hexdigest()
    assert hub.store.open(session.get(Message, po).sha256).read() == X12


def test_an_envelope_receiver_takes_the_envelope_s_parties(served, receivers, session):
    """The envelope's parties win over X-B2BHub-From / -To; none need be given."""
    token = receivers["edi_in"]
    plain = post(served, "edi_in", token, INBOUND_X12)["message_id"]
    named = post(served, "edi_in", token, FROM_GLOBEX,
                 **{"X-B2BHub-From": "acme", "X-B2BHub-To": "acme"})["message_id"]
    streamed = post(served, "edi_in", token, LARGE.replace(
        b"*ZZ*MYCOMPANY      *ZZ*ACME           *",
        b"*ZZ*ACME           *ZZ*MYCOMPANY      *"))["message_id"]
    session.expire_all()
    for message_id, sender in ((plain, "acme"), (named, "globex"), (streamed, "acme")):
        message = session.get(Message, message_id)
        assert (message.from_party, message.to_party, message.direction) == (
            sender, "mycompany", "inbound"), message_id
        assert targets(session, message_id) == ["erp"]


def test_an_envelope_receiver_in_sync_mode_delivers_between_the_envelope_s_parties(
        served, receivers, session):
    answer = requests.post(f"{served}/in/direct", data=INBOUND_X12, timeout=30, headers={
        "Authorization": f"Bearer {receivers['direct']}"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "delivered"
    session.expire_all()
    message = session.get(Message, answer.json()["message_id"])
    assert (message.from_party, message.to_party) == ("acme", "mycompany")
    assert ("document_type", "850") in attributes(session, message.id)


class Broken:
    """An inspector that recognises everything and fails reading it."""

    name = "broken"

    @staticmethod
    def recognise(head: bytes) -> bool:
        return True

    @staticmethod
    def inspect(stream):
        stream.read(10)
        raise ValueError("this inspector cannot read envelopes")


def test_an_inspector_that_fails_never_fails_a_receive(served, receivers, session,
                                                       monkeypatch, hub):
    """Preread or streamed, the message is stored as it came, with no attributes."""
    from b2bhub.engine import inspection
    monkeypatch.setattr(inspection, "get_inspectors", lambda: {"broken": Broken})
    small = post(served, "inbox", receivers["inbox"], X12)["message_id"]
    large = post(served, "inbox", receivers["inbox"], LARGE)["message_id"]
    session.expire_all()
    for message_id, body in ((small, X12), (large, LARGE)):
        assert attributes(session, message_id) == set()
        assert hub.store.open(session.get(Message, message_id).sha256).read() == body
        assert targets(session, message_id) == []  # no types: no typed route matches


def test_an_envelope_receiver_s_lookup_reads_the_envelope_s_parties(served, receivers,
                                                                     session, app):
    """A preread body's envelope parties are read in the request's one lookup."""
    # the duplicate check off: its lookup is the one SELECT more an interchange costs
    # with it on (test_the_duplicate_check_costs_one_select_per_interchange)
    session.execute(update(PluginInstance).where(PluginInstance.name == "edi_in")
                    .values(duplicate_days=0))
    session.commit()
    post(served, "edi_in", receivers["edi_in"], INBOUND_X12)  # warm: route cache, plans
    with counted_statements(app.extensions["sqlalchemy"].engines[None]) as seen:
        made = post(served, "edi_in", receivers["edi_in"], FROM_GLOBEX)["message_id"]
    # the lookups, then every row in one statement (PostgreSQL) or one per kind of row
    # (SQLite: message, payload, attributes, the job of the acknowledgment the partner
    # may be due, delivery, history)
    assert seen == ({"SELECT": 1, "WITH": 1} if app.extensions["sqlalchemy"].engines[
        None].dialect.name == "postgresql" else {"SELECT": 1, "INSERT": 6}), seen
    session.expire_all()
    assert session.get(Message, made).from_party == "globex"


def test_an_unknown_identity_is_not_routed_with_the_reason_and_nothing_lost(
        served, receivers, session, hub):
    token = receivers["edi_in"]
    lost = post(served, "edi_in", token, STRANGER)["message_id"]
    given = post(served, "edi_in", token, STRANGER,
                 **{"X-B2BHub-From": "globex", "X-B2BHub-To": "mycompany"})["message_id"]
    note = post(served, "edi_in", token, b"no envelope")["message_id"]
    reason = ("not_routed", "parties from the envelope: envelope sender ZZ:NOBODY is no "
              "party's EDI identity")
    session.expire_all()
    for message_id, parties in ((lost, ("ZZ:NOBODY", "mycompany")),
                                (given, ("globex", "mycompany"))):
        message = session.get(Message, message_id)
        assert message.status == "not_routed"
        assert reason in history(session, message_id)
        assert (message.from_party, message.to_party) == parties
        assert hub.store.open(message.sha256).read() == STRANGER
        assert ("sender", "ZZ:NOBODY") in attributes(session, message_id)
    assert ("not_routed", "parties from the envelope: no envelope: its parties cannot be "
            "taken from it") in history(session, note)
    assert (session.get(Message, note).from_party, session.get(Message, note).to_party) \
        == ("?", "?")

    # sync: not delivered, and said so; the message is kept
    answer = requests.post(f"{served}/in/direct", data=STRANGER, timeout=30, headers={
        "Authorization": f"Bearer {receivers['direct']}"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["outcome"] == "not_routed"
    assert reason[1] in answer.json()["text"]
    assert session.get(Message, answer.json()["message_id"]).status == "not_routed"


def test_an_envelope_receiver_still_refuses_a_party_that_is_not_one(served, receivers,
                                                                    session):
    answer = requests.post(f"{served}/in/edi_in", data=INBOUND_X12, timeout=30, headers={
        "Authorization": f"Bearer {receivers['edi_in']}", "X-B2BHub-From": "nobody"})
    assert answer.status_code == 422
    assert answer.json() == {"error": "unknown party: nobody"}
    session.expire_all()
    assert session.scalars(select(Message.id)).all() == []


# --- the HTTP receiver in gunicorn, a worker delivering -----------------------------------

@pytest.mark.processes
def test_http_receiver_in_processes_routes_by_type_and_by_envelope(
        procs, hub, session, registry):
    """gunicorn takes the samples (preread and streamed); a worker delivers the 850s to
    the ERP's endpoint, and nothing reaches billing's (810)."""
    registry.register(HttpReceiver)
    registry.register(HttpPoster)
    destination = Peer()
    try:
        hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
        identities(session)
        hub.instance("erp", "http_poster", config={"url": destination.url("/erp")})
        hub.instance("billing", "http_poster", config={"url": destination.url("/billing")})
        hub.instance("inbox", "http_receiver", parties_from="envelope")
        typed_route(hub, "inbox", "erp", "850")
        typed_route(hub, "inbox", "erp", "ORDERS")
        typed_route(hub, "inbox", "billing", "810")
        token = create_token(session, "inbox", "client", "tests")
        admin = api_token(session, "tests", "admin")
        session.commit()
        web = procs.web()
        procs.worker()

        sent = [INBOUND_X12, INBOUND_EDIFACT, LARGE.replace(
            b"*ZZ*MYCOMPANY      *ZZ*ACME           *",
            b"*ZZ*ACME           *ZZ*MYCOMPANY      *"), STRANGER]
        ids = [post(web.url, "inbox", token, body)["message_id"] for body in sent]

        def states():
            session.expire_all()
            return {m.id: m.status for m in session.scalars(select(Message))}
        wait_until(lambda: [states().get(i) for i in ids[:3]] == ["delivered"] * 3, 60,
                   "the orders delivered")
        assert states()[ids[3]] == "not_routed"
        assert sorted(s.sha256 for s in destination.seen) == sorted(
            hashlib.sha256(body).hexdigest() for body in sent[:3])
        assert {s.path for s in destination.seen} == {"/erp"}
        for message_id in ids[:3]:
            message = session.get(Message, message_id)
            assert (message.from_party, message.to_party) == ("acme", "mycompany")

        def get(path):
            return requests.get(web.url + path, timeout=30,
                                headers={"Authorization": f"Bearer {admin}"})
        assert found(get, "document_type=850&reference=PO-4711") == sorted(
            [ids[0], ids[3]])
        assert found(get, "document_type=ORDERS:D:96A&reference=PO-4712") == [ids[1]]
        assert found(get, "document_type=850&reference=PO-L42") == [ids[2]]
    finally:
        destination.close()


# --- the AS2 receiver -------------------------------------------------------------------

@pytest.fixture
def as2_routes(as2):  # noqa: F811
    """as2in's messages go to ``sink`` (every one), 850s to ``erp``, 810s to ``billing``."""
    svc.create_party(as2.session, "partner", "globex")
    identities(as2.session)
    for name in ("erp", "billing"):
        as2.hub.instance(name, "noop")
    typed_route(as2.hub, "as2in", "erp", "850")
    typed_route(as2.hub, "as2in", "billing", "810")
    as2.choose(sign=True, encrypt=True)
    return as2


@PATHS
def test_as2_messages_are_inspected_found_and_routed_by_type(as2_routes, api_get):
    setup = as2_routes
    for body in (INBOUND_X12, INBOUND_EDIFACT):
        result = setup.partner.send(setup.url, data=body, sign=True, encrypt=True,
                                  mdn_mode="sync", mdn_signed=True)
        assert result["mdn_status"] == "processed", result
    po, orders = setup.messages()
    assert setup.streams.count("receive") == (2 if setup.streamed else 0)
    # (the partner sends it as text: its line ends come as CRLF, after the terminators)
    assert setup.stages(po.id)["unpacked"].replace(b"\r\n", b"\n") == INBOUND_X12
    assert {("sender", "ZZ:ACME"), ("receiver", "ZZ:MYCOMPANY"), ("document_type", "850"),
            ("reference", "PO-4711")} <= attributes(setup.session, po.id)
    assert ("document_type", "ORDERS:D:96A") in attributes(setup.session, orders.id)
    assert found(api_get, "document_type=850&reference=PO-4711") == [po.id]
    assert found(api_get, "document_type=ORDERS:D:96A&reference=PO-4712") == [orders.id]
    assert targets(setup.session, po.id) == ["erp", "sink"]  # not billing (810)
    assert targets(setup.session, orders.id) == ["sink"]
    assert (po.from_party, po.to_party) == ("acme", "mycompany")  # by AS2-From / -To


@PATHS
def test_an_envelope_as2_receiver_routes_by_the_envelope_s_parties(as2_routes):
    setup = as2_routes
    setup.session.execute(update(PluginInstance).where(PluginInstance.name == "as2in")
                        .values(parties_from="envelope"))
    setup.session.commit()
    for body in (FROM_GLOBEX, STRANGER):
        result = setup.partner.send(setup.url, data=body, sign=True, encrypt=True,
                                  mdn_mode="sync", mdn_signed=True)
        # received either way: the receipt says processed, the hub keeps the message
        assert result["mdn_status"] == "processed", result
    relayed, lost = setup.messages()
    # sent by AS2 partner acme, for globex by its envelope
    assert (relayed.from_party, relayed.to_party, relayed.direction) == (
        "globex", "mycompany", "inbound")
    assert targets(setup.session, relayed.id) == ["erp", "sink"]
    assert lost.status == "not_routed"
    assert (lost.from_party, lost.to_party) == ("acme", "mycompany")  # the AS2 partner's
    assert ("not_routed", "parties from the envelope: envelope sender ZZ:NOBODY is no "
            "party's EDI identity") in history(setup.session, lost.id)
    assert setup.stages(lost.id)["unpacked"].replace(b"\r\n", b"\n") == STRANGER
