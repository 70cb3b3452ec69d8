"""Inspection at intake with real processes: a poller in a worker stores dropped
interchanges, each read once on its stored ``unpacked`` stage, and what the inspector
found is kept as the message's indexed attributes (docs/edi.md)."""

from __future__ import annotations

from sqlalchemy import func, select

from b2bhub.models import Delivery, Message, MessageAttribute
from tests.procs import wait_until
from tests.test_e2e_files import drop, inbox, load_fixtures, procs, rows  # noqa: F401
from tests.test_edi_inspect import EDIFACT, X12, x12

pytestmark = __import__("pytest").mark.processes


def attributes_of(name: str) -> list[tuple[str, str]]:
    return [tuple(r) for r in rows(
        select(MessageAttribute.name, MessageAttribute.value)
        .join(Message, Message.id == MessageAttribute.message_id)
        .where(Message.original_filename == name).order_by(MessageAttribute.id))]


def test_dropped_interchanges_are_inspected_once_and_their_envelopes_kept(
        procs, inbox, tmp_path, api):  # noqa: F811
    load_fixtures(procs, inbox, writer={"config": {
        "base_directory": str(tmp_path / "out"),
        "filename_pattern": "{to}/{original_filename}"}})
    worker = procs.worker(wait=False)
    procs.beat()
    worker.wait_in_log(" ready.", timeout=60)
    two = x12(groups=[("PO", "7", [("850", "0001", "PO-1"), ("850", "0002", "PO-2")]),
                      ("IN", "8", [("810", "0003", "INV-9")])], newline="\r\n")
    files = {"po.edi": X12, "orders.edi": EDIFACT, "two.edi": two,
             "bad.edi": X12.replace(b"SE*10*0001", b"SE*10*0009").replace(
                 b"PO-4711", b"PO-9999"),
             "note.txt": b"not an interchange"}
    drop(inbox, files)
    wait_until(lambda: dict(rows(select(Delivery.state, func.count())
                                 .group_by(Delivery.state))) == {"delivered": len(files)},
               60, "all stored and delivered")

    assert attributes_of("po.edi") == [
        ("standard", "X12"), ("version", "00401"), ("sender", "ZZ:MYCOMPANY"),
        ("receiver", "ZZ:ACME"), ("interchange_control", "000000101"),
        ("interchange_date", "261129 1200"), ("groups", "1"), ("sets", "1"),
        ("group_type", "PO"), ("group_control", "101"), ("document_type", "850"),
        ("transaction_control", "0001"), ("reference", "PO-4711")]
    orders = dict(attributes_of("orders.edi"))
    assert (orders["standard"], orders["document_type"], orders["reference"],
            orders["interchange_control"]) == ("EDIFACT", "ORDERS:D:96A", "PO-4712", "102")
    found = attributes_of("two.edi")
    assert [v for n, v in found if n == "document_type"] == ["850", "810"]
    assert [v for n, v in found if n == "reference"] == ["PO-1", "PO-2", "INV-9"]
    assert [v for n, v in found if n == "group_control"] == ["7", "8"]
    assert ("edi_error", "SE02 0009 does not match ST02 0001") in attributes_of("bad.edi")
    assert attributes_of("note.txt") == []
    # found by what a user searches for: the PO number
    by_reference = rows(select(Message.original_filename).join(
        MessageAttribute, MessageAttribute.message_id == Message.id).where(
        MessageAttribute.name == "reference", MessageAttribute.value == "PO-4711"))
    assert [r[0] for r in by_reference] == ["po.edi"]

    def found(query: str) -> list[str]:
        reply = api.get(f"/api/v1/messages?{query}")
        assert reply.status_code == 200, reply.get_json()
        return sorted(m["original_filename"] for m in reply.get_json()["items"])

    assert found("document_type=850&reference=PO-4711") == ["po.edi"]
    assert found("document_type=850") == ["bad.edi", "po.edi", "two.edi"]
    assert found("document_type=810") == ["two.edi"]  # an interchange matches each type
    assert found("document_type=ORDERS:D:96A&sender=ZZ:MYCOMPANY") == ["orders.edi"]
    assert found("receiver=ZZ:ACME&interchange_control=102") == ["orders.edi"]
    assert found("group_control=8&transaction_control=0003") == ["two.edi"]
    assert found("document_type=850&reference=PO-1&transaction_control=0003") == [
        "two.edi"]  # each filter is met by one of the interchange's sets
    assert found("reference=PO-0000") == []
    assert found("document_type=850&from=nobody") == []

    [po] = api.get("/api/v1/messages?reference=PO-4711").get_json()["items"]
    envelope = api.get(f"/api/v1/messages/{po['id']}").get_json()["envelope"]
    assert [(e["name"], e["value"]) for e in envelope] == attributes_of("po.edi")
    [note] = api.get("/api/v1/messages?q=note.txt").get_json()["items"]
    assert api.get(f"/api/v1/messages/{note['id']}").get_json()["envelope"] == []
