"""Acknowledgments we receive for interchanges we send (docs/edi.md): a 997 / 999 /
CONTRL is read for what it acknowledges; an outbound interchange to a partner with
``ack_hours`` waits for one; the worker's tick matches them by control numbers and
raises ``ack_overdue`` when the partner's hours have passed."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from pydifact.segmentcollection import Interchange
from sqlalchemy import select

from b2bhub.engine import ack_waits
from b2bhub.engine.inspection import inspect_stream
from b2bhub.engine.intake import SourceIntake
from b2bhub.models import AckReceived, AckWait, Alert, HistoryLine, Message, utcnow
from b2bhub.services import config as svc
from tests.test_edi_inspect import EDIFACT, X12, x12
from tests.test_ui import login  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:segments.xml not found")


def x12_ack(group: str = "101", status: str = "A", set_status: str | None = None,
            codes: tuple[str, ...] = (), kind: str = "997", functional_id: str = "PO",
            sender: str = "ACME", receiver: str = "MYCOMPANY", control: str = "000000201"
            ) -> bytes:
    """A 997 (AK5) or 999 (IK5) from ``sender`` acknowledging group ``group``'s 850 0001;
    ``codes``: the set's error codes (with an AK3 / IK3 segment error when given)."""
    set_status = set_status or status
    five = "IK5" if kind == "999" else "AK5"
    three = "IK3" if kind == "999" else "AK3"
    body = [f"AK1*{functional_id}*{group}" + ("*005010X231A1" if kind == "999" else ""),
            "AK2*850*0001"]
    if codes:
        body.append(f"{three}*BEG*2**8")
    body += ["*".join([five, set_status, *codes]),
             f"AK9*{status}*1*1*{0 if status == 'R' else 1}"]
    segs = [f"ST*{kind}*0001", *body, f"SE*{len(body) + 2}*0001"]
    isa = (f"ISA*00*          *00*          *ZZ*{sender.ljust(15)}*ZZ*"
           f"{receiver.ljust(15)}*261130*0900*U*00401*{control}*0*P*>~\n")
    return (isa + f"GS*FA*{sender}*{receiver}*20261130*0900*201*X*004010~\n"
            + "".join(s + "~\n" for s in segs)
            + f"GE*1*201~\nIEA*1*{control}~\n").encode()


def contrl(interchange: str = "102", action: str = "7", message_action: str | None = None,
           code: str = "", sender: str = "ACME") -> bytes:
    """A CONTRL from ``sender`` for our interchange ``interchange`` (UCI 0083
    ``action``), with a UCM for its message 1 when ``message_action`` is given."""
    segs = ["UNH+1+CONTRL:D:3:UN",
            f"UCI+{interchange}+MYCOMPANY:ZZ+{sender}:ZZ+{action}" + (f"+{code}" if code
                                                                  and not message_action
                                                                  else "")]
    if message_action:
        segs.append(f"UCM+1+ORDERS:D:96A:UN+{message_action}" + (f"+{code}" if code else ""))
    segs.append(f"UNT+{len(segs) + 1}+1")
    return ("UNA:+.? '\n" + f"UNB+UNOC:3+{sender}:ZZ+MYCOMPANY:ZZ+261130:0900+301'\n"
            + "".join(s + "'\n" for s in segs) + "UNZ+1+301'\n").encode()


# --- reading -----------------------------------------------------------------------

def test_a_997_says_which_group_it_acknowledges_and_how():
    env = inspect_stream(io.BytesIO(x12_ack(status="R", codes=("5",))))
    assert env.errors == [] and env.types == ["997"]
    [entry] = env.acknowledges
    assert (entry["standard"], entry["functional_id"], entry["group_control"],
            entry["status"], entry["result"]) == ("X12", "PO", "101", "R", "rejected")
    assert entry["codes"] == ["AK3 0001: 8", "AK5 0001: 5"]
    assert entry["sets"] == [{"type": "850", "control": "0001", "status": "R",
                              "result": "rejected", "codes": ["AK5: 5"]}]
    assert inspect_stream(io.BytesIO(x12_ack(status="E")
                                     )).acknowledges[0]["result"] == "accepted with errors"
    assert inspect_stream(io.BytesIO(X12)).acknowledges == []  # an 850 acknowledges nothing


def test_a_999_is_read_like_a_997():
    [entry] = inspect_stream(io.BytesIO(x12_ack(kind="999", status="R", codes=("I5",))
                                        )).acknowledges
    assert (entry["group_control"], entry["result"]) == ("101", "rejected")
    assert entry["codes"] == ["IK3 0001: 8", "IK5 0001: I5"]


def test_a_contrl_says_which_interchange_it_acknowledges():
    data = contrl(action="4", message_action="4", code="13")
    # the sample acknowledgment is a CONTRL as pydifact reads it too
    assert [s.tag for s in Interchange.from_str(data.decode()).segments][:2] == ["UNH", "UCI"]
    env = inspect_stream(io.BytesIO(data))
    assert env.errors == []
    [entry] = env.acknowledges
    assert (entry["interchange_control"], entry["sender"], entry["receiver"],
            entry["status"], entry["result"]) == ("102", "ZZ:MYCOMPANY", "ZZ:ACME", "4",
                                                  "rejected")
    assert entry["codes"] == ["UCM 1: 13"]
    assert entry["sets"][0]["type"] == "ORDERS:D:96A"
    assert inspect_stream(io.BytesIO(contrl(action="7", message_action="4"))
                          ).acknowledges[0]["result"] == "partially accepted"
    assert inspect_stream(io.BytesIO(contrl(action="8"))).acknowledges[0]["result"] == \
        "received"


# --- waits, matching, overdue in one process ----------------------------------------

@pytest.fixture
def loop(hub, session):
    """mycompany (ZZ:MYCOMPANY) sends to acme (ZZ:ACME, acknowledges within 24 h) and to
    globex (ZZ:GLOBEX, expects nothing); acks come in on ``inbox`` without a route."""
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    svc.update_party(session, "organization", "mycompany", "", ["ZZ:MYCOMPANY"])
    svc.update_party(session, "partner", "acme", "", ["ZZ:ACME"], acks={"ack_hours": 24})
    svc.update_party(session, "partner", "globex", "", ["ZZ:GLOBEX"])
    hub.instance("writer", "noop")
    hub.instance("outbox", "manual_source")
    hub.instance("inbox", "manual_source")
    hub.route("outbox", "mycompany", "*", "writer")
    session.commit()
    return hub


def send(loop, session, body: bytes, to: str = "acme", name: str = "po.edi") -> int:
    return SourceIntake(session, loop.store, "outbox").store_and_dispatch(
        body, "mycompany", to, name)


def receive(loop, session, body: bytes, name: str = "ack.edi") -> int:
    return SourceIntake(session, loop.store, "inbox").store_and_dispatch(
        body, "acme", "mycompany", name)


def lines(session, message_id: int, kind: str | None = None) -> list[str]:
    query = select(HistoryLine.type, HistoryLine.text).where(
        HistoryLine.message_id == message_id).order_by(HistoryLine.id)
    return [text if kind else f"{t}: {text}" for t, text in session.execute(query)
            if kind is None or t == kind]


def state(session, message_id: int):
    session.expire_all()
    return ack_waits.acknowledgments(session, [message_id])[message_id]


def test_a_997_accepting_our_group_acknowledges_the_850(loop, session):
    po = send(loop, session, X12)
    assert state(session, po) == ("awaiting", False)
    [wait] = session.scalars(select(AckWait)).all()
    assert (wait.partner, wait.standard, wait.our_identity, wait.partner_identity,
            wait.control, wait.functional_id) == ("acme", "X12", "ZZ:MYCOMPANY", "ZZ:ACME",
                                                  "101", "PO")
    assert wait.due_at - wait.created_at == timedelta(hours=24)

    ack = receive(loop, session, x12_ack())
    ack_message = session.get(Message, ack)
    assert ack_message.status == "not_routed"
    # kept: no route asks for it, and that is no failure
    assert session.scalars(select(Alert.kind).where(
        Alert.message_id == ack)).all() == []
    assert ack_waits.run(session, utcnow()) == {"matched": 1, "overdue": 0}
    assert state(session, po) == ("acknowledged", False)
    assert lines(session, po, "ack_received") == [
        f"997 (message {ack}): group PO 101 accepted"]
    assert lines(session, ack, "ack_matched") == [
        f"acknowledges message {po}: group PO 101 accepted"]
    assert session.scalar(select(AckReceived.state)) == "matched"
    assert ack_waits.run(session, utcnow()) == {"matched": 0, "overdue": 0}  # once


def test_a_997_rejecting_makes_it_rejected_with_the_codes(loop, session):
    po = send(loop, session, X12)
    receive(loop, session, x12_ack(status="R", codes=("5",)))
    ack_waits.run(session, utcnow())
    assert state(session, po) == ("rejected", False)
    [text] = lines(session, po, "ack_received")
    assert text.endswith("group PO 101 rejected; codes AK3 0001: 8, AK5 0001: 5")
    wait = session.scalar(select(AckWait))
    assert (wait.state, wait.result, wait.codes) == ("rejected", "rejected",
                                                     ["AK3 0001: 8", "AK5 0001: 5"])


def test_a_contrl_settles_an_edifact_interchange(loop, session):
    orders = send(loop, session, EDIFACT, name="orders.edi")
    assert session.scalar(select(AckWait.control)) == "102"
    receive(loop, session, contrl(action="4", message_action="4", code="13"))
    ack_waits.run(session, utcnow())
    assert state(session, orders) == ("rejected", False)
    [text] = lines(session, orders, "ack_received")
    assert "CONTRL" in text and "interchange 102 rejected; codes UCM 1: 13" in text


def test_no_ack_within_the_hours_raises_ack_overdue_and_a_late_one_resolves_it(
        loop, session):
    po = send(loop, session, X12)
    assert ack_waits.run(session, utcnow() + timedelta(hours=23)) == {
        "matched": 0, "overdue": 0}
    later = utcnow() + timedelta(hours=25)
    assert ack_waits.run(session, later) == {"matched": 0, "overdue": 1}
    assert ack_waits.run(session, later) == {"matched": 0, "overdue": 0}  # once
    assert state(session, po) == ("awaiting", True)
    assert lines(session, po, "ack_overdue") == [
        "no acknowledgment from acme for group PO 101 within 24 h"]
    alert = session.scalar(select(Alert).where(Alert.kind == "ack_overdue"))
    assert (alert.subject, alert.message_id, alert.resolved_at) == (f"message:{po}", po,
                                                                    None)
    receive(loop, session, x12_ack())
    ack_waits.run(session, later)
    assert state(session, po) == ("acknowledged", False)
    session.expire_all()
    assert session.get(Alert, alert.id).resolved_at is not None


def test_an_ack_matching_nothing_says_so(loop, session):
    send(loop, session, X12)
    stray = receive(loop, session, x12_ack(group="999"))
    ack_waits.run(session, utcnow())
    assert lines(session, stray, "ack_unmatched") == [
        "acknowledges group PO 999 (accepted), which matches no interchange we sent to "
        "ZZ:ACME"]
    assert session.scalar(select(AckReceived.state)) == "unmatched"
    # from someone else: the identities are part of the key
    other = receive(loop, session, x12_ack(sender="GLOBEX"))
    ack_waits.run(session, utcnow())
    assert len(lines(session, other, "ack_unmatched")) == 1


def test_no_wait_without_ack_hours_nor_for_an_ack_or_an_inbound_message(loop, session):
    to_globex = send(loop, session, X12.replace(b"ZZ*ACME           ", b"ZZ*GLOBEX         "),
                     to="globex")
    ours = send(loop, session, x12_ack(sender="MYCOMPANY", receiver="ACME"), name="997.edi")
    inbound = receive(loop, session, X12, name="in.edi")
    note = send(loop, session, b"no envelope", name="note.txt")
    assert session.scalars(select(AckWait)).all() == []
    assert {m: state(session, m) for m in (to_globex, ours, inbound, note)} == {
        m: (None, False) for m in (to_globex, ours, inbound, note)}


def test_two_groups_wait_each_and_the_message_shows_the_worst(loop, session):
    two = x12(groups=[("PO", "7", [("850", "0001", "PO-1")]),
                      ("IN", "8", [("810", "0003", "INV-9")])])
    message = send(loop, session, two)
    assert sorted(session.scalars(select(AckWait.control))) == ["7", "8"]
    receive(loop, session, x12_ack(group="7"))
    ack_waits.run(session, utcnow())
    assert state(session, message) == ("awaiting", False)
    receive(loop, session, x12_ack(group="8", functional_id="IN", status="R"))
    ack_waits.run(session, utcnow())
    assert state(session, message) == ("rejected", False)


def test_the_api_shows_and_filters_the_acknowledgment(loop, session, api):
    po = send(loop, session, X12)
    other = send(loop, session, X12.replace(b"ZZ*ACME           ", b"ZZ*GLOBEX         "),
                 to="globex", name="g.edi")
    shown = api.get(f"/api/v1/messages/{po}").get_json()
    assert (shown["acknowledgment"], shown["acknowledgment_overdue"]) == ("awaiting", False)
    assert api.get(f"/api/v1/messages/{other}").get_json()["acknowledgment"] is None
    listed = {m["id"]: m["acknowledgment"]
              for m in api.get("/api/v1/messages").get_json()["items"]}
    assert (listed[po], listed[other]) == ("awaiting", None)

    def ids(query: str) -> list[int]:
        reply = api.get(f"/api/v1/messages?acknowledgment={query}")
        assert reply.status_code == 200, reply.get_json()
        return [m["id"] for m in reply.get_json()["items"]]

    assert ids("awaiting") == [po]
    assert ids("acknowledged") == []
    receive(loop, session, x12_ack())
    ack_waits.run(session, utcnow())
    assert ids("acknowledged") == [po] and ids("awaiting") == []
    assert api.get("/api/v1/messages?acknowledgment=maybe").status_code == 400


def test_the_message_page_says_acknowledged(loop, session, login):  # noqa: F811
    po = send(loop, session, X12)
    client = login("admin")
    cell = '<dd id="acknowledgment" data-acknowledgment="{}">{}</dd>'
    assert cell.format("awaiting", "Awaiting acknowledgment") in client.get(
        f"/ui/messages/{po}").get_data(True)
    receive(loop, session, x12_ack(status="R", codes=("5",)))
    ack_waits.run(session, utcnow())
    page = client.get(f"/ui/messages/{po}").get_data(True)
    assert cell.format("rejected", "Rejected") in page and "AK5 0001: 5" in page
