"""The http_receiver source at ``POST /in/<instance>``, the hub served on a loopback port
in a thread (werkzeug's server) and a real HTTP destination (:mod:`tests.http_peer`)
behind an ``http_poster`` for sync mode: tokens, async and sync intake, Idempotency-Key
and the refusals that store nothing."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests
from click.testing import CliRunner
from flask import request
from sqlalchemy import select, update

from b2bhub.config.environment import PRODUCT
from b2bhub.engine.runner import TargetRunner
from b2bhub.models import Delivery, HistoryLine, Message, Payload, PluginInstance, utcnow
from b2bhub.runtime import hub as hub_module
from b2bhub.runtime.hub import new_session
from plugins.http_poster import HttpPoster
from plugins.http_receiver import HttpReceiver, IdempotencyKey, create_token
from tests import test_http_poster
from tests.enginekit import counted_statements
from tests.http_peer import Script
from tests.procs import wait_until

peer = test_http_poster.peer  # the destination
BODY = b"<order id='7'>\xc3\xa9t\xc3\xa9</order>\n" * 50


@pytest.fixture(autouse=True)
def _types(registry):
    registry.register(HttpReceiver)
    registry.register(HttpPoster)


@pytest.fixture
def receiver(hub, session, peer):
    """Parties, an http_poster to the peer, an async receiver ``inbox`` routed to it and
    a sync receiver ``direct`` targeting it; returns the tokens by instance."""
    return set_up_receivers(hub, session, peer.url("/in"), timeout=1, base_delay=30)


def set_up_receivers(hub, session, url: str, timeout: float, base_delay: int) -> dict:
    """Parties, an http_poster ``poster`` to ``url``, the async receiver ``inbox`` routed
    to it and the sync receiver ``direct`` targeting it, a token each (by instance)."""
    hub.parties()
    hub.instance("poster", "http_poster", config={"url": url, "timeout": timeout},
                 retry_policy={"strategy": "fixed", "base_delay": base_delay,
                               "max_attempts": 3})
    hub.instance("inbox", "http_receiver", config={"from_party": "acme",
                                                    "to_party": "mycompany"})
    hub.instance("direct", "http_receiver", config={"mode": "sync", "target": "poster",
                                                     "from_party": "acme",
                                                     "to_party": "mycompany"})
    hub.route("inbox", "*", "*", "poster")
    tokens = {name: create_token(session, name, "client", "tests")
              for name in ("inbox", "direct")}
    session.commit()
    return tokens


def auth(token: str, **headers) -> dict:
    return {"Authorization": f"Bearer {token}", **headers}


def messages(session) -> list[Message]:
    session.expire_all()
    return session.scalars(select(Message).order_by(Message.id)).all()


def stored_files(app) -> list[Path]:
    root = Path(app.config["PAYLOAD_DIR"])
    return [p for p in root.rglob("*") if p.is_file() and p.name != "store.lock"] \
        if root.exists() else []


def lines(session, message_id: int) -> list[HistoryLine]:
    session.expire_all()
    return session.scalars(select(HistoryLine).where(HistoryLine.message_id == message_id)
                           .order_by(HistoryLine.id)).all()


def test_async_intake_stores_what_came_and_answers_202(served, receiver, session, app):
    answer = requests.post(f"{served}/in/inbox", data=BODY, headers=auth(
        receiver["inbox"], **{
            "Content-Disposition": 'attachment; filename="order-7.xml"',
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "X-B2BHub-Sequence-Key": "orders-acme"}), timeout=10)
    assert answer.status_code == 202, answer.text
    found = answer.json()
    [message] = messages(session)
    assert found["message_id"] == message.id
    assert answer.headers["Location"] == f"/api/v1/messages/{message.id}"
    assert (message.source, message.from_party, message.to_party) == (
        "inbox", "acme", "mycompany")
    assert message.original_filename == "order-7.xml"
    assert message.correlation_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert message.sequence_key == "orders-acme"
    assert message.sha256 == hashlib.sha256(BODY).hexdigest()
    payload = session.scalar(select(Payload).where(Payload.message_id == message.id))
    assert hub_module.store().open(payload.digest).read() == BODY
    # headers name the parties and the file; X-Correlation-Id wins over traceparent
    answer = requests.post(f"{served}/in/inbox", data=b"x", headers=auth(
        receiver["inbox"], **{"X-B2BHub-From": "mycompany", "X-B2BHub-To": "acme",
                              "X-B2BHub-Filename": "a.edi", "X-Correlation-Id": "c-1"}),
        timeout=10)
    assert answer.status_code == 202
    last = messages(session)[-1]
    assert (last.from_party, last.to_party, last.original_filename, last.correlation_id) \
        == ("mycompany", "acme", "a.edi", "c-1")


def test_an_intake_opens_no_ui_session(served, receiver, session, app):
    """The endpoints authenticate by protocol: a request there reads, checks and writes
    back no UI session cookie, so its answer does not vary by one (``Vary: Cookie`` is
    what Flask adds once a request's session was looked at) and sets none; the UI's
    pages still do."""
    login = requests.get(f"{served}/ui/login", timeout=10)
    assert login.status_code == 200, login.status_code
    assert "Cookie" in login.headers.get("Vary", "")
    # a valid session cookie of this app, which the intake is sent and leaves alone
    signed = app.session_interface.get_signing_serializer(app).dumps({"seen": 1})
    cookie = {app.config["SESSION_COOKIE_NAME"]: signed}
    answer = requests.post(f"{served}/in/inbox", data=BODY, cookies=cookie,
                           headers=auth(receiver["inbox"]), timeout=10)
    assert answer.status_code == 202, answer.text
    assert "Cookie" not in answer.headers.get("Vary", "")
    assert "Set-Cookie" not in answer.headers
    assert len(messages(session)) == 1


def test_an_intake_is_answered_before_flasks_request_handling(served, receiver, app):
    """``POST /<prefix>/<instance>`` is answered by the endpoint itself, without Flask's
    request dispatch (no ``before_request`` hook runs for it: the API's and the UI's
    hooks have nothing to do there); every other request, a GET of the same URL
    included, still goes through Flask. The answer names b2bhub as its server."""
    seen: list[tuple[str, str]] = []
    app.before_request(lambda: seen.append((request.method, request.path)) and None)
    answer = requests.post(f"{served}/in/inbox", data=BODY, headers=auth(receiver["inbox"]),
                           timeout=10)
    assert answer.status_code == 202, answer.text
    assert PRODUCT in answer.headers["Server"].split(", ")  # (Werkzeug names itself too)
    assert seen == []
    assert requests.get(f"{served}/in/inbox", timeout=10).status_code == 405
    assert requests.post(f"{served}/in/inbox/", data=BODY, timeout=10).status_code == 404
    assert requests.post(f"{served}/nosuchprefix/inbox", data=BODY,
                         timeout=10).status_code == 404
    assert seen == [("GET", "/in/inbox"), ("POST", "/in/inbox/"),
                    ("POST", "/nosuchprefix/inbox")]


def test_async_message_reaches_the_destination_byte_identical(served, receiver, session,
                                                              peer):
    answer = requests.post(f"{served}/in/inbox", data=BODY, headers=auth(receiver["inbox"]),
                           timeout=10)
    assert answer.status_code == 202
    TargetRunner(new_session, hub_module.registry(), hub_module.store(), "w").drain(
        "poster", budget=10)
    assert [s.sha256 for s in peer.seen] == [hashlib.sha256(BODY).hexdigest()]
    assert messages(session)[0].status == "delivered"


def test_the_rows_of_an_intake_go_in_atomically(served, receiver, session, hub):
    """A routed message's rows are one statement: on PostgreSQL it runs, like the
    lookups before it, outside a transaction (no BEGIN, no COMMIT). A message no route
    matches is Not routed, its status, line and alert written with its rows in one
    transaction, on either database."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    hub.instance("loose", "http_receiver", config={"from_party": "acme",
                                                    "to_party": "mycompany"})
    loose = create_token(session, "loose", "client", "tests")
    session.commit()
    seen: list[tuple[str, bool]] = []

    def before(conn, cursor, statement, params, context, executemany):
        alone = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
        seen.append((statement.split()[0].upper(), alone))

    postgres = session.get_bind().dialect.name == "postgresql"
    warm = requests.post(f"{served}/in/inbox", data=b"x", headers=auth(receiver["inbox"]),
                         timeout=10)  # the route table read once
    assert warm.status_code == 202
    event.listen(Engine, "before_cursor_execute", before)
    try:
        routed = requests.post(f"{served}/in/inbox", data=BODY,
                               headers=auth(receiver["inbox"]), timeout=10)
        of_routed, seen[:] = list(seen), []
        unrouted = requests.post(f"{served}/in/loose", data=BODY, headers=auth(loose),
                                 timeout=10)
    finally:
        event.remove(Engine, "before_cursor_execute", before)
    assert routed.status_code == unrouted.status_code == 202
    if postgres:
        assert of_routed == [("SELECT", True), ("WITH", True)]
    else:
        assert not any(alone for _word, alone in of_routed), of_routed
    writes = [(word, alone) for word, alone in seen if word in ("WITH", "INSERT", "UPDATE")]
    assert len(writes) > 1 and not any(alone for _word, alone in writes), seen
    _warm, first, second = messages(session)
    assert (first.status, second.status) == ("received", "not_routed")
    assert [line.type for line in lines(session, second.id)] == [
        "received", "not_routed", "status_changed"]
    assert session.scalar(select(Delivery.id).where(Delivery.message_id == second.id)) is None


@pytest.mark.parametrize("headers, why", [
    ({}, "no token"),
    ({"Authorization": "Bearer b2bin_wrong"}, "wrong token"),
    ({"Authorization": "Basic dXNlcjpwdw=="}, "not a bearer token"),
])
def test_no_or_wrong_token_is_401_and_stores_nothing(served, receiver, session, app,
                                                     headers, why):
    answer = requests.post(f"{served}/in/inbox", data=BODY, headers=headers, timeout=10)
    assert answer.status_code == 401, why
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    # a token of another instance is no token of this one
    other = requests.post(f"{served}/in/inbox", data=BODY,
                          headers=auth(receiver["direct"]), timeout=10)
    assert other.status_code == 401
    assert messages(session) == [] and stored_files(app) == []


def test_unknown_disabled_instance_and_unknown_party_store_nothing(served, receiver,
                                                                   session, app, hub):
    token = receiver["inbox"]
    assert requests.post(f"{served}/in/nowhere", data=BODY, headers=auth(token),
                         timeout=10).status_code == 404
    session.execute(update(PluginInstance).where(PluginInstance.name == "inbox")
                    .values(enabled=False))
    session.commit()
    disabled = requests.post(f"{served}/in/inbox", data=BODY, headers=auth(token), timeout=10)
    assert disabled.status_code == 404 and "no enabled HTTP receiver" in disabled.text
    session.execute(update(PluginInstance).where(PluginInstance.name == "inbox")
                    .values(enabled=True))
    session.commit()
    unknown = requests.post(f"{served}/in/inbox", data=BODY, timeout=10,
                            headers=auth(token, **{"X-B2BHub-From": "ghost"}))
    assert unknown.status_code == 422 and "ghost" in unknown.json()["error"]
    assert messages(session) == [] and stored_files(app) == []


def test_oversize_is_413_by_length_and_while_streaming(served, receiver, session, app, hub):
    session.execute(update(PluginInstance).where(PluginInstance.name == "inbox")
                    .values(config={"from_party": "acme", "to_party": "mycompany",
                                    "max_size": 1000}))
    session.commit()
    token = receiver["inbox"]
    by_length = requests.post(f"{served}/in/inbox", data=b"x" * 1001, headers=auth(token),
                              timeout=10)
    assert by_length.status_code == 413
    chunked = requests.post(f"{served}/in/inbox", data=iter([b"x" * 600, b"y" * 600]),
                            headers=auth(token), timeout=10)
    assert chunked.status_code == 413 and "nothing was stored" in chunked.text
    assert messages(session) == [] and stored_files(app) == []
    fits = requests.post(f"{served}/in/inbox", data=iter([b"x" * 500, b"y" * 500]),
                         headers=auth(token), timeout=10)
    assert fits.status_code == 202


def _raw(served: str, head: bytes, body: bytes, close: bool = True) -> bytes:
    url = urlparse(served)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(head + body)
        if close:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_a_truncated_chunked_body_and_a_client_gone_mid_body_store_nothing(
        served, receiver, session, app):
    head = (b"POST /in/inbox HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + receiver["inbox"].encode())
    chunked = _raw(served, head + b"\r\nTransfer-Encoding: chunked\r\n\r\n",
                   b"400\r\n" + b"a" * 1024 + b"\r\n400\r\n" + b"b" * 100)
    assert chunked.split(b" ", 2)[1] in (b"400", b"503"), chunked[:200]
    short = _raw(served, head + b"\r\nContent-Length: 5000\r\n\r\n", b"c" * 1000)
    assert short.split(b" ", 2)[1] in (b"400", b"503"), short[:200]
    assert messages(session) == [] and stored_files(app) == []


def test_tokens_by_api_and_command_line_named_hashed_and_revoked(served, receiver, session,
                                                                 api, app):
    made = api.post("/api/v1/plugins/configs/inbox/tokens", json={"name": "erp"})
    assert made.status_code == 201, made.json
    token = made.json["token"]
    from plugins.http_receiver import IntakeToken
    row = session.scalar(select(IntakeToken).where(IntakeToken.name == "erp"))
    assert row.token_sha256 == hashlib.sha256(token.encode()).hexdigest()
    assert token not in json.dumps(api.get("/api/v1/plugins/configs/inbox/tokens").json)
    assert api.post("/api/v1/plugins/configs/inbox/tokens",
                    json={"name": "erp"}).status_code == 409
    assert requests.post(f"{served}/in/inbox", data=b"a", headers=auth(token),
                         timeout=10).status_code == 202
    assert api.delete("/api/v1/plugins/configs/inbox/tokens/erp").status_code == 204
    assert requests.post(f"{served}/in/inbox", data=b"a", headers=auth(token),
                         timeout=10).status_code == 401
    # the older token of the instance still works: one rotated, the other kept
    assert requests.post(f"{served}/in/inbox", data=b"a", headers=auth(receiver["inbox"]),
                         timeout=10).status_code == 202
    lines_ = session.scalars(select(HistoryLine.text).where(
        HistoryLine.type == "config_changed")).all()
    assert any("created intake token 'erp'" in t for t in lines_)
    assert any("revoked intake token 'erp'" in t for t in lines_)


def test_cli_token_for_an_instance(app, receiver, session):
    from flask.cli import ScriptInfo

    from b2bhub.cli import main
    cli = CliRunner()

    class runner:  # the real ``b2bhub`` command group on this test's app
        @staticmethod
        def invoke(args):
            return cli.invoke(main, args, obj=ScriptInfo(create_app=lambda: app))

    made = runner.invoke(args=["token", "create", "batch", "--instance", "inbox"])
    assert made.exit_code == 0, made.output
    token = made.output.strip()
    assert token.startswith("b2bin_")
    from plugins.http_receiver import IntakeToken
    session.expire_all()
    assert session.scalar(select(IntakeToken.token_sha256).where(
        IntakeToken.name == "batch")) == hashlib.sha256(token.encode()).hexdigest()
    missing = runner.invoke(args=["token", "create", "x", "--instance", "nowhere"])
    assert missing.exit_code != 0 and "nowhere" in missing.output
    gone = runner.invoke(args=["token", "revoke", "batch", "--instance", "inbox"])
    assert gone.exit_code == 0, gone.output
    session.expire_all()
    assert session.scalar(select(IntakeToken.id).where(IntakeToken.name == "batch")) is None


# --- sync mode ------------------------------------------------------------------------

def test_sync_delivered_answers_200_with_the_destinations_answer(served, receiver, session,
                                                                 peer):
    peer.script("/in", Script(200, body=b'{"accepted": true}'))
    answer = requests.post(f"{served}/in/direct", data=BODY, headers=auth(receiver["direct"]),
                           timeout=30)
    assert answer.status_code == 200, answer.text
    found = answer.json()
    assert found["outcome"] == "delivered" and found["attempts"] == 1
    assert found["destination"] == {"status": 200, "body": '{"accepted": true}'}
    assert [s.sha256 for s in peer.seen] == [hashlib.sha256(BODY).hexdigest()]
    [message] = messages(session)
    assert message.status == "delivered"


def test_sync_delivered_in_the_request_wakes_no_worker(served, receiver, session, peer,
                                                       wakeups, app):
    """Delivered inside the request: nothing is left for a worker, so no wake-up goes out,
    and the request sends only the statements of the intake, the claim and the
    settlement (nothing read back that the request knows)."""
    peer.script("/in", Script(200), Script(200), Script(202))
    requests.post(f"{served}/in/direct", data=BODY, headers=auth(receiver["direct"]),
                  timeout=30)  # warm: the process's runner and plugin
    engine = app.extensions["sqlalchemy"].engines[None]
    with counted_statements(engine) as seen:
        answer = requests.post(f"{served}/in/direct", data=BODY,
                               headers=auth(receiver["direct"]), timeout=30)
    assert answer.status_code == 200, answer.text
    # intake 2 (PostgreSQL: the lookups, then every row in one statement) or 5; claim 4
    # or 5 (target row, claim, message status read and written with the lines: on
    # PostgreSQL the lock and the read are one call, on SQLite the status UPDATE is a
    # statement of its own); the message read 1; settlement 3 or 4 (the fenced UPDATE,
    # then the same status read and write)
    assert sum(seen.values()) == (10 if engine.dialect.name == "postgresql" else 15), seen
    queued = requests.post(f"{served}/in/inbox", data=BODY, headers=auth(receiver["inbox"]),
                           timeout=30)  # an async intake's wake-up, published as before
    wait_until(lambda: wakeups, 10, "the async intake's wake-up")
    time.sleep(0.3)  # the sync answers' after-answer steps are done by now too
    [(_delivery, target)] = wakeups
    assert target == "poster" and queued.status_code == 202
    assert [m.status for m in messages(session)] == ["delivered", "delivered", "received"]


def test_sync_business_error_is_422_naming_the_rule_after_one_attempt(served, receiver,
                                                                      session, peer, hub):
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "poster"))
    row.business_rules = [{"name": "rejected", "status": "2xx", "json_path": "$.status",
                           "json_value": "REJECTED"}]
    row.updated_at = utcnow()
    session.commit()
    peer.script("/in", Script(200, body=b'{"status": "REJECTED"}'))
    answer = requests.post(f"{served}/in/direct", data=BODY, headers=auth(receiver["direct"]),
                           timeout=30)
    assert answer.status_code == 422, answer.text
    assert answer.json()["rule"] == "rejected" and answer.json()["attempts"] == 1
    assert len(peer.seen) == 1


def test_sync_technical_failure_three_attempts_a_second_apart_then_async(
        served, receiver, session, peer):
    peer.script("/in", Script(503), Script(503), Script(503), Script(200))
    answer = requests.post(f"{served}/in/direct", data=BODY, headers=auth(receiver["direct"]),
                           timeout=30)
    assert answer.status_code == 502, answer.text
    assert answer.json()["attempts"] == 3 and answer.json()["state"] == "retrying"
    [message] = messages(session)
    started = [line.created_at for line in lines(session, message.id)
               if line.type == "delivery_changed" and "started" in line.text]
    assert len(started) == 3
    gaps = [(b - a).total_seconds() for a, b in zip(started, started[1:], strict=False)]
    assert all(0.95 <= gap <= 2.5 for gap in gaps), gaps
    delivery = session.scalar(select(Delivery).where(Delivery.message_id == message.id))
    assert delivery.state == "retrying"
    # the asynchronous path delivers it when it is due
    session.execute(update(Delivery).where(Delivery.id == delivery.id)
                    .values(due_at=utcnow() - timedelta(seconds=1)))
    session.commit()
    TargetRunner(new_session, hub_module.registry(), hub_module.store(), "w").drain(
        "poster", budget=10)
    session.expire_all()
    assert session.get(Delivery, delivery.id).state == "delivered"
    assert len(peer.seen) == 4 and peer.seen[-1].sha256 == hashlib.sha256(BODY).hexdigest()


def test_sync_timeout_is_504(served, receiver, session, peer):
    peer.script("/in", Script(200, delay=1.5))
    session.execute(update(PluginInstance).where(PluginInstance.name == "poster")
                    .values(retry_policy={"strategy": "fixed", "base_delay": 30,
                                          "max_attempts": 1}, updated_at=utcnow()))
    session.commit()
    answer = requests.post(f"{served}/in/direct", data=b"x", headers=auth(receiver["direct"]),
                           timeout=30)
    assert answer.status_code == 504, answer.text


def test_sync_offline_target_is_503_without_an_attempt_then_async(served, receiver,
                                                                  session, peer, wakeups):
    session.execute(update(PluginInstance).where(PluginInstance.name == "poster")
                    .values(online=False))
    session.commit()
    answer = requests.post(f"{served}/in/direct", data=BODY, headers=auth(receiver["direct"]),
                           timeout=30)
    assert answer.status_code == 503, answer.text
    assert answer.json()["attempts"] == 0 and peer.seen == []
    # not claimed in the request: its wake-up goes out as for any intake
    wait_until(lambda: wakeups, 10, "the wake-up of the delivery not attempted")
    [message] = messages(session)
    delivery = session.scalar(select(Delivery).where(Delivery.message_id == message.id))
    assert delivery.state == "queued" and delivery.attempt == 0
    session.execute(update(PluginInstance).where(PluginInstance.name == "poster")
                    .values(online=True))
    session.commit()
    TargetRunner(new_session, hub_module.registry(), hub_module.store(), "w").drain(
        "poster", budget=10)
    session.expire_all()
    assert session.get(Delivery, delivery.id).state == "delivered"


# --- Idempotency-Key ------------------------------------------------------------------

def test_same_key_same_body_answers_again_other_body_422(served, receiver, session, app):
    headers = auth(receiver["inbox"], **{"Idempotency-Key": "k-1"})
    first = requests.post(f"{served}/in/inbox", data=BODY, headers=headers, timeout=10)
    again = requests.post(f"{served}/in/inbox", data=BODY, headers=headers, timeout=10)
    assert first.status_code == again.status_code == 202
    assert first.json() == again.json()
    assert again.headers["Location"] == first.headers["Location"]
    [message] = messages(session)
    assert [line.type for line in lines(session, message.id)].count("duplicate_received") == 1
    other = requests.post(f"{served}/in/inbox", data=BODY + b"!", headers=headers, timeout=10)
    assert other.status_code == 422
    assert len(messages(session)) == 1
    files = stored_files(app)
    assert len(files) == 1  # neither the repeat nor the other body left a file
    # kept idempotency_hours: the hourly job removes it after that
    expire = {job.name: job for job in HttpReceiver.periodic_jobs}["http_receiver.expire_keys"]
    assert expire.run(session, None, utcnow() + timedelta(hours=23)) == 0
    assert expire.run(session, None, utcnow() + timedelta(hours=25)) == 1
    session.commit()
    later = requests.post(f"{served}/in/inbox", data=BODY, headers=headers, timeout=10)
    assert later.status_code == 202 and len(messages(session)) == 2


def test_twenty_concurrent_requests_with_one_key_make_one_message(served, receiver, session):
    headers = auth(receiver["inbox"], **{"Idempotency-Key": "burst"})

    def post(_):
        return requests.post(f"{served}/in/inbox", data=BODY, headers=headers, timeout=30)

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(post, range(20)))
    statuses = sorted(a.status_code for a in answers)
    assert set(statuses) <= {202, 409}, statuses
    [message] = messages(session)
    assert all(a.json()["message_id"] == message.id for a in answers if a.status_code == 202)
    assert session.scalar(select(IdempotencyKey.state)) == "done"


def test_a_key_left_in_progress_by_a_dead_process_is_taken_over(served, receiver, session):
    long_ago = utcnow() - timedelta(minutes=20)
    session.add(IdempotencyKey(instance="inbox", key="orphan",
                               body_sha256=hashlib.sha256(BODY).hexdigest(),
                               state="in_progress", created_at=long_ago,
                               expires_at=long_ago + timedelta(hours=24)))
    session.add(IdempotencyKey(instance="inbox", key="fresh",
                               body_sha256=hashlib.sha256(BODY).hexdigest(),
                               state="in_progress", created_at=utcnow(),
                               expires_at=utcnow() + timedelta(hours=24)))
    session.commit()
    headers = auth(receiver["inbox"])
    busy = requests.post(f"{served}/in/inbox", data=BODY, timeout=10,
                         headers={**headers, "Idempotency-Key": "fresh"})
    assert busy.status_code == 409 and messages(session) == []
    taken = requests.post(f"{served}/in/inbox", data=BODY, timeout=10,
                          headers={**headers, "Idempotency-Key": "orphan"})
    assert taken.status_code == 202, taken.text
    [message] = messages(session)
    again = requests.post(f"{served}/in/inbox", data=BODY, timeout=10,
                          headers={**headers, "Idempotency-Key": "orphan"})
    assert again.json()["message_id"] == message.id and len(messages(session)) == 1


def test_a_sync_repeat_with_its_key_gets_the_first_answer_without_a_new_attempt(
        served, receiver, session, peer):
    peer.script("/in", Script(200, body=b"taken"))
    headers = auth(receiver["direct"], **{"Idempotency-Key": "sync-1"})
    first = requests.post(f"{served}/in/direct", data=BODY, headers=headers, timeout=30)
    again = requests.post(f"{served}/in/direct", data=BODY, headers=headers, timeout=30)
    assert first.status_code == again.status_code == 200
    assert first.content == again.content
    assert len(peer.seen) == 1 and len(messages(session)) == 1
