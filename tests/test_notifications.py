"""Alert notifications reach people: a real SMTP server (aiosmtpd) and a JSON webhook on
loopback receive each alert once; a server that is down delays a mail, never loses it;
a burst of alerts is one digest; channels through the API and the UI, every change a
history line naming who made it; and with real beat and worker processes a failed
delivery ends in an inbox."""

from __future__ import annotations

import json
from datetime import timedelta
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiosmtpd.controller import Controller
from sqlalchemy import select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine import notifications
from b2bhub.engine.history import raise_alert, resolve_alert
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import Alert, HistoryLine, Notification, utcnow
from tests.loopback import serve_in_thread
from tests.procs import free_port, wait_until
from tests.test_api import error_of, token_client

LATER = timedelta(seconds=notifications.GATHER_SECONDS + 1)


class Inbox:
    """An SMTP server on loopback that keeps every mail it accepts; stop and start it
    again on the same port to play a mail server that is down."""

    def __init__(self):
        self.port = free_port()
        self.mails: list = []
        self.controller = None

    async def handle_DATA(self, server, session, envelope):
        self.mails.append(message_from_bytes(envelope.content))
        return "250 OK"

    def start(self) -> None:
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def stop(self) -> None:
        self.controller.stop()

    @property
    def url(self) -> str:
        return (f"mailto://127.0.0.1:{self.port}?smtp=127.0.0.1&mode=insecure"
                "&from=hub@example.com&to=ops@example.com")

    def subjects(self) -> list[str]:
        return [m["Subject"] for m in self.mails]


class Webhook:
    """An HTTP sink on loopback that keeps every JSON body posted to it."""

    def __init__(self):
        posts = self.posts = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        serve_in_thread(self.server)
        self.url = f"json://127.0.0.1:{self.server.server_port}/b2bhub"


@pytest.fixture
def inbox():
    box = Inbox()
    box.start()
    yield box
    if box.controller is not None and box.controller._thread is not None:
        box.stop()


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.server.shutdown()


@pytest.fixture
def failed_message(hub, session, record_dir):
    """A message whose only delivery failed: a real ``message_failed`` alert."""
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("writer", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "writer")
    message = hub.message(filename="order-7.edi")
    now = utcnow()
    [claim] = claiming.claim(session, "writer", "w1", now, 1, 300)
    settlement.settle(session, claim, Outcome.failed("disk full"), RetryPolicy(), now)
    session.commit()
    [alert] = session.scalars(select(Alert).where(Alert.kind == "message_failed")).all()
    return message, alert


def run_notifier(session, at):
    planned = notifications.plan(session, at)
    sent, failed = notifications.send_due(session, at)
    return planned, sent, failed


def add_channel(api, name, url, **extra):
    response = api.post("/api/v1/notifications/channels",
                        json={"name": name, "url": url, **extra})
    assert response.status_code == 201, response.text
    return response.json


def test_a_failed_message_reaches_an_inbox_and_a_webhook_once_each(
        api, session, failed_message, inbox, webhook):
    message, alert = failed_message
    add_channel(api, "ops-mail", inbox.url)
    add_channel(api, "ops-hook", webhook.url, kinds=["message_failed"])
    assert run_notifier(session, utcnow()) == (0, 0, 0)  # still gathering its burst
    assert run_notifier(session, utcnow() + LATER) == (2, 2, 0)
    for _ in range(3):  # later rounds send nothing again
        assert run_notifier(session, utcnow() + 2 * LATER) == (0, 0, 0)
    [mail] = inbox.mails
    assert mail["Subject"].startswith("b2bhub: message_failed opened:")
    assert mail["To"] == "ops@example.com"
    body = mail.get_payload(0).get_payload(decode=True).decode()
    assert alert.text in body and f"/ui/messages/{message.id}" in body
    # the message's status, ours and seed 003's identifier (docs/status-codes.md)
    assert "Status: error (ERRO_ENTREGA)" in body
    [post] = webhook.posts
    assert post["title"] == mail["Subject"] and alert.text in post["message"]
    assert "Status: error (ERRO_ENTREGA)" in post["message"]
    rows = session.scalars(select(Notification).order_by(Notification.id)).all()
    assert [(n.event, n.state, n.attempts, n.alert_ids) for n in rows] == [
        ("opened", "sent", 1, [alert.id]), ("opened", "sent", 1, [alert.id])]


def test_a_mail_server_down_for_a_minute_delays_the_mail_never_loses_it(
        api, session, failed_message, inbox):
    add_channel(api, "ops-mail", inbox.url)
    inbox.stop()
    start = utcnow() + LATER
    assert run_notifier(session, start) == (1, 0, 1)
    [row] = session.scalars(select(Notification)).all()
    assert (row.state, row.attempts) == ("pending", 1)
    assert row.last_error and row.due_at == start + timedelta(seconds=30)
    assert run_notifier(session, start + timedelta(seconds=10)) == (0, 0, 0)  # not due
    assert run_notifier(session, start + timedelta(seconds=31)) == (0, 0, 1)
    session.refresh(row)
    assert (row.state, row.attempts) == ("pending", 2)
    assert row.due_at == start + timedelta(seconds=31 + 60)
    inbox.start()  # back after a minute
    assert run_notifier(session, start + timedelta(seconds=92)) == (0, 1, 0)
    session.refresh(row)
    assert (row.state, row.attempts, row.last_error) == ("sent", 3, "")
    assert len(inbox.mails) == 1
    assert run_notifier(session, start + timedelta(minutes=30)) == (0, 0, 0)
    assert len(inbox.mails) == 1


def test_two_hundred_failures_at_once_are_one_digest(api, session, inbox, webhook):
    add_channel(api, "ops-mail", inbox.url, kinds=["message_failed"])
    add_channel(api, "ops-hook", webhook.url)
    now = utcnow()
    for index in range(200):
        raise_alert(session, "message_failed", f"message:{index}",
                    f"message {index} failed: disk full", None, now)
    raise_alert(session, "plugin_failed", "instance:writer", "writer: cannot start", None, now)
    session.commit()
    assert run_notifier(session, now + LATER) == (2, 2, 0)
    [mail] = inbox.mails
    assert mail["Subject"] == "b2bhub: 200 alerts opened"  # plugin_failed is not its kind
    body = mail.get_payload(0).get_payload(decode=True).decode()
    assert "200 alerts opened: 200 message_failed" in body and "and 180 more" in body
    [post] = webhook.posts
    assert post["title"] == "b2bhub: 201 alerts opened"
    assert "200 message_failed, 1 plugin_failed" in post["message"]
    digests = session.scalars(select(Notification)).all()
    assert sorted(len(n.alert_ids) for n in digests) == [200, 201]


def test_a_resolved_alert_is_told_to_the_channels_that_ask(api, session, inbox, webhook):
    add_channel(api, "ops-mail", inbox.url, on_resolve=True)
    add_channel(api, "ops-hook", webhook.url)  # openings only
    now = utcnow()
    raise_alert(session, "target_offline", "instance:erp", "erp is offline", None, now)
    session.commit()
    run_notifier(session, now + LATER)
    resolve_alert(session, "target_offline", "instance:erp", now + LATER)
    session.commit()
    run_notifier(session, now + 3 * LATER)
    assert inbox.subjects() == ["b2bhub: target_offline opened: erp is offline",
                                "b2bhub: target_offline resolved: erp is offline"]
    assert [p["title"] for p in webhook.posts] == [
        "b2bhub: target_offline opened: erp is offline"]


def test_channels_through_the_api(app, api, session, inbox):
    bad = api.post("/api/v1/notifications/channels",
                   json={"name": "Bad Name", "url": "nonsense", "kinds": []})
    error = error_of(bad, 400, "invalid")
    assert set(error["details"]) == {"name", "url"}  # every bad field at once
    unknown = api.post("/api/v1/notifications/channels",
                       json={"name": "x", "url": inbox.url, "kinds": ["nope"]})
    assert unknown.status_code in (400, 422) and "kinds" in unknown.text
    secret = "mailto://alice:s3cret@mail.example.com:25?to=ops@example.com&from=hub@example.com"
    shown = add_channel(api, "with-login", secret)
    assert "s3cret" not in json.dumps(shown) and "alice:****@mail.example.com:25" in shown["url"]
    listed = api.get("/api/v1/notifications/channels").json["items"]
    assert [c["name"] for c in listed] == ["with-login"] and "s3cret" not in str(listed)
    error_of(api.post("/api/v1/notifications/channels",
                      json={"name": "with-login", "url": inbox.url}), 409, "conflict")
    add_channel(api, "mail", inbox.url)
    assert api.post("/api/v1/notifications/channels/mail/test").json == {
        "sent": True, "error": None}
    assert inbox.subjects() == ["b2bhub: test notification"]
    inbox.stop()
    down = api.post("/api/v1/notifications/channels/mail/test").json
    assert down["sent"] is False and down["error"]
    assert [n["event"] for n in api.get("/api/v1/notifications").json["items"]] == [
        "test", "test"]
    assert api.delete("/api/v1/notifications/channels/mail").status_code == 204
    error_of(api.delete("/api/v1/notifications/channels/mail"), 404, "not_found")
    operator = token_client(app, session, "operator")
    assert operator.post("/api/v1/notifications/channels",
                         json={"name": "y", "url": inbox.url}).status_code == 403
    lines = session.scalars(select(HistoryLine.text).where(
        HistoryLine.type == "config_changed").order_by(HistoryLine.id)).all()
    assert lines[0].startswith("tests: created notification channel with-login")
    assert "s3cret" not in " ".join(lines)
    assert any("deleted notification channel mail" in line for line in lines)
    assert any("test notification to channel mail: failed" in line for line in lines)


def test_channels_through_the_ui(app, session, inbox):
    from b2bhub.services.users import create_user
    from tests.test_ui import PASSWORD, csrf_token
    create_user(session, "ada", PASSWORD, "admin")
    session.commit()
    ui = app.test_client()
    ui.post("/ui/login", data={"name": "ada", "password": PASSWORD})
    page = ui.get("/ui/system/notifications")
    assert page.status_code == 200 and "No channel yet" in page.text
    token = csrf_token(page.text)
    refused = ui.post("/ui/system/notifications", data={
        "csrf_token": token, "name": "Bad Name", "url": "nonsense"})
    assert refused.status_code == 400
    assert "1-64 of a-z 0-9 _ -" in refused.text and "not a URL Apprise" in refused.text
    assert 'value="Bad Name"' in refused.text  # what was typed is kept
    added = ui.post("/ui/system/notifications", data={
        "csrf_token": token, "name": "ops-mail", "url": inbox.url,
        "kinds": ["message_failed", "delivery_stalled"]}, follow_redirects=True)
    assert "Created notification channel ops-mail" in added.text
    assert "delivery_stalled, message_failed" in added.text
    tested = ui.post("/ui/system/notifications/ops-mail/test", data={"csrf_token": token},
                     follow_redirects=True)
    assert "Sent a test notification to ops-mail" in tested.text
    assert inbox.subjects() == ["b2bhub: test notification"]
    confirm = ui.get("/ui/system/notifications/ops-mail/delete")
    assert "Delete notification channel ops-mail" in confirm.text  # asked first
    unconfirmed = ui.post("/ui/system/notifications/ops-mail/delete",
                          data={"csrf_token": token})
    assert 'name="confirm" value="yes"' in unconfirmed.text  # asked again, not deleted
    assert "ops-mail" in ui.get("/ui/system/notifications").text
    gone = ui.post("/ui/system/notifications/ops-mail/delete",
                   data={"csrf_token": token, "confirm": "yes"}, follow_redirects=True)
    assert "Deleted notification channel ops-mail" in gone.text
    assert "No channel yet" in gone.text
    actors = session.scalars(select(HistoryLine.actor).where(
        HistoryLine.type == "config_changed")).all()
    assert actors == ["ada", "ada", "ada"]


@pytest.mark.processes
def test_with_real_processes_a_failed_delivery_ends_in_an_inbox(
        api, hub, session, procs, inbox, tmp_path):
    """Beat plans and a worker sends: the schedule and the task are wired as deployed."""
    hub.parties()
    hub.instance("inbox", "manual_source")
    record_dir = tmp_path / "attempts"
    record_dir.mkdir()
    hub.instance("writer", "recorder", config={"record_dir": str(record_dir),
                                               "fail_attempts": 9},
                 retry_policy={"strategy": "fixed", "base_delay": 1, "max_attempts": 1})
    hub.route("inbox", "*", "*", "writer")
    add_channel(api, "ops-mail", inbox.url)
    procs.worker()
    procs.beat()
    message = hub.message(filename="order-9.edi")
    wait_until(lambda: inbox.mails, 90, "the alert's mail")
    [mail] = inbox.mails
    assert mail["Subject"].startswith("b2bhub: message_failed opened:")
    assert f"/ui/messages/{message.id}" in mail.get_payload(0).get_payload(
        decode=True).decode()
