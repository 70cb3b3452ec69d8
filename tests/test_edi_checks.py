"""Checks at intake (docs/edi.md): per source instance, an interchange whose envelope
has errors is delivered with them in its history (``edi_errors: accept``) or stored
Refused with them as the reason (``refuse``); one whose sender and interchange control
number came within ``duplicate_days`` gets a ``duplicate_received`` line and alert
(``duplicates: alert``) or is Refused naming the earlier message (``refuse``). Nothing
is lost either way: a refused message keeps its payload, envelope and history."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

import b2bhub.plugin as interface
from b2bhub.engine.dispatch import NewMessage
from b2bhub.engine.envelope_checks import IntakeChecks, IntakeRefusal, check_intake
from b2bhub.engine.inspection import attribute_rows
from b2bhub.engine.intake import SourceIntake
from b2bhub.models import Alert, HistoryLine, Message, MessageAttribute, PluginInstance
from tests.enginekit import T0, deliveries
from tests.test_api import error_of
from tests.test_edi_inspect import X12, x12
from tests.test_edi_parties_from import lines_of
from tests.test_ui import login  # noqa: F401

BAD = X12.replace(b"SE*10*0001", b"SE*10*0009")  # SE02 does not match ST02
BAD_ERROR = "SE02 0009 does not match ST02 0001"


@pytest.fixture
def parties(hub, session):
    hub.parties(organizations=("mycompany",), partners=("acme",))
    hub.instance("writer", "noop")
    session.commit()
    return hub


def intake(hub, name: str, now: list, **checks) -> SourceIntake:
    """A source instance ``name`` with these checks, routed to the writer, and its
    intake with a clock the test moves."""
    hub.instance(name, "manual_source", **checks)
    hub.route(name, "*", "*", "writer")
    row = hub.session.scalar(select(PluginInstance).where(PluginInstance.name == name))
    return SourceIntake(hub.session, hub.store, name, clock=lambda: now[0],
                        checks=IntakeChecks.of(row))


def stored(session, intake_: SourceIntake, body: bytes, name: str) -> Message:
    return session.get(Message, intake_.store_and_dispatch(body, "mycompany", "acme", name))


def open_alerts(session, kind: str) -> list[tuple[str, int]]:
    return [tuple(r) for r in session.execute(select(Alert.subject, Alert.message_id).where(
        Alert.kind == kind, Alert.resolved_at.is_(None)).order_by(Alert.id))]


# --- envelope errors --------------------------------------------------------------------

def test_envelope_errors_are_accepted_with_a_line_or_refused_keeping_everything(
        parties, session):
    now = [T0]
    lenient = intake(parties, "lenient", now)
    strict = intake(parties, "strict", now, edi_errors="refuse")

    accepted = stored(session, lenient, BAD, "bad.edi")
    assert accepted.status == "received"
    assert [d.target for d in deliveries(session, accepted.id)] == ["writer"]
    assert ("edi_errors", f"envelope errors: {BAD_ERROR} (accepted, as the source's "
            "edi_errors says)") in lines_of(session, accepted.id)

    refused = stored(session, strict, BAD, "bad.edi")
    assert refused.status == "refused"
    assert refused.status_text == f"envelope errors: {BAD_ERROR}"
    assert deliveries(session, refused.id) == []
    assert ("refused", f"envelope errors: {BAD_ERROR}") in lines_of(session, refused.id)
    # nothing lost: the payload, and the envelope (what a negative acknowledgment reads)
    assert parties.store.open(refused.sha256).read() == BAD
    found = session.execute(select(MessageAttribute.name, MessageAttribute.value).where(
        MessageAttribute.message_id == refused.id)).all()
    assert ("edi_error", BAD_ERROR) in found and ("reference", "PO-4711") in found

    clean = stored(session, strict, X12.replace(b"000000101", b"000000102"), "ok.edi")
    assert [d.target for d in deliveries(session, clean.id)] == ["writer"]
    assert "edi_errors" not in [t for t, _ in lines_of(session, clean.id)]
    # a file no inspector recognises is not an interchange: nothing to check
    note = stored(session, strict, b"just a note", "note.txt")
    assert [d.target for d in deliveries(session, note.id)] == ["writer"]


def test_one_call_for_a_receiver_that_stores_its_messages_itself(parties, session):
    """What the HTTP and AS2 receivers call: the settings in, the message or its
    refusal (with the errors for a negative acknowledgment) out."""
    digest = parties.store.put(BAD)
    new = NewMessage(source="somewhere", from_party="acme", to_party="mycompany",
                     stages={"unpacked": (digest.digest, digest.size)},
                     rows=attribute_rows(parties.store, digest.digest))
    refusal = interface.check_intake(session, new, interface.IntakeChecks(
        edi_errors="refuse"), T0)
    assert isinstance(refusal, IntakeRefusal)
    assert refusal.errors == [BAD_ERROR] and refusal.duplicate_of is None
    message_id = interface.store_intake_refusal(session, refusal, T0)
    assert session.get(Message, message_id).status == "refused"
    kept = check_intake(session, NewMessage(
        source="somewhere", from_party="acme", to_party="mycompany",
        stages={"unpacked": (digest.digest, digest.size)},
        rows=attribute_rows(parties.store, digest.digest)),
        IntakeChecks.of({"edi_errors": "accept"}), T0)
    assert isinstance(kept, NewMessage)
    assert [line["type"] for line in kept.lines] == ["edi_errors"]


# --- duplicates -------------------------------------------------------------------------

def test_a_duplicate_within_the_window_is_alerted_or_refused_and_not_after_it(
        parties, session):
    now = [T0]
    alerting = intake(parties, "alerting", now, duplicate_days=10)
    refusing = intake(parties, "refusing", now, duplicates="refuse", duplicate_days=10)

    first = stored(session, alerting, X12, "first.edi")
    assert "duplicate_received" not in [t for t, _ in lines_of(session, first.id)]

    now[0] = T0 + timedelta(days=9)
    again = stored(session, alerting, X12, "again.edi")
    assert [d.target for d in deliveries(session, again.id)] == ["writer"]
    text = (f"interchange 000000101 from ZZ:MYCOMPANY was received before as message "
            f"{first.id}")
    assert ("duplicate_received", text) in lines_of(session, again.id)
    line = session.scalar(select(HistoryLine).where(
        HistoryLine.message_id == again.id, HistoryLine.type == "duplicate_received"))
    assert line.data["message_id"] == first.id
    assert open_alerts(session, "duplicate_received") == [(f"message:{again.id}", again.id)]

    copy = stored(session, refusing, X12, "copy.edi")  # any earlier message counts
    assert copy.status == "refused" and deliveries(session, copy.id) == []
    assert copy.status_text == f"duplicate: {text}"
    assert len(open_alerts(session, "duplicate_received")) == 1  # the refusal is enough

    # the first copy is 10 days old, the second 1 day: still a duplicate of the first
    # within the window, of none once the window passed them both
    now[0] = T0 + timedelta(days=10, seconds=1)
    assert stored(session, refusing, X12, "later.edi").status_text == (
        f"duplicate: interchange 000000101 from ZZ:MYCOMPANY was received before as "
        f"message {again.id}")
    now[0] = T0 + timedelta(days=19, seconds=1)
    late = stored(session, refusing, X12, "late.edi")
    assert late.status == "received"
    assert "duplicate_received" not in [t for t, _ in lines_of(session, late.id)]


def test_a_refused_copy_does_not_count_and_0_days_turns_the_check_off(parties, session):
    now = [T0]
    strict = intake(parties, "strict", now, edi_errors="refuse", duplicates="refuse")
    off = intake(parties, "off", now, duplicate_days=0)
    assert stored(session, strict, BAD, "bad.edi").status == "refused"
    # the partner sends it again, corrected, with the same control number
    fixed = stored(session, strict, X12, "fixed.edi")
    assert fixed.status == "received"
    other_sender = X12.replace(b"*ZZ*MYCOMPANY      *", b"*ZZ*SOMEONE        *")
    assert stored(session, strict, other_sender, "other.edi").status == "received"
    unchecked = stored(session, off, X12, "unchecked.edi")
    assert unchecked.status == "received"
    assert "duplicate_received" not in [t for t, _ in lines_of(session, unchecked.id)]


def test_the_same_interchange_twice_in_one_scan(parties, registry, session, tmp_path):
    """A poller's batch holding a file twice: the second is the duplicate of the first."""
    from b2bhub.engine.scans import SourceRunner
    from b2bhub.runtime.hub import new_session
    from plugins.file_poller import FilePoller

    registry.register(FilePoller)
    parties.instance("poller", "file_poller", config={
        "base_directory": str(tmp_path), "path_pattern": "{to}/{filename}"})
    parties.route("poller", "*", "*", "writer")
    (tmp_path / "acme").mkdir()
    two = x12(control="000000777")
    for name in ("a.edi", "b.edi"):
        (tmp_path / "acme" / name).write_bytes(two)
    (tmp_path / "acme" / "c.edi").write_bytes(x12(control="000000778"))
    now = [T0]
    runner = SourceRunner(new_session, registry, parties.store, "proc-a",
                          clock=lambda: now[0])
    runner.scan("poller")  # a first sighting is not taken
    now[0] += timedelta(seconds=10)
    assert len(runner.scan("poller").messages) == 3

    session.expire_all()
    made = {m.original_filename: m for m in session.scalars(select(Message))}
    first, second = sorted([made["a.edi"], made["b.edi"]], key=lambda m: m.id)
    assert ("duplicate_received", f"interchange 000000777 from ZZ:MYCOMPANY was received "
            f"before as message {first.id}") in lines_of(session, second.id)
    assert "duplicate_received" not in [t for t, _ in lines_of(session, first.id)]
    assert "duplicate_received" not in [t for t, _ in lines_of(session, made["c.edi"].id)]
    assert open_alerts(session, "duplicate_received") == [(f"message:{second.id}",
                                                            second.id)]
    assert all(deliveries(session, m.id) for m in made.values())


# --- the API and the UI -----------------------------------------------------------------

def test_the_api_sets_shows_and_checks_the_fields(parties, api, session):
    shape = api.get("/api/v1/plugins/configs/writer").get_json()
    assert (shape["edi_errors"], shape["duplicates"], shape["duplicate_days"]) == (
        "accept", "alert", 30)
    made = api.post("/api/v1/plugins/configs", json={
        "name": "inbox", "type": "manual_source", "edi_errors": "refuse",
        "duplicates": "refuse", "duplicate_days": 7})
    assert made.status_code == 201, made.get_json()
    assert {k: made.get_json()[k] for k in ("edi_errors", "duplicates", "duplicate_days")
            } == {"edi_errors": "refuse", "duplicates": "refuse", "duplicate_days": 7}
    changed = api.put("/api/v1/plugins/configs/inbox", json={"duplicate_days": 0})
    assert changed.status_code == 200 and changed.get_json()["duplicate_days"] == 0
    assert changed.get_json()["edi_errors"] == "refuse"  # left out: kept

    for field, value in (("edi_errors", "drop"), ("edi_errors", None),
                         ("duplicates", "ignore"), ("duplicate_days", -1),
                         ("duplicate_days", 36_501), ("duplicate_days", "7"),
                         ("duplicate_days", True)):
        error = error_of(api.put("/api/v1/plugins/configs/inbox",
                                 json={field: value}), 400)
        assert field in str(error["details"]), (field, value, error)
    session.expire_all()
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "inbox"))
    assert (row.edi_errors, row.duplicates, row.duplicate_days) == ("refuse", "refuse", 0)

    lines = session.execute(select(HistoryLine.actor, HistoryLine.text).where(
        HistoryLine.type == "config_changed").order_by(HistoryLine.id)).all()
    texts = [text for actor, text in lines if "intake checks" in text]
    assert texts[-2:] == [
        f"{lines[-2].actor}: intake checks of instance inbox: edi_errors refuse (was "
        "accept), duplicates refuse (was alert), duplicate_days 7 (was 30)",
        f"{lines[-1].actor}: intake checks of instance inbox: duplicate_days 0 (was 7)"]
    assert lines[-1].actor


def test_the_service_refuses_bad_values_naming_the_field(parties, session):
    from b2bhub.services import config as svc
    from b2bhub.services.errors import ServiceError

    for field, value in (("edi_errors", "drop"), ("duplicates", 3),
                         ("duplicate_days", -2), ("duplicate_days", "x")):
        with pytest.raises(ServiceError) as refused:
            svc.save_instance(session, parties.registry, {
                "name": "inbox", "type": "manual_source", field: value})
        assert field in refused.value.message and field in refused.value.details
        session.rollback()


def test_the_ui_form_offers_the_checks_to_sources(parties, login, session):  # noqa: F811
    client = login("admin", "ada")
    form = client.get("/ui/plugins/new/manual_source").text
    for name in ("edi_errors", "duplicates", "duplicate_days"):
        assert f'name="{name}"' in form
    assert 'name="edi_errors"' not in client.get("/ui/plugins/new/noop").text
    bad = client.post("/ui/plugins/new/manual_source", data={
        "name": "inbox", "enabled": "y", "edi_errors": "refuse", "duplicates": "alert",
        "duplicate_days": "a week"})
    assert bad.status_code == 400 and "must be a whole number" in bad.text
    saved = client.post("/ui/plugins/new/manual_source", data={
        "name": "inbox", "enabled": "y", "edi_errors": "refuse", "duplicates": "refuse",
        "duplicate_days": "14"})
    assert saved.status_code == 302, saved.text
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "inbox"))
    assert (row.edi_errors, row.duplicates, row.duplicate_days) == ("refuse", "refuse", 14)
    edit = client.get("/ui/plugins/inbox/edit").text
    assert '<option selected value="refuse">' in edit and 'value="14"' in edit
    assert session.scalar(select(HistoryLine.text).where(
        HistoryLine.type == "config_changed", HistoryLine.actor == "ada",
        HistoryLine.text.like("%intake checks%"))) == (
        "ada: intake checks of instance inbox: edi_errors refuse (was accept), "
        "duplicates refuse (was alert), duplicate_days 14 (was 30)")
