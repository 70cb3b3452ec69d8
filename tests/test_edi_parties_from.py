"""Parties from the envelope (docs/edi.md): a source instance with ``parties_from``
``envelope`` has from and to taken from its messages' envelopes through the parties' EDI
identities, in the core's intake; an unknown identity (or no envelope) leaves the
message stored, Not routed with the reason and the alert."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from b2bhub.engine.intake import SourceIntake
from b2bhub.models import Alert, HistoryLine, Message, PluginInstance
from b2bhub.services import config as svc
from tests.enginekit import T0, deliveries
from tests.test_api import error_of
from tests.test_edi_inspect import EDIFACT, X12
from tests.test_ui import login  # noqa: F401

#: the samples are from ZZ:MYCOMPANY to ZZ:ACME; this one is from a sender nobody has
STRANGER = X12.replace(b"*ZZ*MYCOMPANY      *", b"*ZZ*NOBODY         *")


@pytest.fixture
def parties(hub, session):
    """mycompany is ZZ:MYCOMPANY, acme ZZ:ACME; globex has no identity."""
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    svc.update_party(session, "organization", "mycompany", "", ["ZZ:MYCOMPANY"])
    svc.update_party(session, "partner", "acme", "", ["ZZ:ACME", "01:123456789"])
    hub.instance("writer", "noop")
    session.commit()
    return hub


def lines_of(session, message_id: int) -> list[tuple[str, str]]:
    return [tuple(r) for r in session.execute(
        select(HistoryLine.type, HistoryLine.text).where(
            HistoryLine.message_id == message_id).order_by(HistoryLine.id))]


def test_a_poller_taking_parties_from_envelopes(parties, registry, session, tmp_path):
    """The path says globex; the envelopes say who sent what to whom."""
    from b2bhub.engine.scans import SourceRunner
    from b2bhub.runtime.hub import new_session
    from plugins.file_poller import FilePoller

    registry.register(FilePoller)
    parties.instance("poller", "file_poller", parties_from="envelope", config={
        "base_directory": str(tmp_path), "path_pattern": "{to}/{filename}"})
    parties.route("poller", "mycompany", "acme", "writer")
    (tmp_path / "globex").mkdir()
    for name, body in {"po.edi": X12, "orders.edi": EDIFACT, "stranger.edi": STRANGER,
                       "note.txt": b"no envelope here"}.items():
        (tmp_path / "globex" / name).write_bytes(body)
    now = [T0]
    runner = SourceRunner(new_session, registry, parties.store, "proc-a",
                          clock=lambda: now[0])
    runner.scan("poller")  # a first sighting is not taken
    now[0] += timedelta(seconds=10)
    assert len(runner.scan("poller").messages) == 4

    session.expire_all()
    made = {m.original_filename: m for m in session.scalars(select(Message))}
    for name in ("po.edi", "orders.edi"):
        message = made[name]
        assert (message.from_party, message.to_party, message.direction) == (
            "mycompany", "acme", "outbound")
        assert [d.target for d in deliveries(session, message.id)] == ["writer"]
    stranger, note = made["stranger.edi"], made["note.txt"]
    assert (stranger.status, note.status) == ("not_routed", "not_routed")
    assert ("not_routed", "parties from the envelope: envelope sender ZZ:NOBODY is no "
            "party's EDI identity") in lines_of(session, stranger.id)
    assert ("not_routed", "parties from the envelope: no envelope: its parties cannot "
            "be taken from it") in lines_of(session, note.id)
    # the reason is the only not_routed line: no "no route matches" beside it
    assert [t for t, _ in lines_of(session, stranger.id)].count("not_routed") == 1
    # kept as the source gave them, so nothing is lost and the payload is there
    assert (stranger.from_party, stranger.to_party) == ("mycompany", "globex")
    assert parties.store.open(stranger.sha256).read() == STRANGER
    alerts = session.scalars(select(Alert.subject).where(
        Alert.kind == "message_not_routed", Alert.resolved_at.is_(None))).all()
    assert sorted(alerts) == sorted([f"message:{stranger.id}", f"message:{note.id}"])


def test_a_collector_s_message_takes_the_receiver_too(parties, session):
    """The path a collector stores one message by (``context.store_and_dispatch``)."""
    parties.instance("inbox", "manual_source")
    parties.route("inbox", "acme", "mycompany", "writer")
    inbound = X12.replace(b"*ZZ*MYCOMPANY      *ZZ*ACME           *",
                          b"*01*123456789      *ZZ*MYCOMPANY      *")
    intake = SourceIntake(session, parties.store, "inbox", parties_from="envelope")
    message = session.get(Message, intake.store_and_dispatch(inbound, "x", "y", "in.edi"))
    assert (message.from_party, message.to_party) == ("acme", "mycompany")
    assert [d.target for d in deliveries(session, message.id)] == ["writer"]

    unknown = X12.replace(b"*ZZ*ACME           *", b"*ZZ*ELSEWHERE      *")
    lost = session.get(Message, intake.store_and_dispatch(unknown, "x", "y", "out.edi"))
    assert lost.status == "not_routed"
    assert ("not_routed", "parties from the envelope: envelope receiver ZZ:ELSEWHERE is "
            "no party's EDI identity") in lines_of(session, lost.id)
    assert session.scalar(select(Alert.kind).where(
        Alert.subject == f"message:{lost.id}")) == "message_not_routed"


def test_by_default_a_source_s_own_parties_stand(parties, session):
    parties.instance("inbox", "manual_source")
    assert session.scalar(select(PluginInstance.parties_from).where(
        PluginInstance.name == "inbox")) == "source"
    intake = SourceIntake(session, parties.store, "inbox")
    message = session.get(Message, intake.store_and_dispatch(STRANGER, "acme", "globex",
                                                             "a.edi"))
    assert (message.from_party, message.to_party) == ("acme", "globex")


# --- the API and the UI -----------------------------------------------------------------

def test_the_api_sets_and_shows_parties_from(parties, api):
    made = api.post("/api/v1/plugins/configs", json={
        "name": "inbox", "type": "manual_source", "parties_from": "envelope"})
    assert made.status_code == 201, made.get_json()
    assert made.get_json()["parties_from"] == "envelope"
    assert api.get("/api/v1/plugins/configs/writer").get_json()["parties_from"] == "source"
    error_of(api.post("/api/v1/plugins/configs", json={
        "name": "inbox2", "type": "manual_source", "parties_from": "path"}), 400, "invalid")


def test_the_ui_plugin_form_offers_parties_from_to_sources(parties, login,  # noqa: F811
                                                           session):
    client = login("admin")
    assert 'name="parties_from"' in client.get("/ui/plugins/new/manual_source").text
    assert 'name="parties_from"' not in client.get("/ui/plugins/new/noop").text
    saved = client.post("/ui/plugins/new/manual_source", data={
        "name": "inbox", "enabled": "y", "parties_from": "envelope"})
    assert saved.status_code == 302, saved.text
    assert session.scalar(select(PluginInstance.parties_from).where(
        PluginInstance.name == "inbox")) == "envelope"
    edit = client.get("/ui/plugins/inbox/edit").text
    assert '<option selected value="envelope">' in edit
