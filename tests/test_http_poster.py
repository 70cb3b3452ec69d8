"""The http_poster target through the engine (claim, attempt, settle) against a real HTTP
destination on loopback (:mod:`tests.http_peer`): what each answer does to the delivery
and its history, the headers of every request, the signature, receipts by callback,
authentication, mutual TLS, redirects and the probe."""

from __future__ import annotations

import base64
import re
import socket
from datetime import UTC, timedelta
from email.utils import format_datetime

import pytest
from sqlalchemy import select
from standardwebhooks import Webhook

from b2bhub.engine.machine import receipts
from b2bhub.engine.runner import TargetRunner
from b2bhub.models import Delivery, HistoryLine, Message
from b2bhub.runtime import hub as hub_module
from b2bhub.runtime.hub import new_session
from b2bhub.services import config as svc
from plugins.http_poster import HttpPoster
from tests.enginekit import Clock
from tests.http_peer import Peer, Script, direct_attempt, make_tls, tls_server_context

BODY = b"<order id='1'>\xc3\xa9t\xc3\xa9</order>\n"
SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


@pytest.fixture(autouse=True)
def _http_poster(registry):
    registry.register(HttpPoster)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def peer():
    server = Peer()
    yield server
    server.close()


@pytest.fixture
def poster(hub, peer):
    """Parties, a manual source and an http_poster routed from it; returns a setter
    that configures the poster (``path`` on the peer, config fields, instance fields)."""
    hub.parties()
    hub.instance("inbox", "manual_source")
    routed = []

    def configure(path: str = "/in", url: str | None = None, instance: dict | None = None,
                  **config):
        data = {"name": "poster", "type": "http_poster", **(instance or {}),
                "config": {"url": url or peer.url(path), "timeout": 2, **config}}
        if routed:  # configured again
            row = svc.save_instance(hub.session, hub.registry, data, routed[0])
            hub.session.commit()
            return row
        routed.append(hub.instance(**{"type_": data.pop("type"), **data}))
        hub.route("inbox", "*", "*", "poster")
        return routed[0]
    return configure


def drain(registry, clock) -> None:
    TargetRunner(new_session, registry, hub_module.store(), "test-worker", clock=clock,
                 callbacks=hub_module.callback_tokens()).drain("poster", budget=30)


def the_delivery(session, message) -> Delivery:
    session.expire_all()
    return session.scalar(select(Delivery).where(Delivery.message_id == message.id))


def history(session, message, type_: str = "delivery_changed") -> list[str]:
    session.expire_all()
    return session.scalars(select(HistoryLine.text).where(
        HistoryLine.message_id == message.id, HistoryLine.type == type_)
        .order_by(HistoryLine.id)).all()


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


HTTP_DATE_IN_300_S = "http-date+300"
T = r"in \d+\.\d{3} s"  # the elapsed time in every line

# (case, script, config, delivery state, history line regex, seconds to due_at)
CASES = [
    ("200", Script(200, body=b"thanks"), {}, "delivered",
     rf"poster: attempt 1 delivered: HTTP 200 OK {T}: thanks$", None),
    ("201", Script(201, body=b'{"id": 7}'), {}, "delivered",
     rf'delivered: HTTP 201 Created {T}: {{"id": 7}}$', None),
    ("202", Script(202, body=b""), {}, "delivered",
     rf"delivered: HTTP 202 Accepted {T}$", None),
    ("302", Script(302, {"Location": "https://elsewhere.example/in"}, b""), {}, "failed",
     rf"failed: HTTP 302 Found {T}: redirect to https://elsewhere.example/in not followed",
     None),
    ("400", Script(400, body=b"missing order number"), {}, "failed",
     rf"poster: attempt 1 failed: HTTP 400 Bad Request {T}: missing order number$", None),
    ("404", Script(404, body=b"\xff\xfe no such \x1b endpoint"), {}, "failed",
     rf"failed: HTTP 404 Not Found {T}: \ufffd\ufffd no such \ufffd endpoint$", None),
    ("408", Script(408, body=b"too slow"), {}, "retrying",
     rf"failed: HTTP 408 Request Timeout {T}: too slow; retrying at ", 30),
    ("429", Script(429, body=b"slow down"), {}, "retrying",
     rf"failed: HTTP 429 Too Many Requests {T}: slow down; retrying at ", 30),
    ("429 Retry-After seconds", Script(429, {"Retry-After": "120"}, b""), {}, "retrying",
     rf"failed: HTTP 429 Too Many Requests {T}; retrying at ", 120),
    ("429 Retry-After past the max delay", Script(429, {"Retry-After": "999999"}, b""), {},
     "retrying", rf"failed: HTTP 429 Too Many Requests {T}; retrying at ", 3600),
    ("503 Retry-After date", Script(503, {"Retry-After": HTTP_DATE_IN_300_S}, b"down"), {},
     "retrying", rf"failed: HTTP 503 Service Unavailable {T}: down; retrying at ", 300),
    ("500", Script(500, body=b"Traceback " + b"x" * 5000), {}, "retrying",
     rf"failed: HTTP 500 Internal Server Error {T}: Traceback x{{2038}}\.\.\.; retrying", 30),
    ("425", Script(425, body=b""), {}, "retrying", rf"HTTP 425 Too Early {T}; retrying", 30),
    ("slow body", Script(200, body=b"a slow but complete answer", mode="slow", pieces=4,
                         gap=0.15), {}, "delivered",
     r"delivered: HTTP 200 OK in 0\.[4-9]\d\d s: a slow but complete answer$", None),
    ("timeout", Script(200, delay=2.5), {"timeout": 1}, "retrying",
     r"failed: no answer within 1 s \(after 1\.\d{3} s\); retrying at ", 30),
    ("reset", Script(mode="reset"), {}, "retrying",
     r"failed: connection to 127\.0\.0\.1:\d+ failed: .*(reset|aborted).*; retrying at ", 30),
    ("closed port", None, {}, "retrying",
     r"failed: connection to 127\.0\.0\.1:\d+ failed: .*[Rr]efused.*; retrying at ", 30),
]


@pytest.mark.parametrize("case,script,config,state,line,due", CASES, ids=[c[0] for c in CASES])
def test_each_answer_settles_the_delivery_as_a_user_expects(
        hub, session, registry, clock, peer, poster, case, script, config, state, line, due):
    if script is None:
        poster(url=f"http://127.0.0.1:{closed_port()}/in", **config)
    else:
        if script.headers.get("Retry-After") == HTTP_DATE_IN_300_S:
            when = (clock.now + timedelta(seconds=300)).replace(tzinfo=UTC)
            script.headers["Retry-After"] = format_datetime(when, usegmt=True)
        peer.script("/in", script)
        poster(**config)
    message = hub.message(body=BODY, now=clock())
    drain(registry, clock)

    delivery = the_delivery(session, message)
    lines = history(session, message)
    assert delivery.state == state, lines
    assert re.search(line, lines[-1]), lines[-1]
    assert delivery.attempt == 1
    if due is not None:
        assert abs((delivery.due_at - clock.now).total_seconds() - due) < 1.5
    if script is not None:
        assert len(peer.seen) == 1 and peer.seen[0].body == BODY


RETRIED = [("408", 408, "http_408"), ("425", 425, "http_425"), ("429", 429, "http_429"),
           ("500 by family", 500, "http_5xx"), ("503 by family", 503, "http_5xx"),
           ("504", 504, "http_504")]


@pytest.mark.parametrize("case,status,error_class", RETRIED, ids=[r[0] for r in RETRIED])
def test_retried_answers_carry_their_error_class_for_the_policy(
        hub, session, registry, clock, peer, poster, case, status, error_class):
    """A policy rule that fails that class (or its family) fails the delivery at once."""
    peer.script("/in", Script(status, body=b""))
    poster(instance={"retry_policy": {"rules": [{"match": error_class, "action": "fail"}]}})
    message = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    assert the_delivery(session, message).state == "failed"
    assert history(session, message)[-1].endswith(f"(error class http_{status} is not "
                                                  "retried)")


def test_a_timeout_and_a_connection_failure_have_their_classes(hub, session, registry, clock,
                                                                peer, poster):
    policy = {"rules": [{"match": "timeout", "action": "fail"},
                        {"match": "connection", "action": "fail"}]}
    peer.script("/in", Script(delay=2))
    poster(timeout=0.5, instance={"retry_policy": policy})
    slow = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    poster(url=f"http://127.0.0.1:{closed_port()}/in", instance={"retry_policy": policy})
    refused = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    assert history(session, slow)[-1].endswith("(error class timeout is not retried)")
    assert history(session, refused)[-1].endswith("(error class connection is not retried)")


def test_a_missing_stage_fails_at_once_without_a_request(hub, session, registry, clock, peer,
                                                         poster):
    poster(payload_stage="raw")
    message = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    assert the_delivery(session, message).state == "failed"
    assert history(session, message)[-1].endswith("failed: the message has no 'raw' payload "
                                                  "stage")
    assert peer.seen == []


def test_every_request_carries_the_headers_and_one_idempotency_key_across_retries(
        hub, session, registry, clock, peer, poster):
    peer.script("/in", Script(503, body=b"busy"), Script(200))
    poster(headers={"X-Api-Version": "2"})
    message = hub.message(body=BODY, now=clock(), filename="order1.xml",
                          external_id="<ORD-1@acme>", correlation_id="po-77")
    drain(registry, clock)
    clock.advance(31)
    drain(registry, clock)

    delivery = the_delivery(session, message)
    assert delivery.state == "delivered" and delivery.attempt == 2
    first, second = peer.seen
    for n, seen in enumerate((first, second), 1):
        h = seen.headers
        assert seen.method == "POST" and seen.path == "/in"
        assert h["X-B2BHub-Message-Id"] == str(message.id)
        assert h["X-B2BHub-Source"] == "inbox"
        assert h["X-B2BHub-From"] == "acme" and h["X-B2BHub-To"] == "mycompany"
        assert h["X-B2BHub-Original-Message-Id"] == "<ORD-1@acme>"
        assert h["X-B2BHub-Correlation-Id"] == "po-77"
        assert h["X-Correlation-Id"] == "po-77"
        assert "traceparent" not in h  # traces are off here
        assert h["X-B2BHub-Attempt"] == str(n)
        assert h["X-Api-Version"] == "2"
        assert h["Content-Type"] == "application/xml"
        assert h["Content-Length"] == str(len(BODY)) and seen.body == BODY
        assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", h["Date"])
        assert h["X-B2BHub-Callback-Url"].startswith("http://127.0.0.1:8000/callbacks/")
        assert "webhook-signature" not in h
    key = first.headers["Idempotency-Key"]
    assert re.fullmatch(r"b2bhub-\d+-[0-9a-f]{16}", key)
    assert second.headers["Idempotency-Key"] == key
    # each attempt has a callback URL of its own
    assert first.headers["X-B2BHub-Callback-Url"] != second.headers["X-B2BHub-Callback-Url"]
    # another delivery has another key
    other = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    assert peer.seen[-1].headers["Idempotency-Key"] not in (key, None)
    assert the_delivery(session, other).state == "delivered"


def test_content_type_configured_or_octet_stream(hub, session, registry, clock, peer, poster):
    poster()
    hub.message(body=BODY, now=clock(), filename=None)
    drain(registry, clock)
    poster(content_type="application/edi-x12")
    hub.message(body=BODY, now=clock(), filename="order.xml")
    drain(registry, clock)
    assert [s.headers["Content-Type"] for s in peer.seen] == [
        "application/octet-stream", "application/edi-x12"]


def test_the_standard_webhooks_signature_verifies_with_the_package(hub, session, registry,
                                                                   clock, peer, poster):
    poster(signing_secret=SECRET)
    body = '{"order": "4711", "note": "été"}'.encode()  # the package's verify parses JSON
    hub.message(body=body, now=clock())
    drain(registry, clock)
    seen = peer.seen[0]
    headers = {k.lower(): v for k, v in seen.headers.items()}
    assert headers["webhook-id"] == headers["idempotency-key"]
    # raises if the signature is wrong
    assert Webhook(SECRET).verify(seen.body, headers) == {"order": "4711", "note": "été"}
    from standardwebhooks.webhooks import WebhookVerificationError
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(seen.body + b" ", headers)


def test_the_answer_travels_with_every_outcome(registry, peer):
    """For the business-error rules: status, body start and content type, 2xx too."""
    for status in (200, 404, 503):
        peer.script("/a", Script(status, {"Content-Type": "application/json"},
                                 b'{"status": "rejected"}'))
        outcome = direct_attempt(HttpPoster("p", {"url": peer.url("/a"), "timeout": 2}))
        assert outcome.answer is not None
        assert (outcome.answer.status, outcome.answer.body, outcome.answer.content_type) == (
            status, b'{"status": "rejected"}', "application/json")


# --- receipts by callback ---------------------------------------------------------------

def callback_path(seen) -> str:
    url = seen.headers["X-B2BHub-Callback-Url"]
    assert url.startswith("http://127.0.0.1:8000/callbacks/")
    return url[len("http://127.0.0.1:8000"):]


def test_202_then_callback_delivers_and_a_second_one_is_refused(hub, session, registry, clock,
                                                                peer, poster, client):
    peer.script("/in", Script(202, body=b"queued"))
    poster(accepted_means="awaiting_receipt", receipt_timeout=3600)
    message = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    delivery = the_delivery(session, message)
    assert delivery.state == "awaiting_receipt"
    assert abs((delivery.receipt_deadline - clock.now).total_seconds() - 3600) < 1
    assert "HTTP 202 Accepted" in history(session, message)[-1]
    assert "receipt due by" in history(session, message)[-1]
    path = callback_path(peer.seen[0])

    answer = client.post(path, json={"result": "completed", "text": "booked as 4711"})
    assert answer.status_code == 200, answer.get_json()
    assert the_delivery(session, message).state == "delivered"
    assert session.get(Message, message.id).status == "delivered"
    assert history(session, message, "receipt_received") == [
        "poster: destination callback reported the receipt: completed: booked as 4711"]

    again = client.post(path, json={"result": "failed", "text": "oops"})
    assert again.status_code == 409
    assert again.get_json()["error"]["code"] == "receipt_refused"
    assert the_delivery(session, message).state == "delivered"
    refused = history(session, message, "receipt_refused")
    assert len(refused) == 1 and "oops" in refused[0]


def test_a_failed_callback_fails_the_delivery(hub, session, registry, clock, peer, poster,
                                              client):
    peer.script("/in", Script(202))
    poster(accepted_means="awaiting_receipt")
    message = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    answer = client.post(callback_path(peer.seen[0]),
                         json={"result": "failed", "text": "unknown article 12"})
    assert answer.status_code == 200
    delivery = the_delivery(session, message)
    assert delivery.state == "failed"
    assert "unknown article 12" in delivery.last_result


def test_a_late_callback_is_refused_after_the_deadline_failed_it(hub, session, registry, clock,
                                                                 peer, poster, client):
    peer.script("/in", Script(202))
    poster(accepted_means="awaiting_receipt", receipt_timeout=60)
    message = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    receipts.fail_overdue_receipts(session, clock.now + timedelta(seconds=61), 100)
    session.commit()
    assert the_delivery(session, message).state == "failed"
    assert history(session, message)[-1] == "poster: no receipt within 1m"

    late = client.post(callback_path(peer.seen[0]), json={"result": "completed"})
    assert late.status_code == 409
    assert the_delivery(session, message).state == "failed"
    assert len(history(session, message, "receipt_refused")) == 1


def test_a_wrong_or_earlier_token_is_404_and_changes_nothing(hub, session, registry, clock,
                                                             peer, poster, client):
    peer.script("/in", Script(503), Script(202))
    poster(accepted_means="awaiting_receipt")
    message = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    clock.advance(31)
    drain(registry, clock)
    assert the_delivery(session, message).state == "awaiting_receipt"
    earlier, current = callback_path(peer.seen[0]), callback_path(peer.seen[1])
    forged = current[:-4] + ("AAAA" if not current.endswith("AAAA") else "BBBB")
    other_delivery = re.sub(r"/callbacks/(\d+)\.", lambda m: f"/callbacks/{int(m[1]) + 1}.",
                            current)
    before = len(session.scalars(select(HistoryLine.id).where(
        HistoryLine.message_id == message.id)).all())
    for path in (earlier, forged, other_delivery, "/callbacks/nonsense",
                 "/callbacks/\u00b2.1.x", "/callbacks/" + "9" * 30 + ".1.x"):
        answer = client.post(path, json={"result": "completed"})
        assert answer.status_code == 404, path
        assert answer.get_json()["error"]["code"] == "not_found"
    session.expire_all()
    assert the_delivery(session, message).state == "awaiting_receipt"
    assert len(session.scalars(select(HistoryLine.id).where(
        HistoryLine.message_id == message.id)).all()) == before

    bad = client.post(current, data=b"{not json", content_type="application/json")
    assert bad.status_code == 400 and set(bad.get_json()["error"]) == {"code", "message",
                                                                       "details"}
    wrong = client.post(current, json={"result": "maybe"})
    assert wrong.status_code == 400 and "result" in wrong.get_json()["error"]["details"]
    assert the_delivery(session, message).state == "awaiting_receipt"
    assert client.post(current, json={"result": "completed"}).status_code == 200


# --- authentication, secrets, TLS, redirects -------------------------------------------

def test_basic_and_bearer_reach_the_peer_and_the_secrets_are_never_shown(
        hub, session, registry, clock, peer, poster, api):
    poster(auth="basic", username="hub", password="s3cret pw")
    hub.message(body=BODY, now=clock())
    drain(registry, clock)
    assert peer.seen[-1].headers["Authorization"] == "Basic " + base64.b64encode(
        b"hub:s3cret pw").decode()

    shown = api.get("/api/v1/plugins/configs/poster").get_json()
    assert shown["config"]["password"] == "********"
    assert "s3cret pw" not in api.get("/api/v1/plugins/configs/poster").get_data(as_text=True)

    poster(auth="bearer", token="tok-123", signing_secret=SECRET)
    hub.message(body=BODY, now=clock())
    drain(registry, clock)
    assert peer.seen[-1].headers["Authorization"] == "Bearer tok-123"
    text = api.get("/api/v1/plugins/configs/poster").get_data(as_text=True)
    assert "tok-123" not in text and SECRET not in text


def test_cross_field_problems_are_refused_on_save(api, hub):
    hub.parties()
    answer = api.post("/api/v1/plugins/configs", json={
        "name": "p", "type": "http_poster",
        "config": {"url": "http://127.0.0.1:9/in", "auth": "basic"}})
    assert answer.status_code in (400, 422)
    assert "username" in answer.get_data(as_text=True)
    answer = api.post("/api/v1/plugins/configs", json={
        "name": "p", "type": "http_poster", "config": {"url": "ftp://x/in"}})
    assert answer.status_code in (400, 422) and "url" in answer.get_data(as_text=True)


def test_redirects_fail_by_default_and_are_followed_when_configured(hub, session, registry,
                                                                    clock, peer, poster):
    peer.script("/old", Script(307, {"Location": peer.url("/new")}, b""))
    peer.script("/new", Script(200, body=b"moved here"))
    poster(path="/old", follow_redirects=True)
    message = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    assert the_delivery(session, message).state == "delivered"
    assert history(session, message)[-1].endswith(": moved here")
    assert [s.path for s in peer.seen] == ["/old", "/new"] and peer.seen[1].body == BODY

    poster(path="/old", follow_redirects=False)
    message = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    assert the_delivery(session, message).state == "failed"
    assert f"redirect to {peer.url('/new')} not followed" in history(session, message)[-1]


# --- probe --------------------------------------------------------------------------------

def test_probe(peer):
    assert HttpPoster("p", {"url": peer.url()}).probe() is None
    peer.script("/health", Script(204, body=b""))
    assert HttpPoster("p", {"url": peer.url(), "probe_url": peer.url("/health")}).probe() is True
    assert peer.seen[-1].method == "HEAD"
    peer.script("/health", Script(503, body=b""))
    assert HttpPoster("p", {"url": peer.url(), "probe_url": peer.url("/health"),
                            "probe_method": "GET"}).probe() is False
    assert peer.seen[-1].method == "GET"
    peer.script("/slow", Script(200, delay=2))
    assert HttpPoster("p", {"url": peer.url(), "probe_url": peer.url("/slow"),
                            "timeout": 0.5}).probe() is False
    assert HttpPoster("p", {"url": peer.url(), "timeout": 1, "probe_url":
                            f"http://127.0.0.1:{closed_port()}/"}).probe() is False
    # same authentication as the deliveries
    peer.script("/health", Script(200, body=b""))
    assert HttpPoster("p", {"url": peer.url(), "probe_url": peer.url("/health"),
                            "auth": "bearer", "token": "t0k"}).probe() is True
    assert peer.seen[-1].headers["Authorization"] == "Bearer t0k"


def test_mutual_tls_with_a_client_certificate(hub, session, registry, clock, poster, tmp_path):
    tls = make_tls(tmp_path)
    server = Peer(tls_server_context(tls))
    try:
        poster(url=server.url("/in"), ca_bundle=tls["ca"] + ".pem",
               client_cert=tls["client"] + ".pem", client_key=tls["client"] + ".key")
        message = hub.message(body=BODY, now=clock())
        drain(registry, clock)
        assert the_delivery(session, message).state == "delivered"
        seen = server.seen[0]
        assert seen.body == BODY
        assert dict(part[0] for part in seen.client_cert["subject"])["commonName"] == \
            "hub-client"

        # without the client certificate the destination refuses the handshake
        poster(url=server.url("/in"), ca_bundle=tls["ca"] + ".pem",
               instance={"retry_policy": {"max_attempts": 1}})
        refused = hub.message(body=BODY, now=clock())
        drain(registry, clock)
        assert the_delivery(session, refused).state == "failed"
        assert "connection to localhost:" in history(session, refused)[-1]
        # without the CA bundle the destination's certificate is not trusted
        poster(url=server.url("/in"), client_cert=tls["client"] + ".pem",
               client_key=tls["client"] + ".key",
               instance={"retry_policy": {"max_attempts": 1}})
        untrusted = hub.message(body=BODY, now=clock())
        drain(registry, clock)
        assert "certificate verify failed" in history(session, untrusted)[-1]
        assert len(server.seen) == 1

        # the probe goes through the same TLS settings
        mutual = {"url": server.url("/in"), "probe_url": server.url("/health"),
                  "ca_bundle": tls["ca"] + ".pem", "client_cert": tls["client"] + ".pem",
                  "client_key": tls["client"] + ".key", "timeout": 5}
        assert HttpPoster("p", mutual).probe() is True
        assert server.seen[-1].method == "HEAD" and server.seen[-1].client_cert
        assert HttpPoster("p", {**mutual, "client_cert": "", "client_key": ""}).probe() is False
    finally:
        server.close()


def test_a_payload_changed_in_the_store_is_a_payload_error_not_a_delivery(
        hub, session, registry, clock, peer, poster):
    """The stage's sha256 is checked as it is sent: a changed file fails the attempt."""
    poster(instance={"retry_policy": {"max_attempts": 1}})
    message = hub.message(body=BODY, now=clock())
    path = hub.store.path(message.sha256)
    path.chmod(0o644)
    path.write_bytes(BODY.replace(b"1", b"2"))  # same size, other bytes
    drain(registry, clock)
    assert the_delivery(session, message).state == "failed"
    assert "could not read the payload" in history(session, message)[-1]


# --- business-error rules on the http_poster's answers ------------------------------------

@pytest.mark.parametrize("rule, answer, matched", [
    ({"name": "by-status", "status": 200}, b'{"ok": true}', "200"),
    ({"name": "by-regex", "body_regex": r"REJECTED: \w+"}, b"REJECTED: duplicate order",
     "REJECTED: duplicate"),
    ({"name": "by-json-path", "status": "2xx", "json_path": "$.result.code",
      "json_value": "E42"}, b'{"result": {"code": "E42", "text": "unknown GTIN"}}', "E42"),
])
def test_a_business_rule_fails_a_200_answer_of_the_http_poster(
        poster, peer, hub, session, registry, clock, rule, answer, matched):
    """The http_poster hands its answer to the instance's rules: a 200 that a rule
    matches ends Failed (business) with the rule's name and the matched text, no retry,
    the message in Business error with its alert."""
    poster(instance={"business_rules": [rule]})
    peer.script("/in", Script(200, body=answer, headers={"Content-Type": "application/json"}))
    message = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    delivery = the_delivery(session, message)
    assert (delivery.state, delivery.failure_kind, delivery.attempt) == (
        "failed", "business", 1)
    [line] = session.scalars(select(HistoryLine.text).where(
        HistoryLine.delivery_id == delivery.id, HistoryLine.text.contains("business rule")))
    assert f"failed by business rule {rule['name']}" in line and matched in line
    assert session.get(Message, message.id).status == "business_error"
    assert len(peer.seen) == 1  # no retry: retrying returns the same error
    clock.advance(3600)
    drain(registry, clock)
    assert len(peer.seen) == 1


def test_an_answer_no_rule_matches_is_delivered(poster, peer, hub, session, registry, clock):
    poster(instance={"business_rules": [{"name": "rejected", "json_path": "$.status",
                                         "json_value": "ERR"}]})
    peer.script("/in", Script(200, body=b'{"status": "OK"}'))
    message = hub.message(body=BODY, now=clock())
    drain(registry, clock)
    assert the_delivery(session, message).state == "delivered"


def test_the_peer_counts_only_what_comes_under_its_own_prefix(peer):
    """A request to the peer's port but not under its prefix (a worker of another test
    still retrying to the peer that had this port before) is answered 404 and not
    counted as what this test's hub sent."""
    import requests

    answer = requests.post(f"http://127.0.0.1:{peer.port}/in", data=BODY, timeout=5)
    assert answer.status_code == 404
    assert peer.seen == [] and peer.strays == ["POST /in"]
    assert requests.post(peer.url("/in"), data=BODY, timeout=5).status_code == 200
    assert [(s.method, s.path, s.body) for s in peer.seen] == [("POST", "/in", BODY)]
