"""``GET /api/v1/audit``: the history lines of a period streamed as JSON Lines and CSV,
in id order, filtered by actor and type; admins only; each export a line of its own."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

from b2bhub.models import HistoryLine, utcnow
from b2bhub.services.tokens import create_token
from b2bhub.services.users import create_user


def _lines(session, since):
    return [(line.id, line.type, line.actor, line.text) for line in session.query(
        HistoryLine).filter(HistoryLine.created_at >= since).order_by(HistoryLine.id)]


def test_audit_export_streams_the_period_in_order(session, api, app):
    before = utcnow() - timedelta(seconds=1)
    session.add(HistoryLine(type="config_changed", actor="old", text="last year",
                            created_at=before - timedelta(days=400)))
    session.commit()
    # configuration changes through the API, each a line naming the caller ("tests")
    assert api.post("/api/v1/partners", json={"name": "acme"}).status_code == 201
    assert api.post("/api/v1/users", json={"name": "ann", "password": "s3cret-pass",
                                            "role": "operator"}).status_code == 201
    assert api.post("/api/v1/tokens", json={"name": "ci"}).status_code == 201
    for n in range(2500):  # more than two batches of the stream, with a message's lines
        session.add(HistoryLine(message_id=n + 1, type="received", actor="",
                                text=f"line {n}, with \"quotes\"\nand a newline"))
    session.commit()
    expected = _lines(session, before)
    assert [t for _, t, _, _ in expected[:3]] == ["config_changed", "user_created",
                                                  "token_created"]
    since = before.isoformat() + "Z"

    answer = api.get(f"/api/v1/audit?since={since}&format=jsonl")
    assert answer.status_code == 200 and answer.is_streamed
    assert answer.mimetype == "application/x-ndjson"
    got = [json.loads(text) for text in answer.get_data(as_text=True).splitlines()]
    assert [(x["id"], x["type"], x["actor"], x["text"]) for x in got] == expected
    assert got[1]["data"] is None or isinstance(got[1]["data"], dict)

    # the export is a line naming who took it, outside what it exported
    exported = session.query(HistoryLine).filter_by(type="audit_exported").one()
    assert exported.actor == "tests" and "exported the audit trail" in exported.text
    assert exported.id > expected[-1][0]

    answer = api.get(f"/api/v1/audit?since={since}&format=csv&actor=tests")
    assert answer.mimetype == "text/csv"
    assert "attachment" in answer.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(answer.get_data(as_text=True), newline="")))
    # the caller's three changes and the first export's line, in id order
    assert [r["type"] for r in rows] == ["config_changed", "user_created",
                                         "token_created", "audit_exported"]
    assert rows[3]["id"] == str(exported.id) and json.loads(rows[3]["data"])["format"] == "jsonl"

    answer = api.get(f"/api/v1/audit?since={since}&type=received&format=csv")
    rows = list(csv.DictReader(io.StringIO(answer.get_data(as_text=True), newline="")))
    assert len(rows) == 2500 and rows[7]["text"] == 'line 7, with "quotes"\nand a newline'
    assert rows[7]["message_id"] == "8" and rows[7]["delivery_id"] == ""
    assert session.query(HistoryLine).filter_by(type="audit_exported").count() == 3

    # refusals: shape 400, meaning 422, a viewer 403 (and nothing recorded)
    assert api.get("/api/v1/audit?format=csv").status_code == 400
    assert api.get(f"/api/v1/audit?since={since}&format=xml").status_code == 400
    until = (before - timedelta(hours=1)).isoformat() + "Z"
    refused = api.get(f"/api/v1/audit?since={since}&until={until}")
    assert refused.status_code == 422 and refused.json["error"]["details"]["until"]
    viewer = create_token(session, "look", "viewer")
    session.commit()
    answer = app.test_client().get(f"/api/v1/audit?since={since}",
                                   headers={"Authorization": f"Bearer {viewer}"})
    assert answer.status_code == 403
    assert session.query(HistoryLine).filter_by(type="audit_exported").count() == 3

    # the Logs page's button: an admin's form posting to the export, with the login
    create_user(session, "ada", "admin-pass", "admin")
    create_user(session, "vic", "viewer-pass", "viewer")
    session.commit()
    ada = _ui(app, "ada", "admin-pass")
    assert 'id="audit-export"' in ada.get("/ui/logs").get_data(as_text=True)
    form_since = before.strftime("%Y-%m-%dT%H:%M")
    answer = ada.get(f"/api/v1/audit?since={form_since}&format=csv")
    assert answer.status_code == 200 and answer.get_data(as_text=True).startswith("id,")
    last = session.query(HistoryLine).order_by(HistoryLine.id.desc()).first()
    assert (last.type, last.actor) == ("audit_exported", "ada")
    vic = _ui(app, "vic", "viewer-pass")
    assert 'id="audit-export"' not in vic.get("/ui/logs").get_data(as_text=True)
    assert vic.get(f"/api/v1/audit?since={form_since}").status_code == 403


def _ui(app, name, password):
    client = app.test_client()
    assert client.post("/ui/login", data={"name": name, "password": password}
                       ).status_code == 302
    return client
