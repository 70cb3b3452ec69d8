"""Routing by document type (docs/edi.md): a route may require a type the envelope holds;
messages go through the core's intake (inspected there, then dispatched), the services
refuse redundant routes with types, and the API, the UI and fixture files carry the type
and test routes with it.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import select

from b2bhub.engine.intake import SourceIntake
from b2bhub.models import Alert, HistoryLine, Message, Route
from b2bhub.services import config as svc
from b2bhub.services.errors import Conflict, ServiceError
from tests.enginekit import T0, deliveries, standard_hub
from tests.test_api import error_of
from tests.test_edi_inspect import EDIFACT, X12, x12
from tests.test_ui import login  # noqa: F401

# interchanges of their own (control numbers), so none is a duplicate of another
ACK = x12(groups=[("FA", "102", [("997", "0001", "")])], control="000000201")
TWO = x12(groups=[("PO", "7", [("850", "0001", "PO-1")]),
                  ("IN", "8", [("810", "0002", "INV-9")])], control="000000202")


@pytest.fixture
def erp(hub):
    """inbox fans 850s to the ERP, invoices to billing; nothing else is routed."""
    standard_hub(hub, targets=("erp", "billing", "archive"))
    hub.route_of_type = lambda kind, target: svc.create_route(
        hub.session, hub.registry, "inbox", "*", "*", target, "tests", kind)
    hub.route_of_type("850", "erp")
    hub.route_of_type("810", "billing")
    hub.session.commit()
    return hub


def take(hub, payload: bytes, name: str) -> Message:
    """One message through the core's intake, as a source plugin hands it over."""
    intake = SourceIntake(hub.session, hub.store, "inbox")
    message_id = intake.store_and_dispatch(payload, "acme", "mycompany", name)
    return hub.session.get(Message, message_id)


def targets(session, message: Message) -> list[str]:
    return [d.target for d in deliveries(session, message.id)]


def test_an_850_goes_to_the_erp_and_a_997_to_nowhere(erp, session):
    order, ack = take(erp, X12, "po.edi"), take(erp, ACK, "ack.edi")

    assert targets(session, order) == ["erp"]
    assert targets(session, ack) == []
    assert ack.status == "not_routed"
    [line] = session.scalars(select(HistoryLine.text).where(
        HistoryLine.message_id == ack.id, HistoryLine.type == "not_routed")).all()
    assert line == "no route from inbox matches acme → mycompany for 997"
    assert session.scalar(select(Alert.kind).where(Alert.subject.contains(str(ack.id)))) \
        == "message_not_routed"


def test_a_route_for_any_type_also_takes_messages_without_an_envelope(erp, session):
    svc.create_route(session, erp.registry, "inbox", "*", "*", "archive", "tests")
    session.commit()
    assert targets(session, take(erp, b"just text", "note.txt")) == ["archive"]
    assert targets(session, take(erp, ACK, "ack.edi")) == ["archive"]
    assert targets(session, take(erp, X12, "po.edi")) == ["archive", "erp"]


def test_a_type_route_never_takes_a_message_without_an_envelope(erp, session):
    note = take(erp, b"BEG*00*SA*850 in the text", "note.txt")
    assert targets(session, note) == []
    assert note.status == "not_routed"


def test_an_edifact_orders_matches_a_route_for_orders(erp, session):
    erp.route_of_type("ORDERS", "archive")
    session.commit()
    assert targets(session, take(erp, EDIFACT, "orders.edi")) == ["archive"]


def test_an_interchange_of_two_types_goes_where_each_type_is_routed(erp, session):
    assert targets(session, take(erp, TWO, "two.edi")) == ["billing", "erp"]


def test_a_file_poller_scan_routes_its_batch_by_each_file_s_types(hub, registry, session,
                                                                 tmp_path):
    """The poller's files are staged and committed as one batch: each is inspected, and
    routed by its own types."""
    from b2bhub.engine.scans import SourceRunner
    from b2bhub.runtime.hub import new_session
    from plugins.file_poller import FilePoller

    registry.register(FilePoller)
    hub.parties(organizations=("mycompany",), partners=("acme",))
    for name in ("erp", "billing"):
        hub.instance(name, "noop")
    hub.instance("poller", "file_poller", config={"base_directory": str(tmp_path),
                                                  "path_pattern": "{to}/{filename}"})
    svc.create_route(session, registry, "poller", "*", "*", "erp", "tests", "850")
    svc.create_route(session, registry, "poller", "*", "*", "billing", "tests", "810")
    session.commit()
    (tmp_path / "acme").mkdir()
    for name, body in {"po.edi": X12, "ack.edi": ACK, "two.edi": TWO}.items():
        (tmp_path / "acme" / name).write_bytes(body)

    now = [T0]
    runner = SourceRunner(new_session, registry, hub.store, "proc-a", clock=lambda: now[0])
    assert runner.scan("poller").messages == []  # a first sighting is not taken
    now[0] += timedelta(seconds=10)
    assert len(runner.scan("poller").messages) == 3

    session.expire_all()
    made = session.scalars(select(Message).order_by(Message.id)).all()
    assert {m.original_filename: targets(session, m) for m in made} == {
        "po.edi": ["erp"], "ack.edi": [], "two.edi": ["billing", "erp"]}
    assert {m.original_filename: m.status for m in made}["ack.edi"] == "not_routed"


def test_routes_of_other_types_to_one_target_are_not_redundant(erp, session, registry):
    erp.route_of_type("997", "erp")
    with pytest.raises(Conflict) as refused:
        svc.create_route(session, registry, "inbox", "acme", "*", "erp", "", "850")
    route = session.scalar(select(Route).where(Route.document_type == "850"))
    assert refused.value.message == f"redundant with route {route.id}: inbox, * -> *, 850, erp"
    session.rollback()
    with pytest.raises(Conflict):  # * covers the 850 route
        svc.create_route(session, registry, "inbox", "*", "*", "erp", "")
    session.rollback()


def test_a_redispatch_matches_the_routes_again_by_the_stored_types(erp, session):
    from b2bhub.engine import operator
    from b2bhub.models import utcnow

    order, ack = take(erp, X12, "po.edi"), take(erp, ACK, "ack.edi")
    erp.route_of_type("997", "archive")
    erp.route_of_type("850", "archive")
    session.commit()

    assert operator.redispatch(session, ack.id, "ada", utcnow()).changed
    assert operator.redispatch(session, order.id, "ada", utcnow()).changed
    session.commit()
    assert targets(session, ack) == ["archive"]
    assert targets(session, order) == ["archive", "erp"]


@pytest.mark.parametrize("kind", ["orders", "ORDERS:D:96A", "", "8 50"])
def test_a_bad_document_type_is_refused_saying_so(erp, session, registry, kind):
    with pytest.raises(ServiceError) as refused:
        svc.create_route(session, registry, "inbox", "*", "*", "archive", "", kind)
    assert refused.value.details == {"document_type": "invalid"}
    assert "document type" in refused.value.message
    session.rollback()


def test_the_route_tester_names_the_type_that_did_not_match(erp, session):
    result = svc.test_route(session, "inbox", "acme", "mycompany", ["997"])
    assert result["targets"] == []
    assert [(line["document_type"], line["reason"]) for line in result["routes"]] == [
        ("850", "document type '850' is not among the message's types (997)"),
        ("810", "document type '810' is not among the message's types (997)")]
    both = svc.test_route(session, "inbox", "acme", "mycompany", ["850", "810"])
    assert both["targets"] == ["billing", "erp"]


def test_a_fixture_file_may_give_a_route_its_type(app, hub, session, tmp_path):
    from b2bhub.cli import main

    standard_hub(hub, targets=("erp",))
    path = tmp_path / "fixtures.json"
    path.write_text(json.dumps({"organizations": [], "partners": [], "plugins": [],
                                "routes": [{"source": "inbox", "target": "erp",
                                            "document_type": "850"}]}))
    result = app.test_cli_runner().invoke(main, ["fixtures", "load", str(path)])
    assert result.exit_code == 0, result.output
    session.expire_all()
    assert session.scalar(select(Route.document_type)) == "850"


# --- the API and the UI ----------------------------------------------------------------

def test_the_api_saves_lists_and_tests_routes_with_a_type(erp, api):
    made = api.post("/api/v1/routes", json={"source": "inbox", "target": "archive",
                                            "document_type": "ORDERS"})
    assert made.status_code == 201, made.get_json()
    assert made.get_json()["document_type"] == "ORDERS"
    listed = api.get("/api/v1/routes").get_json()["items"]
    assert [(r["document_type"], r["target"]) for r in listed] == [
        ("850", "erp"), ("810", "billing"), ("ORDERS", "archive")]
    untyped = api.post("/api/v1/routes", json={"source": "inbox", "target": "erp"})
    error = error_of(untyped, 409, "redundant_route")  # any type covers the 850s
    assert error["message"] == f"redundant with route {listed[0]['id']}: inbox, * -> *, " \
                               "850, erp"
    error_of(api.post("/api/v1/routes", json={"source": "inbox", "target": "archive",
                                              "document_type": "orders"}), 400, "invalid")

    tested = api.post("/api/v1/routes/test", json={
        "source": "inbox", "document_types": ["ORDERS:D:96A"]}).get_json()
    assert tested["targets"] == ["archive"]
    assert tested["routes"][0]["reason"] == (
        "document type '850' is not among the message's types (ORDERS)")
    bare = api.post("/api/v1/routes/test", json={"source": "inbox"}).get_json()
    assert bare["targets"] == []
    assert bare["routes"][0]["reason"] == (
        "document type '850' wanted, and the message has no envelope")


def test_the_ui_saves_edits_shows_and_tests_a_route_type(erp, login, session):  # noqa: F811
    client = login("admin", "ada")
    refused = client.post("/ui/routes/new", data={
        "source": "inbox", "from_party": "*", "to_party": "*", "target": "archive",
        "document_type": "orders"})
    assert refused.status_code == 400
    assert "document type &#39;orders&#39; must be" in refused.text
    assert 'value="orders"' in refused.text  # kept as typed
    assert client.post("/ui/routes/new", data={
        "source": "inbox", "from_party": "*", "to_party": "*", "target": "archive",
        "document_type": "ORDERS"}).status_code == 302
    route = session.scalar(select(Route).where(Route.target == "archive"))
    assert route.document_type == "ORDERS"
    form = client.get(f"/ui/routes/{route.id}/edit").text
    assert 'value="ORDERS"' in form
    assert client.post(f"/ui/routes/{route.id}/edit", data={
        "source": "inbox", "from_party": "*", "to_party": "*", "target": "archive",
        "document_type": "INVOIC"}).status_code == 302
    session.expire_all()
    [edited] = session.scalars(select(Route).where(Route.target == "archive")).all()
    assert edited.document_type == "INVOIC"
    page = client.get("/ui/routes").text
    assert "<th>Document type</th>" in page and "<td>INVOIC</td>" in page
    tested = client.get("/ui/routes?test_source=inbox&test_from=*&test_to=*"
                        "&test_types=INVOIC:D:96A")
    assert "Targets reached:</strong> archive" in tested.text
    assert "document type &#39;850&#39; is not among the message&#39;s types (INVOIC)" \
        in tested.text
    lines = session.scalars(select(HistoryLine.text).where(
        HistoryLine.type == "config_changed", HistoryLine.actor == "ada")).all()
    assert any(", INVOIC, archive" in t for t in lines)
