"""Certificate Exchange Messaging (CEM, issue 42 item 2) between two b2bhub hubs on
loopback, each its own app, database and payload store, served by a real HTTP server:
ALPHA (the test backend's database) and BETA (an embedded database of its own).

ALPHA sends its new certificate to BETA, BETA's operator accepts it, BETA's response
reaches ALPHA; both switch at the certificate's start, shown with the AS2 code's clock
moved on, and real AS2 connection tests both ways verify with the new certificate; the
old one still verifies at BETA until it ends. With a third hub, GAMMA: one certificate
offered to both partners signs only for BETA, which accepted it, from its start (each
receiving hub reads the signer of what it got, messages and our MDNs), GAMMA still gets
the old one, which decrypts what GAMMA sends until it ends; a certificate no partner
took is removed. A request left unanswered by its RespondByDate raises
``cem_unanswered``; a partner with ``cem_auto_accept`` answers at once (its job sends
the response). A request in Mendelson's format (the XML of the
EDIINT CEM draft as Mendelson documents it, ``tests/samples/cem``) is parsed and
answered to a pyas2lib partner.
"""

# ruff: noqa: F811

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path
from types import SimpleNamespace

import b2bhub_testplugins as testplugins
import pytest
import requests
from sqlalchemy import select

from b2bhub import create_app
from b2bhub.config.extensions import db
from b2bhub.engine.dispatch import NewMessage, store_and_dispatch
from b2bhub.engine.runner import TargetRunner
from b2bhub.models import Alert, Delivery, HistoryLine, Message, Payload, utcnow
from b2bhub.plugin.registry import PluginRegistry
from b2bhub.runtime.hub import new_session
from plugins.as2 import cem, cem_xml, lib, profiles, selftest
from plugins.as2.plugin import As2Receiver, As2Sender
from plugins.as2.profile_kind import AS2_PROFILES
from tests import test_ui
from tests.as2kit import make_ca, make_issued
from tests.conftest import _config
from tests.factories import Hub
from tests.loopback import serve_in_thread
from tests.test_as2 import DATA, as2, certs, partner  # noqa: F401
from tests.test_as2_certs import make_cert, post_from_acme

SAMPLES = Path(__file__).parent / "samples" / "cem"
NOW = utcnow()
login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request


@pytest.fixture(scope="module")
def keys():
    day = dt.timedelta(days=1)
    return {"alpha_old": make_cert("alpha-2026", NOW - 300 * day, NOW + 30 * day),
            "alpha_new": make_cert("alpha-2027", NOW + 2 * day, NOW + 400 * day),
            "alpha_spare": make_cert("alpha-spare", NOW - day, NOW + 400 * day),
            "beta": make_cert("beta-2026", NOW - 10 * day, NOW + 365 * day),
            "gamma": make_cert("gamma-2026", NOW - 10 * day, NOW + 365 * day)}


class Side:
    """One hub: its app, its URL and how to work in its context."""

    def __init__(self, app, url: str):
        self.app, self.url = app, url
        self.receiver = url + "/as2/as2in"

    def __enter__(self):
        self._ctx = self.app.app_context()
        self._ctx.push()
        return db.session

    def __exit__(self, *exc):
        db.session.remove()
        self._ctx.pop()


def _serve(app):
    from werkzeug.serving import make_server
    server = make_server("127.0.0.1", 0, app, threaded=True)
    serve_in_thread(server)
    return server


def beta_hub(tmp_path: Path, keys: dict, alpha: Side, name: str = "beta"):
    """BETA (or another ``name``, its certificate ``keys[name]``): a second hub (app,
    embedded database, payload store) served on loopback, with ALPHA as its partner;
    (its Side, the server to shut down)."""
    info = {"database_url": f"sqlite:///{tmp_path / f'{name}.sqlite'}",
            "broker_url": f"sqla+sqlite:///{tmp_path / f'{name}-broker.sqlite'}",
            "data_dir": str(tmp_path / name)}
    beta_registry = PluginRegistry()
    for cls in (As2Receiver, As2Sender, testplugins.Noop):
        beta_registry.register(cls)
    beta_app = create_app(_config(info, PLUGIN_REGISTRY=beta_registry,
                                  PAYLOAD_DIR=str(tmp_path / name / "payloads"),
                                  WAKEUP_PUBLISHER=lambda items: None))
    server = _serve(beta_app)
    beta = Side(beta_app, f"http://127.0.0.1:{server.server_port}")
    with beta as beta_session:
        from flask_migrate import upgrade
        upgrade(revision="heads")
        _set_up(Hub(beta_session, beta_registry, beta_app), beta_session, f"{name}co",
                name.upper(), keys[name], "alphapartner", "ALPHA", keys["alpha_old"][0],
                beta, alpha)
    return beta, server


def close(beta: Side, server) -> None:
    server.shutdown()
    server.server_close()
    with beta:
        db.engines[None].dispose()


def alpha_hub(hub, registry, session, keys, alpha: Side, beta: Side) -> None:
    registry.register(As2Receiver)
    registry.register(As2Sender)
    _set_up(hub, session, "alphaco", "ALPHA", keys["alpha_old"], "betapartner", "BETA",
            keys["beta"][0], alpha, beta)


@pytest.fixture
def hubs(app, served, hub, registry, session, keys, tmp_path):
    """ALPHA (the test's app) and BETA (a second app on an embedded database), each
    with an AS2 receiver routed to a sink, the other as its partner."""
    alpha = Side(app, served)
    beta, server = beta_hub(tmp_path, keys, alpha)
    alpha_hub(hub, registry, session, keys, alpha, beta)
    yield alpha, beta
    close(beta, server)


def _set_up(hub, session, org, org_id, pair, partner, partner_id, partner_cert, me, other):
    hub.parties(organizations=(org,), partners=(partner,))
    profiles.save_profile(session, "organization", org, {
        "as2_id": org_id, "mdn_url": me.receiver,
        "certificate": {"pem": pair[0], "private_key_pem": pair[1]}})
    profiles.save_profile(session, "partner", partner, {
        "as2_id": partner_id, "url": other.receiver, "mdn_mode": "sync",
        "certificate": {"pem": partner_cert}})
    session.commit()
    hub.instance("as2in", "as2_receiver", enabled=True)
    hub.instance("sink", "noop", enabled=True)
    hub.route("as2in", "*", "*", "sink")


def later(monkeypatch, days: float) -> None:
    """The AS2 code's clock (both hubs: one process) ``days`` on."""
    moved = lambda: utcnow() + dt.timedelta(days=days)  # noqa: E731
    for module in (lib, cem, selftest):
        monkeypatch.setattr(module, "utcnow", moved)


def requests_of(session, partner: str) -> list[dict]:
    session.expire_all()
    return cem.records(profiles.get_profile(session, "partner", partner).settings)


def signer_of(session, org: str, partner: str = "betapartner") -> str:
    """The subject of the certificate our messages to ``partner`` are signed with now."""
    found = profiles.by_party(session, org)
    choice = profiles.choose_certs(found.certs, "signing", lib.utcnow(), False, org,
                                   partner, found.gates)
    return choice.use[0].subject


def lines(session, text: str) -> list[str]:
    return [line.text for line in session.scalars(
        select(HistoryLine).where(HistoryLine.type == "cem").order_by(HistoryLine.id))
        if text in line.text]


def request_from_alpha(session, pair: tuple[str, str], to: str = "betapartner",
                       **body) -> dict:
    """olga sends ALPHA's certificate ``pair`` to BETA (or ``to``; the action, as the
    API runs it)."""
    sent = AS2_PROFILES.run_action(session, "partner", to, "cem_request", {
        "certificate": {"pem": pair[0], "private_key_pem": pair[1]}, **body}, "olga")
    session.commit()
    return sent


def test_two_hubs_exchange_a_certificate_and_switch_at_its_date(hubs, keys, session,
                                                                 monkeypatch):
    alpha, beta = hubs
    sent = request_from_alpha(session, keys["alpha_new"],
                              respond_by=(NOW + dt.timedelta(days=5)).isoformat() + "Z")
    assert sent["state"] == "sent" and "key" not in sent
    assert lines(session, "olga sent a CEM request to betapartner with the certificate "
                          "CN=alpha-2027")

    with beta as beta_session:  # BETA: pending for its operator, shown with its dates
        [pending] = requests_of(beta_session, "alphapartner")
        assert pending["state"] == "pending" and pending["request_id"] == sent["request_id"]
        assert pending["trusts"][0]["subject"] == "CN=alpha-2027"
        assert pending["trusts"][0]["usages"] == ["signing", "encryption"]
        assert len(profiles.get_profile(beta_session, "partner", "alphapartner")
                   .certificates) == 1  # nothing taken before the operator says so
        answered = AS2_PROFILES.run_action(beta_session, "partner", "alphapartner",
                                           "cem_accept", {"request_id": pending["id"]},
                                           "bruno")
        assert answered["state"] == "accepted" and answered["response"] == "sent"
        assert lines(beta_session, "bruno accepted the CEM request")
        starts = sorted(c.not_before for c in profiles.get_profile(
            beta_session, "partner", "alphapartner").certificates)
        # taken with its own start, in two days: the later of that and the acceptance
        assert abs(starts[-1] - (NOW + dt.timedelta(days=2))) < dt.timedelta(seconds=1)

    [done] = requests_of(session, "betapartner")
    assert done["state"] == "accepted" and "key" not in done
    assert lines(session, "CEM response from betapartner: accepted the certificate "
                          "CN=alpha-2027")
    # before its date: the old certificate signs, BETA verifies; a test both ways passes
    assert signer_of(session, "alphaco") == "CN=alpha-2026"
    assert selftest.run(session, _store(alpha), "betapartner", "olga", wait=0).ok
    later(monkeypatch, 3)  # the new certificate's start has passed on both hubs
    assert signer_of(session, "alphaco") == "CN=alpha-2027"
    result = selftest.run(session, _store(alpha), "betapartner", "olga", wait=0)
    assert result.ok, result.summary  # signed with the new key, verified by BETA
    with beta as beta_session:  # BETA encrypts to the new certificate; ALPHA decrypts
        result = selftest.run(beta_session, _store(beta), "alphapartner", "bruno", wait=0)
        assert result.ok, result.summary
    # the old certificate still verifies at BETA until it ends, then no more
    old = post_signed(beta, keys["alpha_old"], keys["beta"][0], "old-before-end@alpha")
    assert old.status_code == 200 and b"automatic-action/MDN-sent-automatically; " \
        b"processed\r\n" in old.content
    later(monkeypatch, 31)
    gone = post_signed(beta, keys["alpha_old"], keys["beta"][0], "old-after-end@alpha")
    assert b"authentication-failed" in gone.content.lower()


@pytest.fixture
def three_hubs(app, served, hub, registry, session, keys, tmp_path):
    """ALPHA with two partner hubs, BETA and GAMMA, each on loopback."""
    alpha = Side(app, served)
    beta, beta_server = beta_hub(tmp_path, keys, alpha)
    gamma, gamma_server = beta_hub(tmp_path, keys, alpha, "gamma")
    alpha_hub(hub, registry, session, keys, alpha, beta)
    hub.parties(organizations=(), partners=("gammapartner",))
    profiles.save_profile(session, "partner", "gammapartner", {
        "as2_id": "GAMMA", "url": gamma.receiver, "mdn_mode": "sync",
        "certificate": {"pem": keys["gamma"][0]}})
    session.commit()
    hub.instance("as2out", "as2_sender", enabled=True)
    yield alpha, beta, gamma
    close(gamma, gamma_server)
    close(beta, beta_server)


def signed_by(wire: bytes) -> list[str]:
    """The subjects of the certificates in the signature of a multipart/signed entity
    (its headers and body): the signer's, as the receiving side reads it."""
    from email import message_from_bytes, policy

    from cryptography.hazmat.primitives.serialization import pkcs7
    for part in message_from_bytes(wire, policy=policy.compat32).walk():
        if part.get_content_type() in ("application/pkcs7-signature",
                                       "application/x-pkcs7-signature"):
            return [c.subject.rfc4514_string() for c in
                    pkcs7.load_der_pkcs7_certificates(part.get_payload(decode=True))]
    return []


def received_from_alpha(side: Side) -> list[str]:
    """Who signed the last message the hub ``side`` received from ALPHA (its raw stage,
    as it came)."""
    with side as other:
        last = other.scalar(select(Message.id).where(Message.from_party == "alphapartner")
                            .order_by(Message.id.desc()).limit(1))
        digest = other.scalar(select(Payload.digest).where(Payload.message_id == last,
                                                           Payload.stage == "raw"))
        with _store(side).open(digest) as f:
            return signed_by(f.read())


def send_from_alpha(hub, session, to: str) -> Delivery:
    """A business message from ALPHA to partner ``to`` through its AS2 sender, sent."""
    stored = hub.store.put(DATA)
    message = store_and_dispatch(session, NewMessage(
        source="@operator", from_party="alphaco", to_party=to,
        stages={"unpacked": (stored.digest, stored.size)}, original_filename="po.edi",
        targets=["as2out"]), utcnow())
    session.commit()
    TargetRunner(new_session, hub.registry, hub.store, "test-worker").drain(
        "as2out", budget=60)
    session.expire_all()
    return session.scalar(select(Delivery).where(Delivery.message_id == message.id))


def answer_of(side: Side, stage_of: str) -> list[str]:
    """Who signed ALPHA's MDN to the last test ``side`` ran (its receipt stage)."""
    with side as other:
        last = other.scalar(select(Message.id).where(Message.to_party == "alphapartner")
                            .order_by(Message.id.desc()).limit(1))
        digest = other.scalar(select(Payload.digest).where(Payload.message_id == last,
                                                           Payload.stage == stage_of))
        with _store(side).open(digest) as f:
            return signed_by(f.read())


def test_our_certificate_signs_only_for_the_partner_that_accepted_it(
        three_hubs, hub, keys, session, monkeypatch, login, fresh_user_per_request):
    """ALPHA offers one new certificate to BETA and GAMMA: BETA accepts, GAMMA rejects.
    From the certificate's start BETA receives messages and MDNs signed with it, GAMMA
    with the old one, which still decrypts what GAMMA encrypts to it until it ends."""
    alpha, beta, gamma = three_hubs
    for name in ("betapartner", "gammapartner"):  # signed only: the signer is readable
        profiles.save_profile(session, "partner", name, {"encrypt": False})
    session.commit()
    for side in (beta, gamma):
        with side as other:
            profiles.save_profile(other, "partner", "alphapartner", {"encrypt": False})
            other.commit()
    to_beta = request_from_alpha(session, keys["alpha_new"])
    to_gamma = request_from_alpha(session, keys["alpha_new"], to="gammapartner")
    # one row for the certificate, offered to both; it signs for no partner yet
    rows = [c for c in profiles.get_profile(session, "organization", "alphaco").certificates
            if c.subject == "CN=alpha-2027"]
    assert len(rows) == 1 and to_beta["cert_id"] == to_gamma["cert_id"] == rows[0].id
    shown = profiles.profile_json(profiles.get_profile(session, "organization", "alphaco"),
                                  NOW)
    assert [c["signs_for"] for c in shown["certificates"]] == [None, {}]

    with gamma as gamma_session:
        [pending] = requests_of(gamma_session, "alphapartner")
        AS2_PROFILES.run_action(gamma_session, "partner", "alphapartner", "cem_reject",
                                {"request_id": pending["id"], "reason": "not this year"},
                                "gina")
    shown = profiles.profile_json(profiles.get_profile(session, "organization", "alphaco"),
                                  NOW)  # kept: BETA's request is still open
    assert [c["signs_for"] for c in shown["certificates"]] == [None, {}]
    with beta as beta_session:
        [pending] = requests_of(beta_session, "alphapartner")
        AS2_PROFILES.run_action(beta_session, "partner", "alphapartner", "cem_accept",
                                {"request_id": pending["id"]}, "bruno")
    [accepted] = requests_of(session, "betapartner")
    [rejected] = requests_of(session, "gammapartner")
    assert rejected["state"] == "rejected" and rejected["reason"] == "not this year"
    assert accepted["state"] == "accepted"
    effective = accepted["effective"]  # its own start, in two days: later than the answer
    assert abs(cem._when(effective) - (NOW + dt.timedelta(days=2))) < dt.timedelta(seconds=1)
    assert lines(session, f"alphaco signs with it for betapartner from {effective}")
    # the row stays (BETA took it), shown with the partner it signs for and from when
    shown = profiles.profile_json(profiles.get_profile(session, "organization", "alphaco"),
                                  NOW)
    assert [c["signs_for"] for c in shown["certificates"]] == [
        None, {"betapartner": effective}]
    when = effective[:16].replace("T", " ")
    admin = login("admin")
    page = admin.get("/ui/parties/partner/betapartner/as2").text
    assert f"we sign for this partner with it from {when} UTC" in page
    assert "we sign for this partner" not in admin.get(
        "/ui/parties/partner/gammapartner/as2").text
    page = admin.get("/ui/parties/organization/alphaco/as2").text
    assert f"offered by CEM; signs only for: betapartner from {when}" in page

    # before its start: both partners receive messages signed with the old certificate
    for name, side in (("betapartner", beta), ("gammapartner", gamma)):
        result = selftest.run(session, _store(alpha), name, "olga", wait=0)
        assert result.ok, result.summary
        assert received_from_alpha(side) == ["CN=alpha-2026"], name
        assert signer_of(session, "alphaco", name) == "CN=alpha-2026"

    later(monkeypatch, 3)  # its start has passed: BETA gets the new one, GAMMA the old
    for name, side, signer in (("betapartner", beta, "CN=alpha-2027"),
                               ("gammapartner", gamma, "CN=alpha-2026")):
        result = selftest.run(session, _store(alpha), name, "olga", wait=0)
        assert result.ok, result.summary  # each verifies with what it has
        assert received_from_alpha(side) == [signer], name
        delivery = send_from_alpha(hub, session, name)  # a business message too
        assert delivery.state == "delivered", delivery.last_result
        assert received_from_alpha(side) == [signer], name
    # our MDNs too: each partner's test to ALPHA gets a receipt signed as it can verify
    for side, actor, signer in ((beta, "bruno", "CN=alpha-2027"),
                                (gamma, "gina", "CN=alpha-2026")):
        with side as other:
            result = selftest.run(other, _store(side), "alphapartner", actor, wait=0)
            assert result.ok, result.summary
        assert answer_of(side, "receipt") == [signer]
    # the old certificate still decrypts what GAMMA encrypts to it, until it ends
    old = post_to_alpha(alpha, keys["gamma"], keys["alpha_old"][0], "gamma-old-1")
    assert b"processed\r\n" in old.content and b"failed" not in old.content.lower()
    assert signed_by(lib.wire(old.headers.items(), old.content)) == ["CN=alpha-2026"]
    later(monkeypatch, 31)
    gone = post_to_alpha(alpha, keys["gamma"], keys["alpha_old"][0], "gamma-old-2")
    assert b"decryption-failed" in gone.content.lower()
    # no certificate GAMMA accepted is valid any more: the offered one signs for it too
    assert signer_of(session, "alphaco", "gammapartner") == "CN=alpha-2027"
    found = profiles.by_party(session, "alphaco")
    [warning] = lib.warnings_of(found, "signing", partner="gammapartner")
    assert "that gammapartner accepted" in warning


def test_a_certificate_no_partner_took_is_removed(hubs, keys, session):
    request_from_alpha(session, keys["alpha_spare"])
    assert "CN=alpha-spare" in [c.subject for c in profiles.get_profile(
        session, "organization", "alphaco").certificates]  # decrypts while it is open
    _alpha, beta = hubs
    with beta as beta_session:
        [pending] = requests_of(beta_session, "alphapartner")
        AS2_PROFILES.run_action(beta_session, "partner", "alphapartner", "cem_reject",
                                {"request_id": pending["id"]}, "bruno")
    [rejected] = requests_of(session, "betapartner")
    assert rejected["state"] == "rejected"
    org = profiles.get_profile(session, "organization", "alphaco")
    assert [c.subject for c in org.certificates] == ["CN=alpha-2026"]
    assert org.settings[profiles.GATES] == {}


def post_to_alpha(alpha: Side, pair: tuple[str, str], to_cert: str,
                  message_id: str) -> requests.Response:
    """A message to ALPHA signed by pyas2lib as GAMMA with ``pair``, encrypted to
    ``to_cert``, asking for a signed synchronous MDN."""
    return post_from_acme(SimpleNamespace(url=alpha.receiver), pair, to_cert, message_id,
                          ids=("GAMMA", "ALPHA"))


def test_an_unanswered_request_alerts_and_auto_accept_answers(hubs, keys, session,
                                                               monkeypatch):
    alpha, beta = hubs
    sent = request_from_alpha(session, keys["alpha_spare"], usages=["signing"],
                              respond_by=(NOW + dt.timedelta(hours=1)).isoformat() + "Z")
    later(monkeypatch, 1 / 12)  # two hours on; BETA's operator did not answer
    assert cem.run_due(session, _store(alpha), lib.utcnow()) == 1
    [overdue] = requests_of(session, "betapartner")
    assert overdue["state"] == "overdue"
    alert = session.scalar(select(Alert).where(Alert.kind == "cem_unanswered"))
    assert alert is not None and sent["request_id"] in alert.subject
    assert alert.resolved_at is None and "has no answer" in alert.text
    assert signer_of(session, "alphaco") == "CN=alpha-2026"  # nothing switched

    # late, BETA takes CEM requests automatically: its job sends the response
    with beta as beta_session:
        beta_session.expire_all()
        profiles.save_profile(beta_session, "partner", "alphapartner",
                              {"cem_auto_accept": True})
        beta_session.commit()
    again = request_from_alpha(session, keys["alpha_spare"], usages=["signing"])
    with beta as beta_session:
        by_id = {r["request_id"]: r for r in requests_of(beta_session, "alphapartner")}
        assert by_id[sent["request_id"]]["state"] == "pending"  # the operator's still
        auto = by_id[again["request_id"]]
        assert auto["state"] == "accepted" and auto["response"] == "owed"
        assert lines(beta_session, "automatically (cem_auto_accept) accepted")
        assert cem.run_due(beta_session, _store(beta), lib.utcnow()) == 1
        by_id = {r["request_id"]: r for r in requests_of(beta_session, "alphapartner")}
        assert by_id[again["request_id"]]["response"] == "sent"
    by_id = {r["request_id"]: r for r in requests_of(session, "betapartner")}
    assert by_id[again["request_id"]]["state"] == "accepted"
    assert by_id[sent["request_id"]]["state"] == "overdue"
    assert signer_of(session, "alphaco") == "CN=alpha-spare"


def _store_here():
    from b2bhub.plugin import payload_store
    return payload_store()


def _store(side: Side):
    from b2bhub.plugin import payload_store
    with side.app.app_context():
        return payload_store()


def post_signed(side: Side, pair: tuple[str, str], to_cert: str,
                message_id: str) -> requests.Response:
    """A message to BETA signed by pyas2lib as ALPHA with ``pair``."""
    return post_from_acme(SimpleNamespace(url=side.receiver), pair, to_cert, message_id,
                          ids=("ALPHA", "BETA"))


# --- Mendelson's format ---------------------------------------------------------------

def mendelson_request(cert_pem: str) -> tuple[bytes, str]:
    """The sample request XML as Mendelson writes it, in its multipart/related with the
    certificate part; (body, Content-Type)."""
    cert = cem_xml.certificate_pem(cert_pem.encode())
    issuer, serial = cem_xml.identify(cert)
    xml = (SAMPLES / "mendelson_request.xml").read_text().replace(
        "{ISSUER}", issuer).replace("{SERIAL}", serial)
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding, pkcs7
    der = pkcs7.serialize_certificates([x509.load_pem_x509_certificate(cert.encode())],
                                       Encoding.DER)
    boundary = "----=_Part_1_1234567.1700000000000"
    body = (f"--{boundary}\r\nContent-Type: application/ediint-cert-exchange+xml\r\n"
            f"Content-ID: <request-root@mendelson>\r\n\r\n{xml}\r\n"
            f"--{boundary}\r\nContent-Type: application/pkcs7-mime; smime-type=certs-only\r\n"
            "Content-Transfer-Encoding: base64\r\n"
            f"Content-ID: <acme-cert-2027@mendelson>\r\n\r\n"
            f"{base64.encodebytes(der).decode()}\r\n--{boundary}--\r\n").encode()
    return body, (f'multipart/related; type="application/ediint-cert-exchange+xml"; '
                  f'boundary="{boundary}"; start="<request-root@mendelson>"')


def test_a_mendelson_format_request_is_parsed_and_answered(as2, partner, session,  # noqa: F811
                                                           api):
    """A Mendelson partner (unsigned, as some set it up) sends its new certificate; an
    admin accepts it through the API and the pyas2lib partner gets our response."""
    new_cert, _key = make_cert("acme-2027", NOW - dt.timedelta(days=1),
                               NOW + dt.timedelta(days=400))
    as2.choose(sign=False, encrypt=False, mdn_signed=False)
    parsed = cem_xml.read_entity(_entity(*mendelson_request(new_cert)))
    assert parsed.request_id == "MENDELSON_CEM_REQUEST_1700000000000"
    assert parsed.trusts[0].usages == ["encryption", "signing"]
    assert parsed.trusts[0].respond_by == dt.datetime(2027, 1, 31, 12, 0)
    body, kind = mendelson_request(new_cert)
    answer = requests.post(as2.url, data=body, timeout=30, headers={
        "AS2-From": "ACME", "AS2-To": "HUB", "AS2-Version": "1.2",
        "Message-ID": "<MENDELSON-1700000000000@mendelson-as2>", "Content-Type": kind,
        "Subject": "Certificate Exchange Request"})
    assert answer.status_code == 200, answer.text
    assert "CEM request MENDELSON_CEM_REQUEST_1700000000000 from acme: pending" \
        in answer.text
    assert [m for m in as2.messages() if m.source == "as2in"] == []  # never routed
    url = "/api/v1/partners/acme/profiles/as2/actions/"
    missing = api.post(url + "cem_accept", json={"request_id": "no-such-request"})
    assert missing.status_code == 404
    accepted = api.post(url + "cem_accept", json={
        "request_id": "MENDELSON_CEM_REQUEST_1700000000000"})
    assert accepted.status_code == 200, accepted.get_json()
    assert accepted.get_json()["response"] == "sent", accepted.get_json()["steps"]
    again = api.post(url + "cem_reject", json={
        "request_id": "MENDELSON_CEM_REQUEST_1700000000000", "reason": "changed my mind"})
    assert again.status_code == 422 and "accepted already" in again.get_json()["error"]["message"]
    resent = requests.post(as2.url, data=body, timeout=30, headers={
        "AS2-From": "ACME", "AS2-To": "HUB", "AS2-Version": "1.2", "Content-Type": kind,
        "Message-ID": "<MENDELSON-1700000000001@mendelson-as2>"})
    assert "again; it is accepted already" in resent.text  # not a second request
    assert len(requests_of(session, "acme")) == 1
    [got] = [r for r in partner.received() if r["content"] and b"EDIINTCertificate"
             in base64.b64decode(r["content"])]
    response = cem_xml.parse_xml(base64.b64decode(got["content"]))
    assert response.request_id == "MENDELSON_CEM_REQUEST_1700000000000"
    assert response.trusts[0].accepted
    assert response.trusts[0].serial == cem_xml.identify(new_cert)[1]
    subjects = [c.subject for c in profiles.get_profile(session, "partner", "acme")
                .certificates]
    assert "CN=acme-2027" in subjects and len(subjects) == 2  # the old one kept


def _entity(body: bytes, kind: str):
    from email import message_from_bytes, policy
    return message_from_bytes(f"Content-Type: {kind}\r\n\r\n".encode() + body,
                              policy=policy.compat32)


def test_the_cem_xml_refuses_what_it_cannot_read():
    bomb = (b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]>'
            b"<EDIINTCertificateExchangeRequest><RequestID>&a;</RequestID>"
            b"</EDIINTCertificateExchangeRequest>")
    for bad, said in ((bomb, "not XML we read"), (b"<Other><RequestID>1</RequestID></Other>",
                                                   "no CEM document"),
                      (b"<EDIINTCertificateExchangeResponse><RequestID>1</RequestID>"
                       b"<TrustResponse><CertStatus>Maybe</CertStatus></TrustResponse>"
                       b"</EDIINTCertificateExchangeResponse>", "neither Accepted")):
        with pytest.raises(cem_xml.CemFormatError, match=said):
            cem_xml.parse_xml(bad)


def test_a_respond_by_that_is_no_date_is_refused_in_the_readers_language(
        hubs, keys, session):
    from b2bhub.domain import i18n
    from b2bhub.services.errors import ServiceError
    with pytest.raises(ServiceError) as refused:
        request_from_alpha(session, keys["alpha_new"], respond_by="next week")
    text = refused.value.args[0]
    assert str(text) == ("respond_by 'next week' is not a date and time (ISO 8601, e.g. "
                         "2027-01-31T12:00:00Z)")
    said = i18n.shown(text, i18n.translations("pt_BR").gettext)
    assert "next week" in said and "não é uma data" in said, said


# --- TLS: a partner's HTTPS server certificate, our client certificate ----------------

def serve_tls(side: Side, pair: tuple[str, str], tmp_path: Path, client_ca: str | None = None):
    """``side``'s app served over HTTPS on loopback presenting ``pair`` (asking for a
    client certificate ``client_ca`` verifies when given); (its receiver URL, the
    server)."""
    import ssl

    from werkzeug.serving import make_server
    path = tmp_path / f"tls-{len(list(tmp_path.glob('tls-*')))}.pem"
    path.write_text(pair[1] + pair[0])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(path))
    if client_ca:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=client_ca)
    server = make_server("127.0.0.1", 0, side.app, threaded=True, ssl_context=context)
    serve_in_thread(server)
    return f"https://localhost:{server.server_port}/as2/as2in", server


def stop(server) -> None:
    server.shutdown()
    server.server_close()


def tls_step(result) -> tuple[str, str]:
    found = next(s for s in result.steps if s.name == "tls")
    return found.state, found.text


def test_a_partners_new_tls_server_certificate_is_trusted_by_our_sender(hubs, keys, session,
                                                                          tmp_path):
    alpha, beta = hubs
    # BETA's HTTPS server today and tomorrow: leaves of two CAs ALPHA does not hold
    old = make_issued(make_ca("Beta TLS CA 2026"), "beta-tls-2026")
    new = make_issued(make_ca("Beta TLS CA 2027"), "beta-tls-2027")
    old_url, old_server = serve_tls(beta, old, tmp_path)
    new_url, new_server = serve_tls(beta, new, tmp_path)
    try:
        profiles.save_profile(session, "partner", "betapartner", {
            "url": old_url, "tls_ca_bundle": old[0], "tls_system_trust": False})
        session.commit()
        assert selftest.run(session, _store(alpha), "betapartner", "olga", wait=0).ok
        # the new server's certificate is not trusted yet: the connection test fails at TLS
        profiles.save_profile(session, "partner", "betapartner", {"url": new_url})
        session.commit()
        before = selftest.run(session, _store(alpha), "betapartner", "olga", wait=0)
        state, text = tls_step(before)
        assert not before.ok and state == "failed" and "not trusted" in text, text
        profiles.save_profile(session, "partner", "betapartner", {"url": old_url})
        session.commit()

        with beta as beta_session:  # BETA's operator sends the new certificate for TLS
            sent = AS2_PROFILES.run_action(beta_session, "partner", "alphapartner",
                                           "cem_request", {
                                               "certificate": {"pem": new[0],
                                                               "private_key_pem": new[1]},
                                               "usages": ["tls"]}, "bruno")
            beta_session.commit()
            assert sent["state"] == "sent" and sent["usages"] == ["tls"]
            # no AS2 certificate of BETA's: the TLS one is kept in the request only
            assert [c.subject for c in profiles.get_profile(
                beta_session, "organization", "betaco").certificates] == ["CN=beta-2026"]
        [pending] = requests_of(session, "betapartner")
        assert pending["state"] == "pending"
        assert pending["trusts"][0]["usages"] == ["tls_server", "tls_client"]
        session.expire_all()
        assert profiles.get_profile(session, "partner", "betapartner").settings[
            "tls_ca_bundle"] == old[0]  # nothing taken before the operator says so
        answered = AS2_PROFILES.run_action(session, "partner", "betapartner", "cem_accept",
                                           {"request_id": pending["id"]}, "olga")
        session.commit()
        assert answered["state"] == "accepted" and answered["response"] == "sent"

        session.expire_all()
        found = profiles.get_profile(session, "partner", "betapartner")
        bundle = found.settings["tls_ca_bundle"]
        assert old[0].strip() in bundle and new[0].strip() in bundle  # appended, old kept
        assert [c.subject for c in found.certificates] == ["CN=beta-2026"]  # no AS2 one
        [line] = lines(session, "trusted for TLS")
        assert line.startswith("the certificate CN=beta-tls-2027 of betapartner (issued by ")
        # ALPHA's sender now verifies the new server, a leaf of a CA it does not hold,
        # and the old one still
        profiles.save_profile(session, "partner", "betapartner", {"url": new_url})
        session.commit()
        after = selftest.run(session, _store(alpha), "betapartner", "olga", wait=0)
        assert after.ok, after.summary
        assert "certificate chain verified" in tls_step(after)[1]
        profiles.save_profile(session, "partner", "betapartner", {"url": old_url})
        session.commit()
        assert selftest.run(session, _store(alpha), "betapartner", "olga", wait=0).ok
    finally:
        stop(old_server)
        stop(new_server)
    # at BETA: accepted; the certificate is its TLS client certificate for ALPHA now
    with beta as beta_session:
        [done] = requests_of(beta_session, "alphapartner")
        assert done["state"] == "accepted" and "key" not in done
        shown = profiles.profile_json(profiles.get_profile(
            beta_session, "partner", "alphapartner"), utcnow())
        assert shown["tls_client_certificate"]["subject"] == "CN=beta-tls-2027"
        assert shown["tls_client_certificate"]["has_private_key"]
        assert lines(beta_session, "the certificate CN=beta-tls-2027 is our TLS client "
                                   "certificate for alphapartner from ")


def test_our_tls_client_certificate_is_switched_when_the_partner_accepts_it(
        hubs, keys, session, tmp_path, monkeypatch):
    alpha, beta = hubs
    renewed_ca = make_ca("Alpha Client CA 2027")
    current = make_issued(make_ca("Alpha Client CA"), "alpha-client-2026", server=False)
    renewed = make_issued(renewed_ca, "alpha-client-2027", server=False)
    server_pair = make_issued(make_ca("Beta Server CA"), "beta-server")
    # BETA's HTTPS server asks for a client certificate of the renewed one's CA only
    url, server = serve_tls(beta, server_pair, tmp_path, client_ca=renewed_ca[0])
    try:
        with beta as beta_session:
            profiles.save_profile(beta_session, "partner", "alphapartner",
                                  {"cem_auto_accept": True})
            beta_session.commit()
        profiles.save_profile(session, "partner", "betapartner", {
            "tls_client_certificate": {"pem": current[0], "private_key_pem": current[1]}})
        session.commit()

        sent = request_from_alpha(session, renewed, usages=["tls"])
        with beta as beta_session:  # auto-accepted; its job sends the response
            assert cem.run_due(beta_session, _store(beta), lib.utcnow()) == 1
            bundle = profiles.get_profile(beta_session, "partner", "alphapartner").settings[
                "tls_ca_bundle"]
            assert renewed[0].strip() in bundle
        [done] = requests_of(session, "betapartner")
        assert done["request_id"] == sent["request_id"] and done["state"] == "accepted"
        assert "key" not in done and "tls_pending" not in done
        session.expire_all()
        found = profiles.get_profile(session, "partner", "betapartner")
        shown = profiles.profile_json(found, utcnow())
        assert shown["tls_client_certificate"]["subject"] == "CN=alpha-client-2027"
        assert shown["tls_client_certificate"]["issuer"] == "CN=Alpha Client CA 2027"
        assert [c.subject for c in found.certificates if c.usage == "tls_client"] \
            == ["CN=alpha-client-2027"]
        # one TLS client certificate: the one before it replaced; no AS2 certificate added
        assert [c.subject for c in profiles.get_profile(
            session, "organization", "alphaco").certificates] == ["CN=alpha-2026"]
        assert lines(session, "the certificate CN=alpha-client-2027 is our TLS client "
                              "certificate for betapartner from ")
        # a real mutual TLS handshake: BETA's server takes ALPHA's new client certificate
        profiles.save_profile(session, "partner", "betapartner", {
            "url": url, "tls_ca_bundle": server_pair[0], "tls_system_trust": False})
        session.commit()
        result = selftest.run(session, _store(alpha), "betapartner", "olga", wait=0)
        assert result.ok, result.summary
        assert "client certificate CN=alpha-client-2027 sent" in tls_step(result)[1]
    finally:
        stop(server)

    # a certificate that starts later: ours from its start, switched by the job then
    profiles.save_profile(session, "partner", "betapartner", {"url": beta.receiver})
    session.commit()
    sent = request_from_alpha(session, keys["alpha_new"], usages=["tls"])
    with beta as beta_session:
        assert cem.run_due(beta_session, _store(beta), lib.utcnow()) == 1
    by_id = {r["request_id"]: r for r in requests_of(session, "betapartner")}
    waiting = by_id[sent["request_id"]]
    assert waiting["state"] == "accepted" and "key" not in cem.public(waiting)
    start = NOW + dt.timedelta(days=2)
    assert abs(cem._when(waiting["tls_pending"]) - start) < dt.timedelta(seconds=1)
    assert cem.run_due(session, _store(alpha), lib.utcnow()) == 0  # not due yet
    session.expire_all()
    assert profiles.profile_json(profiles.get_profile(session, "partner", "betapartner"),
                                 utcnow())["tls_client_certificate"]["subject"] \
        == "CN=alpha-client-2027"
    later(monkeypatch, 3)
    assert cem.run_due(session, _store(alpha), lib.utcnow()) == 1
    session.expire_all()
    found = profiles.get_profile(session, "partner", "betapartner")
    assert profiles.profile_json(found, utcnow())["tls_client_certificate"]["subject"] \
        == "CN=alpha-2027"
    assert [c.subject for c in found.certificates if c.usage == "tls_client"] \
        == ["CN=alpha-2027"]
    done = {r["request_id"]: r for r in cem.records(found.settings)}[sent["request_id"]]
    assert "tls_pending" not in done and "key" not in done
    assert lines(session, "the certificate CN=alpha-2027 is our TLS client certificate for "
                          "betapartner from now")


def test_certificate_exchange_is_offered_on_a_partners_profile_alone(api, hub, registry):
    """CEM sends our new certificate to a partner, or answers a partner's: its actions
    are a partner's AS2 profile's. The document lists them there alone, and on an
    organization's profile the same address answers 404, naming no action offered."""
    registry.register(As2Receiver)
    hub.parties(organizations=("mycompany",), partners=("acme",))
    doc = api.get("/api/v1/openapi.json").get_json()
    assert sorted(path for path in doc["paths"] if "/profiles/as2/actions/" in path) == [
        f"/api/v1/partners/{{name}}/profiles/as2/actions/{action}"
        for action in ("cem_accept", "cem_reject", "cem_request")]
    refused = api.post("/api/v1/organizations/mycompany/profiles/as2/actions/cem_accept",
                       json={"request_id": "CEM-1"})
    assert refused.status_code == 404
    assert refused.get_json()["error"]["message"] == (
        "the AS2 profile has no action 'cem_accept'; offered: none")
    offered = api.post("/api/v1/partners/acme/profiles/as2/actions/cem_accept",
                       json={"request_id": "CEM-1"})
    assert offered.status_code == 404  # offered: the partner has no such request
    assert "offered" not in offered.get_json()["error"]["message"]
