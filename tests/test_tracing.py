"""Correlation ids and OpenTelemetry traces (b2bhub.observability.tracing).

A message sent through the REST API of a real gunicorn web process is delivered by a
real worker to a loopback destination, with both processes exporting their spans to one
file (``OTEL_TRACES_EXPORTER=b2bhub_file``): the web's request span, the dispatch span,
the worker's claim and attempt spans and its outgoing request are one trace, whose id
the message page and the API show and whose ``traceparent`` the destination received.
Without the variables nothing of OpenTelemetry is even imported.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from sqlalchemy import select

from b2bhub.models import Delivery, Message
from b2bhub.observability import tracing
from plugins.http_poster import HttpPoster
from tests.http_peer import Peer
from tests.procs import ROOT, wait_until

PASSWORD = "correct horse battery"


@pytest.fixture
def peer():
    server = Peer()
    yield server
    server.close()


def spans_of(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def login(web_url: str) -> requests.Session:
    ui = requests.Session()
    page = ui.get(f"{web_url}/ui/login", timeout=10).text
    token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', page).group(1)
    answer = ui.post(f"{web_url}/ui/login", timeout=10, allow_redirects=False,
                     data={"name": "ada", "password": PASSWORD, "csrf_token": token})
    assert answer.status_code == 302, answer.text
    return ui


@pytest.mark.processes
def test_one_trace_from_the_web_request_to_the_worker_attempt(procs, app, session, hub,
                                                              registry, peer, tmp_path):
    from b2bhub.services.tokens import create_token
    from b2bhub.services.users import create_user

    registry.register(HttpPoster)
    hub.parties()
    hub.instance("poster", "http_poster", config={"url": peer.url("/in")})
    token = create_token(session, "tests", "admin")
    create_user(session, "ada", PASSWORD, "viewer")
    session.commit()
    spans_file = tmp_path / "spans.jsonl"
    otel = {"OTEL_TRACES_EXPORTER": "b2bhub_file",
            "OTEL_EXPORTER_B2BHUB_FILE": str(spans_file), "OTEL_BSP_SCHEDULE_DELAY": "100"}
    web = procs.web(extra_env=otel)
    worker = procs.worker(extra_env=otel)

    answer = requests.post(f"{web.url}/api/v1/messages", timeout=30,
                           headers={"Authorization": f"Bearer {token}"},
                           data={"from": "mycompany", "to": "acme", "target": "poster"},
                           files={"file": ("order.xml", b"<order id='7'/>")})
    assert answer.status_code == 201, answer.text
    message_id = answer.json()["id"]
    wait_until(lambda: session.scalar(select(Delivery.state).where(
        Delivery.message_id == message_id).execution_options(populate_existing=True))
        == "delivered", 60, "delivered")

    def all_spans():
        # every span asserted below: the wake-up task's span ends (and is exported)
        # after the attempt's, which it holds
        found = spans_of(spans_file)
        names = {(s["pid"], s["name"]) for s in found}
        return found if {(worker.pid, "attempt"), (worker.pid, "claim"),
                         (worker.pid, "run/b2bhub.deliver")} <= names and any(
            s["name"] == "dispatch" and s["pid"] != worker.pid for s in found) else None

    spans = wait_until(all_spans, 30, "the web's and the worker's spans exported")
    session.expire_all()
    message = session.get(Message, message_id)
    trace_id = tracing.trace_id(message.trace_parent)
    assert trace_id is not None, message.trace_parent
    mine = [s for s in spans if s["trace_id"] == trace_id]
    by_name = {}
    for s in mine:
        by_name.setdefault(s["name"], []).append(s)
    # the web process: Flask's server span of the request, our dispatch inside it
    [server] = [s for s in mine if s["kind"] == "SERVER"]
    assert server["pid"] != worker.pid and server["service"] == "b2bhub-web"
    assert "/api/v1/messages" in json.dumps(server)
    [dispatch] = by_name["dispatch"]
    assert dispatch["parent_id"] == server["span_id"]
    assert message_id in dispatch["attributes"]["b2bhub.message_ids"]
    # the worker process: the attempt, a child of the dispatch through the message row,
    # and the requests instrumentation's client span inside it
    [attempt] = by_name["attempt"]
    assert attempt["pid"] == worker.pid and attempt["service"] == "b2bhub-worker"
    assert attempt["parent_id"] == dispatch["span_id"]
    assert attempt["attributes"]["b2bhub.message_id"] == message_id
    assert attempt["attributes"]["b2bhub.outcome"] == "delivered"
    [client] = [s for s in mine if s["kind"] == "CLIENT"]
    assert client["pid"] == worker.pid and client["parent_id"] == attempt["span_id"]
    # the Celery instrumentation's span of the wake-up task, and our claim inside it
    tasks = {s["span_id"]: s for s in spans if s["pid"] == worker.pid
             and s["name"] == "run/b2bhub.deliver"}
    assert tasks, sorted({s["name"] for s in spans if s["pid"] == worker.pid})
    assert any(s["name"] == "claim" and s["parent_id"] in tasks
               and s["attributes"].get("b2bhub.target") == "poster"
               and s["attributes"].get("b2bhub.claimed") == 1 for s in spans)
    # the destination got the attempt's traceparent: the same trace
    [seen] = peer.seen
    assert seen.headers["traceparent"].split("-")[1] == trace_id
    # the message page and the API show the trace id
    page = login(web.url).get(f"{web.url}/ui/messages/{message_id}", timeout=10).text
    assert f'<code id="trace-id">{trace_id}</code>' in page
    api = requests.get(f"{web.url}/api/v1/messages/{message_id}", timeout=10,
                       headers={"Authorization": f"Bearer {token}"}).json()
    assert api["trace_id"] == trace_id


def test_without_the_variables_nothing_of_opentelemetry_is_imported(tmp_path):
    code = ("import sys\n"
            "from b2bhub import create_app\n"
            "app = create_app({'DATA_DIR': sys.argv[1], "
            "'SQLALCHEMY_DATABASE_URI': 'sqlite://'})\n"
            "from b2bhub.observability import tracing\n"
            "assert not tracing.enabled() and tracing.traceparent() is None\n"
            "with tracing.span('dispatch') as s:\n"
            "    assert s is None\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    env = {k: v for k, v in __import__("os").environ.items()
           if not k.startswith(("OTEL_", "B2BHUB_"))}
    env["OTEL_TRACES_EXPORTER"] = "none"
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_an_unknown_exporter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "no_such_exporter")
    with pytest.raises(RuntimeError, match="no_such_exporter"):
        tracing._exporters()


@pytest.mark.parametrize(("value", "expected"), [
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
     "4bf92f3577b34da6a3ce929d0e0e4736"),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
    ("garbage", None), (None, None), ("00-xyz-00f067aa0ba902b7-01", None)])
def test_trace_id_of_a_traceparent(value, expected):
    assert tracing.trace_id(value) == expected


def test_messages_filter_on_the_correlation_id(api, hub, session):
    hub.parties()
    hub.instance("inbox", "manual_source")
    first = hub.message(filename="a.edi", correlation_id="PO-1")
    hub.message(filename="b.edi", correlation_id="PO-2")
    hub.message(filename="c.edi")
    found = api.get("/api/v1/messages?correlation_id=PO-1").get_json()
    assert [m["id"] for m in found["items"]] == [first.id]
    assert found["items"][0]["correlation_id"] == "PO-1"
    assert found["items"][0]["trace_id"] is None  # stored while traces were off
