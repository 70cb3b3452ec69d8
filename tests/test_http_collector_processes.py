"""http_collector in real processes (issue 16, "Must show"): beat schedules the scans, a
worker fetches a loopback server's document whose ETag changes and a ``file_writer``
writes each version out byte-identical, one message per change; then the server fails:
one Collection error message, its ``message_failed`` alert, and the alert posted to a
webhook channel as a failed delivery's is; the server back ends the episode."""

from __future__ import annotations

import os

import pytest
from sqlalchemy import select

from b2bhub.models import Alert, Delivery, HistoryLine, Message, utcnow
from b2bhub.services.notifications import create_channel
from plugins.file_writer import FileWriter
from plugins.http_collector import HttpCollector
from tests.procs import wait_until
from tests.test_http_collector import Document, serve
from tests.test_notifications import Webhook

pytestmark = pytest.mark.processes


@pytest.fixture
def servers():
    """The collected document's server and a webhook channel's sink, on loopback."""
    doc, hook = Document(), Webhook()
    server = serve(doc)
    yield doc, hook
    server.shutdown()
    hook.server.shutdown()


def messages(session, status: str | None = None) -> list[Message]:
    session.expire_all()
    query = select(Message).order_by(Message.id)
    if status is not None:
        query = query.where(Message.status == status)
    return list(session.scalars(query))


def delivered(session) -> int:
    session.expire_all()
    return len(session.scalars(select(Delivery.id).where(
        Delivery.state == "delivered")).all())


def line_types(session, message_id: int) -> list[str]:
    session.expire_all()
    return list(session.scalars(select(HistoryLine.type).where(
        HistoryLine.message_id == message_id).order_by(HistoryLine.id)))


def test_one_message_per_change_then_a_failing_server_is_a_collection_error(
        procs, hub, session, registry, servers, tmp_path):
    document, webhook = servers
    registry.register(HttpCollector)
    registry.register(FileWriter)
    out = tmp_path / "out"
    hub.parties(organizations=("mycompany",), partners=("acme",))
    hub.instance("collect", "http_collector", config={
        "url": document.url, "from": "acme", "to": "mycompany", "polling_interval": 1,
        "timeout": 5})
    hub.instance("writer", "file_writer", config={
        "base_directory": str(out), "filename_pattern": "{message_id}-{original_filename}"})
    hub.route("collect", "*", "*", "writer")
    create_channel(session, {"name": "ops-hook", "url": webhook.url,
                             "kinds": ["message_failed"]}, "tests", utcnow())
    session.commit()
    versions = [b"<orders n='1'/>", os.urandom(200 * 1024), b"<orders n='3'>\r\n\x00</orders>"]
    document.body = versions[0]
    procs.worker()
    procs.beat()

    for number, body in enumerate(versions, 1):
        if number > 1:
            document.change(body)
        wait_until(lambda n=number: delivered(session) == n, 60, f"version {number} delivered")
    polls = len(document.seen)
    wait_until(lambda: len(document.seen) >= polls + 3, 30, "three more polls")
    made = messages(session)
    assert len(made) == 3 and delivered(session) == 3  # unchanged answers made none
    written = sorted(out.iterdir(), key=lambda p: int(p.name.split("-")[0]))
    assert [p.name for p in written] == [f"{m.id}-orders.xml" for m in made]
    assert [p.read_bytes() for p in written] == versions
    assert any(seen.get("If-None-Match") == '"v3"' for seen in document.seen)

    document.status = 500
    wait_until(lambda: messages(session, "collection_error"), 60, "a collection error")
    failing = len(document.seen)
    wait_until(lambda: len(document.seen) >= failing + 3, 30, "three more failed polls")
    [error] = messages(session, "collection_error")
    assert error.status_text.startswith(
        f"GET {document.url} answered 500 INTERNAL SERVER ERROR: down for maintenance")
    assert "failed fetches since" in error.status_text  # counted, not a message a poll
    assert (error.source, error.from_party, error.to_party, error.sha256) == (
        "collect", "acme", "mycompany", None)
    assert error.deliveries == [] and error.payloads == []
    assert len(messages(session)) == 4
    [alert] = session.scalars(select(Alert).where(Alert.kind == "message_failed")).all()
    assert (alert.message_id, alert.resolved_at) == (error.id, None)
    wait_until(lambda: webhook.posts, 60, "the alert posted to the webhook")
    [post] = webhook.posts
    assert post["title"].startswith("b2bhub: message_failed opened:")
    assert alert.text in post["message"] and f"/ui/messages/{error.id}" in post["message"]

    document.status = 200  # back: the episode ends, the alert is resolved
    wait_until(lambda: "collection_recovered" in line_types(session, error.id), 60,
               "the episode ended")
    session.expire_all()
    assert session.get(Alert, alert.id).resolved_at is not None
    assert len(messages(session)) == 4 and delivered(session) == 3
