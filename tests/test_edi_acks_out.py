"""Functional acknowledgments of received interchanges (docs/edi.md): a partner set to
997 or 999 gets one per interchange it sends (a CONTRL for EDIFACT), with the codes its
envelope errors call for, our own control numbers, dispatched by the routes as a
message from us. Each acknowledgment is parsed back: X12 by pyx12 against its 997 /
999 maps, EDIFACT by pydifact, and both by our inspector."""

from __future__ import annotations

import io
import re
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from pydifact.segmentcollection import Interchange
from sqlalchemy import func, select

from b2bhub.engine.acks import run_due_acks
from b2bhub.engine.dispatch import NewMessage, store_refused
from b2bhub.engine.inspection import attribute_rows, inspect_stream
from b2bhub.engine.intake import SourceIntake
from b2bhub.models import AckJob, HistoryLine, Message, MessageAttribute, Route
from b2bhub.services import config as svc
from tests.enginekit import T0, deliveries
from tests.test_edi_inspect import EDIFACT, X12, edifact, x12

pytestmark = pytest.mark.filterwarnings("ignore:segments.xml not found")

#: the samples go from ZZ:MYCOMPANY to ZZ:ACME; what ACME sends us is the other way
def turned(data: bytes) -> bytes:
    """An X12 interchange of ours to ACME as ACME would send it to us."""
    return data.replace(b"*ZZ*MYCOMPANY      *ZZ*ACME           *",
                        b"*ZZ*ACME           *ZZ*MYCOMPANY      *").replace(
        b"*MYCOMPANY*ACME*", b"*ACME*MYCOMPANY*")


INBOUND = turned(X12)


def inbound_x12(**kw) -> bytes:
    return turned(x12(**kw))


def inbound_edifact(data: bytes = EDIFACT) -> bytes:
    return data.replace(b"MYCOMPANY:ZZ+ACME:ZZ", b"ACME:ZZ+MYCOMPANY:ZZ")


#: the EDIFACT sample with its UNT count right (the sample's says 12 of 13)
GOOD_EDIFACT = inbound_edifact(EDIFACT.replace(b"UNT+12+1", b"UNT+13+1"))


@pytest.fixture
def edi(hub, session):
    """mycompany (ZZ:MYCOMPANY) and acme (ZZ:ACME, wants 997s); a source ``inbox``;
    the 997s, 999s and CONTRLs to acme go to ``acks_out``, everything else to
    ``writer``."""
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    svc.update_party(session, "organization", "mycompany", "", ["ZZ:MYCOMPANY"])
    svc.update_party(session, "partner", "acme", "", ["ZZ:ACME"],
                     acks={"functional_acks": "997"})
    for name in ("writer", "acks_out"):
        hub.instance(name, "noop")
    hub.instance("inbox", "manual_source")
    session.commit()
    svc.create_route(session, hub.registry, "inbox", "acme", "mycompany", "writer")
    for kind in ("997", "999", "CONTRL"):
        svc.create_route(session, hub.registry, "inbox", "mycompany", "acme", "acks_out",
                         document_type=kind)
    session.commit()
    return hub


def receive(hub, session, body: bytes, from_party="acme", to_party="mycompany") -> int:
    intake = SourceIntake(session, hub.store, "inbox")
    return intake.store_and_dispatch(body, from_party, to_party, "in.edi")


def make_acks(hub, session, now=T0) -> None:
    run_due_acks(session, hub.store, now, "proc-a")
    session.expire_all()


def ack_of(hub, session, message_id: int) -> Message | None:
    """The acknowledgment made for message ``message_id`` (by its history line)."""
    line = session.scalar(select(HistoryLine).where(
        HistoryLine.message_id == message_id, HistoryLine.type == "ack_generated"))
    return session.get(Message, line.data["ack_message_id"]) if line else None


def body_of(hub, message: Message) -> bytes:
    return hub.store.open(message.sha256).read()


def lines(session, message_id: int) -> list[tuple[str, str]]:
    return [tuple(r) for r in session.execute(select(HistoryLine.type, HistoryLine.text)
                                              .where(HistoryLine.message_id == message_id)
                                              .order_by(HistoryLine.id))]


def segments_of(ack: bytes) -> list[list[str]]:
    """An X12 acknowledgment's segments, each its elements (the ISA says how)."""
    element, term = chr(ack[3]), chr(ack[105])
    return [s.split(element) for s in ack.decode().split(term) if s.strip()]


# --- pyx12: the X12 acknowledgments against its 997 and 999 maps ----------------------

@pytest.fixture(scope="session")
def pyx12_maps(tmp_path_factory) -> Path:
    """pyx12's maps with one change: its 997 and 999 maps are HIPAA's, which allow
    only health care functional groups (AK101) and transaction sets (AK201); a purchase
    order group is X12 all the same, so those two code lists are lifted."""
    import pyx12
    maps = tmp_path_factory.mktemp("pyx12") / "map"
    shutil.copytree(Path(pyx12.__file__).parent / "map", maps)
    for name in ("997.4010.xml", "999.5010X231.A1.xml"):
        path = maps / name
        path.write_text(re.sub(
            r'(<element xid="(?:AK101|AK201)">.*?)<valid_codes>.*?</valid_codes>', r"\1",
            path.read_text(), flags=re.S))
    return maps


def pyx12_valid(maps: Path, ack: bytes) -> bool:
    import pyx12.params
    import pyx12.x12n_document
    param = pyx12.params.params()
    param.set("map_path", str(maps))
    errors = io.StringIO()
    return pyx12.x12n_document.x12n_document(param, io.StringIO(ack.decode()), None, None,
                                             fd_json=errors, map_path=str(maps))


# --- X12 ----------------------------------------------------------------------------

def test_the_x12_sample_gets_a_997_accepted_routed_to_the_partner(edi, session,
                                                                  pyx12_maps):
    received = receive(edi, session, INBOUND)
    assert session.scalar(select(func.count()).select_from(AckJob)) == 1
    make_acks(edi, session)
    ack = ack_of(edi, session, received)
    assert (ack.from_party, ack.to_party, ack.direction, ack.source) == (
        "mycompany", "acme", "outbound", "inbox")
    assert [d.target for d in deliveries(session, ack.id)] == ["acks_out"]
    body = body_of(edi, ack)
    assert pyx12_valid(pyx12_maps, body)
    segs = segments_of(body)
    isa = segs[0]
    assert (isa[5], isa[6].strip(), isa[7], isa[8].strip()) == ("ZZ", "MYCOMPANY", "ZZ",
                                                                "ACME")
    assert (isa[12], isa[13], isa[15]) == ("00401", "000000001", "P")
    assert [s for s in segs if s[0] in ("GS", "ST", "AK1", "AK2", "AK5", "AK9")] == [
        ["GS", "FA", "MYCOMPANY", "ACME", T0.strftime("%Y%m%d"), T0.strftime("%H%M"), "1",
         "X", "004010"],
        ["ST", "997", "0001"], ["AK1", "PO", "101"], ["AK9", "A", "1", "1", "1"]]
    # its own envelope is read as any interchange's, so routes take it by type
    env = inspect_stream(io.BytesIO(body))
    assert (env.errors, env.types, env.sender, env.receiver) == (
        [], ["997"], "ZZ:MYCOMPANY", "ZZ:ACME")
    assert ("document_type", "997") in session.execute(
        select(MessageAttribute.name, MessageAttribute.value).where(
            MessageAttribute.message_id == ack.id)).all()
    assert ("ack_generated", f"997 sent as message {ack.id}: accepted") in lines(
        session, received)
    assert session.scalar(select(func.count()).select_from(AckJob)) == 0
    make_acks(edi, session)  # nothing twice
    assert session.scalar(select(func.count()).select_from(Message)) == 2


def test_a_partner_set_to_999_gets_a_999(edi, session, pyx12_maps):
    svc.update_party(session, "partner", "acme", "", None, acks={"functional_acks": "999"})
    session.commit()
    received = receive(edi, session, inbound_x12(
        groups=[("PO", "7", [("850", "0001", "PO-1"), ("850", "0002", "PO-2")]),
                ("IN", "8", [("810", "0003", "INV-9")])]))
    make_acks(edi, session)
    body = body_of(edi, ack_of(edi, session, received))
    assert pyx12_valid(pyx12_maps, body)
    segs = segments_of(body)
    assert segs[0][12] == "00501" and segs[0][11] == "^"
    assert [s for s in segs if s[0] in ("GS", "ST", "AK1", "AK9")][1:] == [
        ["ST", "999", "0001", "005010X231A1"], ["AK1", "PO", "7", "004010"],
        ["AK9", "A", "2", "2", "2"],
        ["ST", "999", "0002", "005010X231A1"], ["AK1", "IN", "8", "004010"],
        ["AK9", "A", "1", "1", "1"]]
    assert segs[1][-1] == "005010X231A1"


def two_sets() -> bytes:
    return inbound_x12(sets=(("850", "0001", "PO-1"), ("850", "0002", "PO-2")))


@pytest.mark.parametrize("change,ak,outcome", [
    # a set's control numbers differ: that set rejected (AK5 R 3), the group partly
    (lambda d: d.replace(b"SE*4*0002", b"SE*4*0009"),
     [["AK2", "850", "0002"], ["AK5", "R", "3"], ["AK9", "P", "2", "2", "1"]],
     "partially accepted"),
    # a wrong segment count (4)
    (lambda d: d.replace(b"SE*4*0001", b"SE*5*0001"),
     [["AK2", "850", "0001"], ["AK5", "R", "4"], ["AK9", "P", "2", "2", "1"]],
     "partially accepted"),
    # both sets in error: the group rejected
    (lambda d: d.replace(b"SE*4*0001", b"SE*5*0001").replace(b"SE*4*0002", b"SE*4*0003"),
     [["AK2", "850", "0001"], ["AK5", "R", "4"], ["AK2", "850", "0002"],
      ["AK5", "R", "3"], ["AK9", "R", "2", "2", "0"]], "rejected"),
    # a set without its SE (the next ST came): 2
    (lambda d: re.sub(rb"SE\*4\*0001~\n", b"", d),
     [["AK2", "850", "0001"], ["AK5", "R", "2"], ["AK9", "P", "2", "2", "1"]],
     "partially accepted"),
    # the group's trailer: GE02 (4) or GE01 (5) wrong, accepted with errors
    (lambda d: d.replace(b"GE*2*101", b"GE*2*102"), [["AK9", "E", "2", "2", "2", "4"]],
     "accepted with errors"),
    (lambda d: d.replace(b"GE*2*101", b"GE*3*101"), [["AK9", "E", "3", "2", "2", "5"]],
     "accepted with errors"),
    # no GE: the group rejected (3)
    (lambda d: d.replace(b"GE*2*101~\n", b""), [["AK9", "R", "2", "2", "0", "3"]],
     "rejected"),
])
def test_each_x12_envelope_error_gets_its_codes(edi, session, pyx12_maps, change, ak,
                                                outcome):
    received = receive(edi, session, change(two_sets()))
    make_acks(edi, session)
    body = body_of(edi, ack_of(edi, session, received))
    assert pyx12_valid(pyx12_maps, body)
    assert [s for s in segments_of(body) if s[0] in ("AK2", "AK5", "AK9")] == ak
    [text] = [t for k, t in lines(session, received) if k == "ack_generated"]
    assert text.startswith("997 sent as message ") and f": {outcome}: " in text


@pytest.mark.parametrize("change,ta1", [
    (lambda d: d.replace(b"IEA*1*000000101", b"IEA*1*000000999"), ["E", "001"]),
    (lambda d: d.replace(b"IEA*1*", b"IEA*2*"), ["E", "021"]),
    (lambda d: d[:d.index(b"IEA")], ["R", "023"]),
])
def test_an_interchange_envelope_error_is_a_ta1(edi, session, pyx12_maps, change, ta1):
    received = receive(edi, session, change(two_sets()))
    make_acks(edi, session)
    body = body_of(edi, ack_of(edi, session, received))
    assert pyx12_valid(pyx12_maps, body)
    segs = segments_of(body)
    assert segs[1] == ["TA1", "000000101", "261129", "1200", *ta1]
    assert segs[2][0] == "GS"  # the groups are acknowledged all the same


def test_control_numbers_count_up_per_partner_and_standard(edi, session):
    svc.update_party(session, "partner", "globex", "", ["ZZ:GLOBEX"],
                     acks={"functional_acks": "997"})
    session.commit()
    got = []
    for n in range(3):
        received = receive(edi, session, INBOUND)
        make_acks(edi, session, T0 + timedelta(seconds=n))
        got.append(segments_of(body_of(edi, ack_of(edi, session, received)))[0][13])
    edifact_ack = receive(edi, session, GOOD_EDIFACT)
    other = receive(edi, session, INBOUND.replace(b"ZZ*ACME           *",
                                                  b"ZZ*GLOBEX         *"), "globex")
    make_acks(edi, session)
    assert got == ["000000001", "000000002", "000000003"]
    unb = Interchange.from_str(body_of(edi, ack_of(edi, session, edifact_ack)).decode())
    assert unb.control_reference == "1"  # EDIFACT counts on its own
    assert segments_of(body_of(edi, ack_of(edi, session, other)))[0][13] == "000000001"


def test_no_ack_for_a_partner_set_to_none_an_ack_or_a_relay(edi, session):
    svc.update_party(session, "partner", "globex", "", ["ZZ:GLOBEX"])
    session.commit()
    from_globex = receive(edi, session, INBOUND, "globex")
    an_ack = receive(edi, session, inbound_x12(
        groups=[("FA", "5", [("997", "0001", "")])]))
    relayed = receive(edi, session, INBOUND, "acme", "globex")  # not to us
    outbound = receive(edi, session, X12, "mycompany", "acme")
    # the intake read each message's parties: no job is written for an acknowledgment
    # nobody is due (the worker would drop it; it asks again for the jobs it gets)
    assert session.scalar(select(func.count()).select_from(AckJob)) == 0
    make_acks(edi, session)
    for message_id in (from_globex, an_ack, relayed, outbound):
        assert ack_of(edi, session, message_id) is None
    assert session.scalar(select(func.count()).select_from(AckJob)) == 0
    assert session.scalar(select(func.count()).select_from(Message)) == 4


def test_a_refused_interchange_gets_its_negative_ack(edi, session):
    body = INBOUND.replace(b"SE*10*0001", b"SE*10*0002")
    stored = edi.store.put(body)
    received = store_refused(session, NewMessage(
        source="inbox", from_party="acme", to_party="mycompany",
        stages={"unpacked": (stored.digest, stored.size)},
        rows=attribute_rows(edi.store, stored.digest)), "envelope errors", T0)
    session.commit()
    make_acks(edi, session)
    assert session.get(Message, received).status == "refused"
    segs = segments_of(body_of(edi, ack_of(edi, session, received)))
    assert [s for s in segs if s[0] in ("AK5", "AK9")] == [
        ["AK5", "R", "3"], ["AK9", "R", "1", "1", "0"]]


def test_an_ack_without_a_route_is_not_routed(edi, session):
    for route in session.scalars(select(Route).where(Route.target == "acks_out")):
        svc.delete_route(session, route.id)
    session.commit()
    received = receive(edi, session, INBOUND)
    make_acks(edi, session)
    assert ack_of(edi, session, received).status == "not_routed"


# --- EDIFACT ------------------------------------------------------------------------

def contrl_of(edi, session, received: int):
    body = body_of(edi, ack_of(edi, session, received)).decode()
    parsed = Interchange.from_str(body)
    return {s.tag: s.elements for s in parsed.segments if s.tag != "UCM"}, [
        s.elements for s in parsed.segments if s.tag == "UCM"], parsed


def test_an_edifact_interchange_gets_a_contrl(edi, session):
    received = receive(edi, session, GOOD_EDIFACT)
    make_acks(edi, session)
    segs, ucms, parsed = contrl_of(edi, session, received)
    assert parsed.sender[:2] == ["MYCOMPANY", "ZZ"] and parsed.recipient[:2] == [
        "ACME", "ZZ"]
    assert tuple(map(str, parsed.syntax_identifier)) == ("UNOC", "3")
    assert segs["UNH"] == ["1", ["CONTRL", "D", "3", "UN"]]
    assert segs["UCI"] == ["102", ["ACME", "ZZ"], ["MYCOMPANY", "ZZ"], "7"]
    assert ucms == []
    assert ("ack_generated", f"CONTRL sent as message {ack_of(edi, session, received).id}"
            ": accepted") in lines(session, received)


def test_the_edifact_sample_s_count_error_rejects_its_message(edi, session):
    received = receive(edi, session, inbound_edifact())
    make_acks(edi, session)
    segs, ucms, _ = contrl_of(edi, session, received)
    assert segs["UCI"][3] == "4"  # its only message rejected: the interchange is
    assert ucms == [["1", ["ORDERS", "D", "96A", "UN"], "4", "29", "UNT"]]


@pytest.mark.parametrize("change,uci,ucms", [
    (lambda d: d.replace(b"UNT+3+1", b"UNT+3+7"), "7",
     [["1", ["ORDERS", "D", "96A", "UN"], "4", "28", "UNT"]]),
    (lambda d: d.replace(b"UNT+4+2", b"UNT+9+2"), "7",
     [["2", ["INVOIC", "D", "96A", "UN"], "4", "29", "UNT"]]),
    (lambda d: d.replace(b"UNZ+2+55", b"UNZ+2+56"), ["4", "28", "UNZ"], []),
    (lambda d: d.replace(b"UNZ+2+55", b"UNZ+5+55"), ["4", "29", "UNZ"], []),
    (lambda d: d[:d.index(b"UNZ")], ["4", "13", "UNZ"], []),
])
def test_each_edifact_envelope_error_gets_its_codes(edi, session, change, uci, ucms):
    received = receive(edi, session, inbound_edifact(change(edifact())))
    make_acks(edi, session)
    segs, got, _ = contrl_of(edi, session, received)
    assert segs["UCI"][3:] == ([uci] if isinstance(uci, str) else uci)
    assert got == ucms


def test_an_edifact_group_error_rejects_the_group(edi, session):
    data = inbound_edifact(edifact(ung=True)).replace(b"UNE+2+9", b"UNE+2+8")
    received = receive(edi, session, data)
    make_acks(edi, session)
    segs, _, _ = contrl_of(edi, session, received)
    assert segs["UCF"] == ["9", "", "", "4", "28", "UNE"]
    assert segs["UCI"][3] == "4"


def test_a_job_claimed_by_a_worker_that_died_is_made_once_after_its_lease(edi, session):
    from b2bhub.engine.acks import LEASE, claim, make_ack
    received = receive(edi, session, INBOUND)
    token, ids = claim(session, T0, "dead-worker")  # claimed, then killed: nothing made
    assert ids == [received]
    make_acks(edi, session, T0 + timedelta(seconds=5))  # still leased: left alone
    assert ack_of(edi, session, received) is None
    make_acks(edi, session, T0 + LEASE + timedelta(seconds=1))  # taken again, made
    ack = ack_of(edi, session, received)
    assert ack is not None
    # the first worker, were it only slow, finds its claim gone and makes nothing
    assert make_ack(session, edi.store, received, token, T0 + LEASE) == 0
    session.expire_all()
    assert session.scalar(select(func.count()).select_from(Message)) == 2
    assert [t for t, _ in lines(session, received)].count("ack_generated") == 1
