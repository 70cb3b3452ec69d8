"""Outbound TLS per partner and the partner's AS2 connection test (issue 17, scope 9).

Partners are pyas2lib processes on loopback (tests/as2_partner.py), over HTTP or HTTPS
with a server certificate from a test CA, requiring a client certificate issued by
another test CA; one presents an expired certificate, one signs its MDNs with a key the
hub does not know. The hub serves its AS2 receiver on loopback (async MDNs)."""

# ruff: noqa: F401, F811

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
import requests
from sqlalchemy import select

from b2bhub.models import Delivery, Message, utcnow
from plugins.as2 import profiles
from plugins.as2.mdn_out import send_due_mdns
from plugins.as2.selftest import SUBJECT, TEST_HEADER
from tests import test_ui
from tests.as2kit import make_ca, make_issued, make_pair
from tests.test_as2 import DATA, ROOT, as2, certs, partner, wait_for

login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request
STEPS = ["dns", "tcp", "tls", "message", "http", "mdn", "mdn_signature", "mic"]
TEST_URL = "/api/v1/partners/acme/profiles/as2/test"


@pytest.fixture(scope="module")
def pki():
    server_ca, client_ca = make_ca("Partner Server CA"), make_ca("Hub Client CA")
    return {"server_ca": server_ca, "client_ca": client_ca,
            "server": make_issued(server_ca, "localhost"),
            "expired": make_issued(server_ca, "localhost", start_days=-400, end_days=-20),
            "client": make_issued(client_ca, "hub-client", server=False),
            "stranger": make_issued(make_ca("Unknown CA"), "stranger", server=False)}


@pytest.fixture(scope="module")
def start(certs, tmp_path_factory):
    """``start(**config)``: a partner process with extra config; its base URL."""
    procs = []

    def started(**extra) -> str:
        cfg = tmp_path_factory.mktemp("tlspartner") / "partner.json"
        cfg.write_text(json.dumps({"as2_id": "ACME", "cert": certs["acme"][0],
                                   "key": certs["acme"][1], "hub_as2_id": "HUB",
                                   "hub_cert": certs["hub"][0], **extra}))
        proc = subprocess.Popen([sys.executable, "-m", "tests.as2_partner", str(cfg)],
                                cwd=ROOT, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        port = int(proc.stdout.readline())
        scheme, host = ("https", "localhost") if extra.get("tls") else ("http", "127.0.0.1")
        return f"{scheme}://{host}:{port}"

    yield started
    for proc in procs:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def mtls(start, pki):
    """A partner on HTTPS that requires a client certificate of the hub's client CA."""
    return start(tls={"cert": pki["server"][0], "key": pki["server"][1],
                      "client_ca": pki["client_ca"][0]})


def client_cert(pair):
    return {"pem": pair[0], "private_key_pem": pair[1]}


def run_test(api, **options) -> dict:
    answer = api.post(TEST_URL, json=options)
    assert answer.status_code == 200, answer.text
    return answer.get_json()


def states(result: dict) -> dict[str, str]:
    return {s["name"]: s["state"] for s in result["steps"]}


def step(result: dict, name: str) -> dict:
    return next(s for s in result["steps"] if s["name"] == name)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once closed


# --- the connection test ----------------------------------------------------------

def test_all_steps_ok_against_a_live_partner_over_mutual_tls(as2, api, mtls, pki):
    as2.choose(url=mtls + "/as2", sign=True, encrypt=True, mdn_mode="sync", mdn_signed=True,
               tls_ca_bundle=pki["server_ca"][0], tls_system_trust=False,
               tls_client_certificate=client_cert(pki["client"]))
    result = run_test(api)
    assert states(result) == dict.fromkeys(STEPS, "ok"), result
    assert result["ok"] is True and result["summary"].startswith("every step passed")
    assert set(result) == {"ok", "summary", "message_id", "steps"}
    assert all(set(s) == {"name", "label", "state", "text"} for s in result["steps"])
    assert "certificate chain verified" in step(result, "tls")["text"]
    assert "days left" in step(result, "tls")["text"]
    assert "client certificate CN=hub-client sent" in step(result, "tls")["text"]
    assert "confirms our MIC" in step(result, "mic")["text"]
    # the test message: marked, never routed, its history names the operator
    message = as2.session.get(Message, result["message_id"])
    assert message.source == "(connection test)" and message.status == "delivered"
    assert (message.from_party, message.to_party) == ("mycompany", "acme")
    assert as2.session.scalars(select(Delivery).where(
        Delivery.message_id == message.id)).all() == []
    [line] = as2.lines(message.id, "connection_test")
    assert line.startswith("tests ran the AS2 connection test of partner acme")
    assert {"sent", "receipt", "unpacked"} <= set(as2.stages(message.id))
    refused = api.post(f"/api/v1/messages/{message.id}/redispatch")
    assert refused.status_code == 409 and "never routed" in refused.text


def test_marked_as_a_test_for_the_partner_and_async_mdn_waited_for(as2, api):
    as2.choose(mdn_mode="async", mdn_signed=True, sign=True)
    seen = len(as2.partner.received())
    result = run_test(api, wait=30)
    assert states(result) == {**dict.fromkeys(STEPS, "ok"), "tls": "skipped"}, result
    assert "asynchronous MDN received" in step(result, "mdn")["text"]
    [got] = as2.partner.received()[seen:]
    wire = base64.b64decode(got["wire"])
    assert f"Subject: {SUBJECT}".encode() in wire
    assert f"{TEST_HEADER[0]}: {TEST_HEADER[1]}".encode() in wire
    assert got["status"] == "processed"


def test_async_mdn_not_waited_for_is_pending_then_settles_the_test_message(as2, api):
    as2.choose(mdn_mode="async", mdn_signed=False)
    as2.partner.configure(hold_async=True)
    try:
        result = run_test(api, wait=0)
    finally:
        as2.partner.configure(hold_async=False)
    assert result["ok"] is False
    assert [states(result)[n] for n in ("http", "mdn", "mdn_signature", "mic")] == [
        "ok", "pending", "pending", "pending"]
    assert "none came within 0 s" in step(result, "mdn")["text"]
    message_id = result["message_id"]
    assert as2.session.get(Message, message_id).status == "awaiting_receipt"
    assert as2.partner.release_async() == 1

    def settled():
        as2.session.expire_all()
        return as2.session.get(Message, message_id).status == "delivered"
    assert wait_for(settled), as2.lines(message_id)
    assert as2.lines(message_id, "connection_test_mdn")


def test_closed_port_fails_at_tcp_and_the_rest_is_not_run(as2, api):
    as2.choose(url=f"http://127.0.0.1:{closed_port()}/as2")
    result = run_test(api)
    assert [states(result)[n] for n in STEPS] == ["ok", "failed"] + ["not_run"] * 6
    assert "could not connect: 127.0.0.1:" in step(result, "tcp")["text"]
    assert "refused" in step(result, "tcp")["text"].lower()
    assert step(result, "http")["text"] == "not run: TCP connect failed"
    assert "failed at TCP connect" in result["summary"]
    message = as2.session.get(Message, result["message_id"])
    assert message.status == "error" and "TCP connect" in message.status_text


def test_the_steps_details_in_portuguese(as2, api, app, login, fresh_user_per_request):
    """The page shows each step's detail in the reader's language; the API in English."""
    from flask import g

    @app.before_request
    def language_per_request() -> None:
        g.pop("_flask_babel", None)
    as2.choose(url=f"http://127.0.0.1:{closed_port()}/as2")
    client = login("admin", "pia")
    client.environ_base["HTTP_ACCEPT_LANGUAGE"] = "pt-BR"
    shown = client.post("/ui/parties/partner/acme/as2/test", data={"wait": "0"}).text
    assert "não foi possível conectar: 127.0.0.1:" in shown
    assert "não executado: Conexão TCP falhou" in shown
    assert "not run:" not in shown and "could not connect" not in shown
    assert step(run_test(api), "http")["text"] == "not run: TCP connect failed"


def test_unknown_host_fails_at_name_resolution(as2, api):
    as2.choose(url="http://no-such-host.invalid/as2")
    result = run_test(api)
    assert states(result)["dns"] == "failed" and states(result)["tcp"] == "not_run"
    assert "no-such-host.invalid cannot be resolved" in step(result, "dns")["text"]


def test_mdn_signed_with_a_wrong_certificate_fails_at_the_signature(as2, api, start, certs):
    wrong = start(mdn_signer={"cert": certs["other"][0], "key": certs["other"][1]})
    as2.choose(url=wrong + "/as2", mdn_mode="sync", mdn_signed=True, sign=True)
    result = run_test(api)
    got = states(result)
    assert (got["http"], got["mdn"], got["mdn_signature"], got["mic"]) == (
        "ok", "ok", "failed", "not_run"), result
    assert "failed our verification" in step(result, "mdn_signature")["text"]
    assert "CN=acme.example" in step(result, "mdn_signature")["text"]


def test_expired_tls_certificate_fails_at_tls_naming_the_expiry(as2, api, start, pki):
    expired = start(tls={"cert": pki["expired"][0], "key": pki["expired"][1]})
    as2.choose(url=expired + "/as2", tls_ca_bundle=pki["server_ca"][0])
    result = run_test(api)
    assert [states(result)[n] for n in STEPS[:4]] == ["ok", "ok", "failed", "not_run"]
    text = step(result, "tls")["text"]
    assert "server certificate has expired" in text and "expired 20" in text, text
    assert "CN=localhost, issued by CN=Partner Server CA" in text


def test_untrusted_server_and_missing_client_certificate_fail_at_tls(as2, api, mtls, pki):
    as2.choose(url=mtls + "/as2")  # no CA bundle: the test CA is in no system store
    result = run_test(api)
    assert states(result)["tls"] == "failed"
    assert "not trusted" in step(result, "tls")["text"]
    as2.choose(tls_ca_bundle=pki["server_ca"][0])  # trusted now, but no client certificate
    result = run_test(api)
    assert states(result)["tls"] == "failed", result
    text = step(result, "tls")["text"]
    assert "client certificate" in text and "none" in text, text
    as2.choose(tls_client_certificate=client_cert(pki["stranger"]))  # one it does not trust
    result = run_test(api)
    assert states(result)["tls"] == "failed", result
    assert "CN=stranger" in step(result, "tls")["text"]


def test_the_test_needs_admin_and_an_as2_profile(as2, api, app, session):
    from b2bhub.services.tokens import create_token
    token = create_token(session, "watcher", "operator")
    session.commit()
    answer = app.test_client().post(TEST_URL, json={},
                                    headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 403
    from b2bhub.services.config import create_party
    create_party(session, "partner", "nobody")
    session.commit()
    missing = api.post("/api/v1/partners/nobody/profiles/as2/test", json={})
    assert missing.status_code == 404 and "no AS2 profile" in missing.text
    bad = api.post(TEST_URL, json={"wait": 1000})
    assert bad.status_code == 400


def test_openapi_documents_the_test(api):
    doc = api.get("/api/v1/openapi.json").get_json()
    view = doc["paths"]["/api/v1/partners/{name}/profiles/{kind}/test"]["post"]
    assert view["x-required-role"] == "admin"
    schema = view["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/ConnectionTest")
    shape = doc["components"]["schemas"]["ConnectionTest"]
    assert set(shape["required"]) == {"ok", "summary", "message_id", "steps"}
    assert set(doc["components"]["schemas"]["TestStep"]["properties"]["state"]["enum"]) == {
        "ok", "failed", "skipped", "pending", "not_run"}


def test_ui_button_shows_the_steps(as2, app, login, fresh_user_per_request):
    client = login("admin", "olga")
    page = client.get("/ui/parties/partner/acme/as2")
    assert page.status_code == 200
    assert 'id="test-connection"' in page.text and "Test connection" in page.text
    assert "TLS CA bundle" in page.text and 'name="tls_client_file"' in page.text
    shown = client.post("/ui/parties/partner/acme/as2/test", data={"wait": "5"})
    assert shown.status_code == 200, shown.text
    assert 'data-step="mic" data-state="ok"' in shown.text
    assert 'data-step="tls" data-state="skipped"' in shown.text
    assert "every step passed" in shown.text
    [message] = [m for m in as2.messages() if m.source == "(connection test)"]
    assert as2.lines(message.id, "connection_test")[0].startswith("olga ran the AS2 "
                                                                   "connection test")
    assert f'href="/ui/messages/{message.id}"' in shown.text
    page = client.get(f"/ui/messages/{message.id}")
    assert page.status_code == 200 and "(connection test)" in page.text
    assert f"/ui/messages/{message.id}/redispatch" not in page.text  # never routed
    viewer = login("viewer")
    assert 'id="test-connection"' not in viewer.get("/ui/parties/partner/acme/as2").text
    assert viewer.post("/ui/parties/partner/acme/as2/test").status_code == 403


# --- TLS for every send ------------------------------------------------------------

def test_sender_needs_the_client_certificate_for_a_mutual_tls_partner(as2, mtls, pki):
    as2.choose(url=mtls + "/as2", tls_ca_bundle=pki["server_ca"][0], tls_system_trust=False)
    message = as2.outbound()
    as2.drain()
    delivery = as2.delivery(message.id)
    assert delivery.state == "retrying", delivery.last_result
    assert delivery.last_result.startswith("TLS failed: the partner's server "), \
        delivery.last_result
    assert "we sent no client certificate (the profile has none)" in delivery.last_result
    as2.choose(tls_client_certificate=client_cert(pki["client"]))
    as2.drain(clock=lambda: utcnow() + timedelta(hours=2))  # the retry is due
    assert as2.delivery(message.id).state == "delivered", as2.delivery(message.id).last_result


def test_async_mdn_we_owe_goes_over_the_partners_tls(as2, mtls, pki, tmp_path):
    as2.choose(url=mtls + "/as2", tls_ca_bundle=pki["server_ca"][0], tls_system_trust=False)
    ca, ours = tmp_path / "ca.pem", tmp_path / "client.pem"
    ca.write_text(pki["server_ca"][0])
    ours.write_text(pki["client"][1] + pki["client"][0])
    tls = {"verify": str(ca), "cert": str(ours), "timeout": 60}
    order = {"data": base64.b64encode(DATA).decode(), "hub_url": as2.url, "mdn_mode": "async",
             "sign": True, "encrypt": True}
    sent = requests.post(mtls + "/send", json=order, **tls).json()
    assert sent["http_status"] == 200, sent
    [message] = as2.messages()
    assert send_due_mdns(as2.session, as2.hub.store, utcnow()) == 0  # no client cert yet
    [retrying] = as2.lines(message.id, "mdn_retrying")
    assert "TLS failed" in retrying and "client certificate" in retrying, retrying
    as2.choose(tls_client_certificate=client_cert(pki["client"]))
    later = utcnow() + timedelta(hours=1)
    assert send_due_mdns(as2.session, as2.hub.store, later) == 1
    mdns = requests.get(mtls + "/mdns", **tls).json()
    assert [m["status"] for m in mdns] == ["processed"], mdns


def test_tls_client_certificate_is_kept_like_a_secret(as2, api, pki):
    answer = api.put("/api/v1/partners/acme/profiles/as2", json={
        "tls_client_certificate": client_cert(pki["client"]),
        "tls_ca_bundle": pki["server_ca"][0]})
    assert answer.status_code == 200, answer.text
    shown = api.get("/api/v1/partners/acme/profiles/as2")
    body = shown.get_json()
    assert "PRIVATE KEY" not in shown.text
    assert body["tls_client_certificate"]["subject"] == "CN=hub-client"
    assert body["tls_client_certificate"]["has_private_key"] is True
    assert [c["subject"] for c in body["certificates"]] == ["CN=acme.example"]
    assert body["tls_ca_bundle"] == pki["server_ca"][0] and body["tls_system_trust"] is True
    # replacing the AS2 certificate keeps the TLS one; null removes it
    api.put("/api/v1/partners/acme/profiles/as2",
            json={"certificate": {"pem": make_pair("acme.example")[0]}})
    assert api.get("/api/v1/partners/acme/profiles/as2").get_json()[
        "tls_client_certificate"]["subject"] == "CN=hub-client"
    assert profiles.by_party(as2.session, "acme").tls_client.subject == "CN=hub-client"
    api.put("/api/v1/partners/acme/profiles/as2", json={"tls_client_certificate": None})
    assert api.get("/api/v1/partners/acme/profiles/as2").get_json()[
        "tls_client_certificate"] is None
    no_key = api.put("/api/v1/partners/acme/profiles/as2",
                     json={"tls_client_certificate": {"pem": pki["client"][0]}})
    assert no_key.status_code == 400 and "private key" in no_key.text
    bad = api.put("/api/v1/partners/acme/profiles/as2", json={"tls_ca_bundle": "not a pem"})
    assert bad.status_code == 400 and "tls_ca_bundle" in bad.text
