"""The acknowledgment loop with real processes (docs/edi.md): a poller in a worker takes
what we send to acme (whose ``ack_hours`` is 24) and what acme sends back; beat's
``edi-acks`` tick has a worker match each 997 / 999 / CONTRL to the interchange it
acknowledges, and raise ``ack_overdue`` once the worker's clock is past the 24 hours."""

from __future__ import annotations

import json

from sqlalchemy import select

from b2bhub.models import AckReceived, Alert, Delivery, Message
from tests.procs import wait_until
from tests.test_e2e_files import drop, history, inbox, procs, rows  # noqa: F401
from tests.test_edi_acks import contrl, x12_ack
from tests.test_edi_inspect import EDIFACT, x12

pytestmark = __import__("pytest").mark.processes


def load(procs, inbox, out) -> None:  # noqa: F811
    """mycompany ZZ:MYCOMPANY; acme ZZ:ACME expects to acknowledge within 24 h, globex
    ZZ:GLOBEX expects nothing; the poller takes parties from the envelopes; only what
    mycompany sends is routed to the writer (the acks have no route)."""
    data = {
        "organizations": [{"name": "mycompany", "edi_identities": ["ZZ:MYCOMPANY"]}],
        "partners": [{"name": "acme", "edi_identities": ["ZZ:ACME"], "ack_hours": 24},
                     {"name": "globex", "edi_identities": ["ZZ:GLOBEX"]}],
        "plugins": [
            {"name": "poller", "type": "file_poller", "parties_from": "envelope",
             "config": {"base_directory": str(inbox), "path_pattern": "{to}/{filename}",
                        "polling_interval": 1}},
            {"name": "writer", "type": "file_writer", "config": {
                "base_directory": str(out), "filename_pattern": "{to}/{original_filename}"}}],
        "routes": [{"source": "poller", "from": "mycompany", "target": "writer"}]}
    path = procs.tmp / "fixtures.json"
    path.write_text(json.dumps(data))
    done = procs.cli("fixtures", "load", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def by_name() -> dict[str, int]:
    return {name: mid for mid, name in rows(select(Message.id, Message.original_filename))}


def test_acks_received_settle_what_we_sent_and_none_raises_ack_overdue(
        procs, inbox, tmp_path, api):  # noqa: F811
    load(procs, inbox, tmp_path / "out")
    clock = tmp_path / "clock"
    clock.write_text("0")
    worker = procs.worker(extra_env={"B2BHUB_FAKE_CLOCK_FILE": str(clock)}, wait=False)
    procs.beat()
    worker.wait_in_log(" ready.", timeout=60)

    def po(group: str, control: str) -> bytes:
        return x12(groups=[("PO", group, [("850", "0001", f"PO-{group}")])],
                   control=control)

    sent = {"po-ok.edi": po("101", "000000101"), "po-bad.edi": po("102", "000000102"),
            "po-999.edi": po("103", "000000103"), "po-late.edi": po("104", "000000104"),
            "orders.edi": EDIFACT,
            "po-globex.edi": po("105", "000000105").replace(b"ZZ*ACME           ",
                                                          b"ZZ*GLOBEX         ")}
    drop(inbox, sent)
    wait_until(lambda: len(rows(select(Delivery.id).where(Delivery.state == "delivered")))
               == len(sent), 60, "what we send written")

    def shown(name: str) -> tuple:
        message = api.get(f"/api/v1/messages/{by_name()[name]}").get_json()
        return message["acknowledgment"], message["acknowledgment_overdue"]

    assert {name: shown(name) for name in sent} == {
        **{name: ("awaiting", False) for name in sent}, "po-globex.edi": (None, False)}
    awaiting = api.get("/api/v1/messages?acknowledgment=awaiting").get_json()["items"]
    assert len(awaiting) == 5

    acks = {"997-ok.edi": x12_ack(group="101", control="000000201"),
            "997-bad.edi": x12_ack(group="102", status="R", codes=("5",),
                                   control="000000202"),
            "999.edi": x12_ack(kind="999", group="103", status="E", codes=("I6",),
                               control="000000203"),
            "contrl.edi": contrl(interchange="102"),
            "997-stray.edi": x12_ack(group="555", control="000000204")}
    drop(inbox, acks)  # the path names acme; the envelopes say acme → mycompany
    wait_until(lambda: len(rows(select(AckReceived.id).where(
        AckReceived.state != "pending"))) == len(acks), 60, "every ack matched")

    assert {name: shown(name)[0] for name in sent} == {
        "po-ok.edi": "acknowledged", "po-bad.edi": "rejected", "po-999.edi": "acknowledged",
        "orders.edi": "acknowledged", "po-late.edi": "awaiting", "po-globex.edi": None}
    ids = by_name()

    def ack_lines(name: str, kind: str = "ack_received") -> list[str]:
        return [text for type_, _actor, text in history(ids[name]) if type_ == kind]

    assert ack_lines("po-ok.edi") == [
        f"997 (message {ids['997-ok.edi']}): group PO 101 accepted"]
    assert ack_lines("po-bad.edi") == [
        f"997 (message {ids['997-bad.edi']}): group PO 102 rejected; codes "
        "AK3 0001: 8, AK5 0001: 5"]
    assert ack_lines("po-999.edi") == [
        f"999 (message {ids['999.edi']}): group PO 103 accepted with errors; codes "
        "IK3 0001: 8, IK5 0001: I6"]
    assert ack_lines("orders.edi") == [
        f"CONTRL (message {ids['contrl.edi']}): interchange 102 accepted"]
    assert ack_lines("997-stray.edi", "ack_unmatched") == [
        "acknowledges group PO 555 (accepted), which matches no interchange we sent to "
        "ZZ:ACME"]
    # the acks are kept as messages, not routed on, and no alert says they were lost
    assert {rows(select(Message.status).where(Message.id == ids[name]))[0][0]
            for name in acks} == {"not_routed"}
    assert rows(select(Alert.kind, Alert.subject)) == []

    clock.write_text(str(25 * 3600))  # the worker's clock: a day and an hour later
    late = ids["po-late.edi"]
    wait_until(lambda: rows(select(Alert.kind, Alert.subject)) == [
        ("ack_overdue", f"message:{late}")], 60, "ack_overdue raised")
    assert ack_lines("po-late.edi", "ack_overdue") == [
        "no acknowledgment from acme for group PO 104 within 24 h"]
    assert shown("po-late.edi") == ("awaiting", True)
    assert [m["id"] for m in api.get("/api/v1/messages?acknowledgment=overdue"
                                     ).get_json()["items"]] == [late]
