"""Expected-message rules through the API, fixtures and the beat's tick, with the
clock given (b2bhub/engine/expected.py; the real processes: test_expected_processes.py)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, update

from b2bhub.engine import expected as engine
from b2bhub.models import Alert, HistoryLine
from b2bhub.models.expected import ExpectedRule, ExpectedWindow
from b2bhub.services.fixtures import load_fixtures
from tests import test_ui

login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request

NIGHTLY = {"name": "acme-inventory", "direction": "inbound", "from": "acme",
           "filename": "INV-*.csv", "schedule": "0 6 * * 1-5", "timezone": "Europe/Berlin"}
#: Monday 7 December 2026, 06:00 in Berlin
MONDAY_END = datetime(2026, 12, 7, 5)


@pytest.fixture
def parties(hub):
    hub.parties()
    hub.instance("inbox", "manual_source")


def tick(session, now):
    report = engine.run(session, now, "tests")
    assert report.ran
    return report


def made_on_friday(session, name: str = "acme-inventory") -> None:
    """The rule dates from Friday 4 December 2026, whatever today is: its windows are
    planned from then."""
    session.execute(update(ExpectedRule).where(ExpectedRule.name == name).values(
        created_at=datetime(2026, 12, 4, 12)))
    session.commit()


def windows(session):
    session.expire_all()
    return [(w.ends_at, w.state, w.message_id) for w in session.scalars(
        select(ExpectedWindow).order_by(ExpectedWindow.ends_at))]


def alerts(session):
    session.expire_all()
    return [(a.kind, a.subject, a.text, a.resolved_at is not None)
            for a in session.scalars(select(Alert).where(Alert.kind == "expected_missing")
                                     .order_by(Alert.id))]


def test_rules_are_made_and_refused_through_the_api(api, parties, session):
    made = api.post("/api/v1/expected/rules", json=NIGHTLY)
    assert made.status_code == 201, made.get_json()
    assert made.get_json()["from"] == "acme" and made.get_json()["schedule"] == "0 6 * * 1-5"
    assert api.post("/api/v1/expected/rules", json=NIGHTLY).status_code == 409
    bad = api.post("/api/v1/expected/rules", json={
        **NIGHTLY, "name": "bad", "from": "nobody", "timezone": "Mars/Olympus"})
    assert bad.status_code == 422
    assert set(bad.get_json()["error"]["details"]) == {"from", "timezone"}
    both = api.post("/api/v1/expected/rules", json={**NIGHTLY, "name": "both",
                                                    "after": {}, "within_minutes": 5})
    assert both.status_code == 422 and "schedule" in both.get_json()["error"]["details"]
    assert api.post("/api/v1/expected/rules", json={"name": "x", "direction": "up"}
                    ).status_code == 400
    assert [r["name"] for r in api.get("/api/v1/expected/rules").get_json()["items"]] == [
        "acme-inventory"]
    line = session.scalar(select(HistoryLine.text).where(HistoryLine.type == "config_changed")
                          .order_by(HistoryLine.id.desc()))
    assert line.startswith("tests: created expected-message rule acme-inventory (inbound acme")
    assert api.delete("/api/v1/expected/rules/acme-inventory").status_code == 204
    assert api.get("/api/v1/expected/rules/acme-inventory").status_code == 404


def test_fixtures_load_rules_all_or_nothing(parties, session, registry):
    assert load_fixtures(session, {"expected": [NIGHTLY]}, registry=registry) == {
        "organizations": 0, "partners": 0, "plugins": 0, "routes": 0, "expected": 1}
    with pytest.raises(Exception, match=r"expected 1 \(late\): .*within_minutes"):
        load_fixtures(session, {"expected": [{"name": "late", "after": {"direction": "outbound"}}]},
                      registry=registry)


def test_a_window_met_missed_late_and_judged_once_after_down_time(api, parties, hub, session):
    api.post("/api/v1/expected/rules", json=NIGHTLY)
    made_on_friday(session)
    tick(session, MONDAY_END - timedelta(hours=2))   # the cursor starts; Monday's window open
    hub.message(filename="INV-1.csv", now=MONDAY_END - timedelta(seconds=1))
    hub.message(filename="other.csv", now=MONDAY_END - timedelta(seconds=1))
    tick(session, MONDAY_END + timedelta(seconds=10))
    assert windows(session)[0][:2] == (MONDAY_END, "met")
    assert alerts(session) == []
    # the hub is down from Monday to Wednesday noon: Tuesday's window is judged on return
    wednesday = MONDAY_END + timedelta(days=2, hours=7)
    tick(session, wednesday)
    tick(session, wednesday + timedelta(seconds=5))
    assert [w[1] for w in windows(session)] == ["met", "missed", "missed", "open"]
    assert alerts(session) == [
        ("expected_missing", "expected:acme-inventory:end:2026-12-08T05:00:00",
         "no message for rule acme-inventory in the window 2026-12-07 06:00 to "
         "2026-12-08 06:00 Europe/Berlin", False),
        ("expected_missing", "expected:acme-inventory:end:2026-12-09T05:00:00",
         "no message for rule acme-inventory in the window 2026-12-08 06:00 to "
         "2026-12-09 06:00 Europe/Berlin", False)]
    late = hub.message(filename="INV-2.csv", now=wednesday + timedelta(minutes=1))
    tick(session, wednesday + timedelta(minutes=2))
    assert windows(session)[2][1:] == ("late", late.id)
    assert alerts(session)[1][2].endswith(
        f"; arrived 421 min late (message {late.id})") and alerts(session)[1][3]
    assert session.scalar(select(HistoryLine.text).where(
        HistoryLine.message_id == late.id, HistoryLine.type == "expected_late")).startswith(
        f"acme-inventory: arrived 421 min late (message {late.id}) for the window")
    api.delete("/api/v1/expected/rules/acme-inventory")
    assert [a[3] for a in alerts(session)] == [True, True]


def test_a_relation_expects_a_response_within_minutes_of_each_request(
        api, parties, hub, session):
    made = api.post("/api/v1/expected/rules", json={
        "name": "acme-response", "direction": "inbound", "from": "acme",
        "filename": "*.resp", "after": {"direction": "outbound", "filename": "*.req"},
        "within_minutes": 15})
    assert made.status_code == 201, made.get_json()
    start = datetime(2026, 12, 7, 9)
    tick(session, start)
    hub.message(from_party="mycompany", to_party="acme", filename="a.req", now=start)
    unanswered = hub.message(from_party="mycompany", to_party="acme", filename="b.req",
                             now=start + timedelta(minutes=1))
    reply = hub.message(filename="a.resp", now=start + timedelta(minutes=10))
    tick(session, start + timedelta(minutes=17))
    assert [(w[1], w[2]) for w in windows(session)] == [("met", reply.id), ("missed", None)]
    (kind, subject, text, resolved), = alerts(session)
    assert (kind, subject, resolved) == (
        "expected_missing", f"expected:acme-response:message:{unanswered.id}", False)
    assert text.startswith(f"no message for rule acme-response in the window 15 min after "
                           f"message {unanswered.id}")
    assert session.scalar(select(Alert.message_id).where(Alert.kind == "expected_missing")
                          ) == unanswered.id
    assert api.get("/api/v1/expected/rules/acme-response/windows").get_json()["items"][0][
        "state"] == "missed"


def test_the_alerts_and_partner_pages_show_each_rules_last_windows(
        app, session, parties, hub, login):
    admin, viewer = login("admin"), login("viewer")
    form = {"name": "acme-inventory", "direction": "inbound", "from_party": "acme",
            "to_party": "*", "filename": "INV-*.csv", "document_type": "*",
            "schedule": "0 6 * * 1-5", "timezone": "Europe/Berlin", "after_direction": ""}
    refused = admin.post("/ui/alerts/expected", data={**form, "timezone": "Mars/Olympus"})
    assert refused.status_code == 400 and "unknown time zone" in refused.text
    assert admin.post("/ui/alerts/expected", data=form).status_code == 302
    assert viewer.post("/ui/alerts/expected", data={**form, "name": "x"}).status_code == 403
    made_on_friday(session)
    tick(session, MONDAY_END + timedelta(hours=1))
    page = viewer.get("/ui/alerts").text
    rules_table = re.search(r'<table id="expected-rules">.*?</table>', page, re.S).group(0)
    assert "inbound acme → * INV-*.csv by &#39;0 6 * * 1-5&#39; Europe/Berlin" in rules_table
    assert re.findall(r'data-state="(\w+)"', rules_table) == ["open", "missed"]
    assert "no message for rule acme-inventory in the window 2026-12-04 06:00 to " \
           "2026-12-07 06:00 Europe/Berlin" in page
    partner_page = viewer.get("/ui/parties/acme").text
    assert 'data-rule="acme-inventory"' in partner_page
    assert admin.post("/ui/alerts/expected/acme-inventory/delete",
                      data={"confirm": "yes"}).status_code == 302
    assert alerts(session)[0][3] is True


def test_a_rule_watches_the_messages_stored_after_it_is_made(api, parties, hub, session):
    start = datetime(2026, 12, 7, 9)
    tick(session, start)
    hub.message(filename="INV-old.csv", now=start + timedelta(minutes=1))
    tick(session, start + timedelta(minutes=2))  # no rule yet: the cursor moves past it
    api.post("/api/v1/expected/rules", json={**NIGHTLY, "schedule": "0 12 * * *",
                                             "timezone": "UTC"})
    session.execute(update(ExpectedRule).values(created_at=start))
    session.commit()
    new = hub.message(filename="INV-new.csv", now=start + timedelta(minutes=3))
    tick(session, start + timedelta(hours=4))
    assert windows(session) == [(datetime(2026, 12, 7, 12), "met", new.id),
                                (datetime(2026, 12, 8, 12), "open", None)]


def test_the_tick_runs_in_one_process_at_a_time(db, session):
    from sqlalchemy.orm import Session

    from b2bhub.engine.sweep import SweepGuard
    now = datetime(2026, 12, 7, 9)
    with Session(db.engine) as other, SweepGuard(other, "elsewhere:1:w1", now,
                                                 name=engine.LOCK_NAME,
                                                 key=engine.ADVISORY_KEY) as held:
        assert held
        assert engine.run(session, now, "tests").ran is False
    assert engine.run(session, now, "tests").ran is True
