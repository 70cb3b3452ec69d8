"""A partner's AS2 connection test ("Test connection", docs/as2.md "Connection test").

It sends a small test message, built as the partner's profile says (signed, encrypted,
compressed, the MDN asked for) with the subject :data:`SUBJECT` and the header
:data:`TEST_HEADER`, and reports each step: name resolution, TCP connect, TLS (the
certificate chain as the profile's TLS settings verify it, the server certificate's
expiry, our client certificate taken), the message built, the HTTP status, the MDN, its
signature and the MIC. The steps after the first failure are not run.

The test message is a message of its own (source ``(connection test)``, no deliveries,
never routed: :func:`b2bhub.plugin.store_test_message`) from the organization to
the partner, with the operator's line, the stages sent and received, the result line and
an outcome (Delivered when every step passed, else Error). An asynchronous MDN is
waited for up to ``wait`` seconds (it arrives at our AS2 receiver, which records it on
the test message: :func:`plugins.as2.mdn_in.receive_mdn`); when none came by then, the
MDN steps are ``pending`` and the test message stays Awaiting receipt until it comes.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import asdict
from urllib.parse import urlsplit

import requests
from cryptography import x509

from b2bhub.plugin import (
    N_,
    TEST_SOURCE,
    ConnectionTest,
    NewMessage,
    NotFound,
    ServiceError,
    TestStep,
    add_line,
    finish_test_message,
    latest_line,
    no_profile,
    profile_parties,
    record_stage,
    store_test_message,
    utcnow,
)
from plugins.as2 import lib, mdn_in, profiles, sender, tls
from plugins.as2.models import As2Outbound

SUBJECT = "b2bhub AS2 connection test (not a business message)"
#: the header that marks the test message for the partner
TEST_HEADER = ("X-B2bhub-Test", "connection-test")
#: the history line the receiver writes for a test message's MDN
#: each step's name and label; the page shows the label through the UI's catalog
STEPS = (("dns", N_("Name resolution")), ("tcp", N_("TCP connect")), ("tls", "TLS"),
         ("message", N_("Test message built")), ("http", N_("HTTP status")),
         ("mdn", N_("MDN received")), ("mdn_signature", N_("MDN signature")), ("mic", "MIC"))
LABELS = dict(STEPS)
CONNECT_TIMEOUT = 10.0
ANSWER_TIMEOUT = 60.0
#: how long the TLS step waits after the handshake for the server's word on our client
#: certificate (TLS 1.3 servers refuse it after the handshake has completed for us)
CLIENT_VERDICT = 0.5
POLL = 0.2


class _Steps:
    """The steps found so far; after a failure the rest are not run."""

    def __init__(self) -> None:
        self.steps: list[TestStep] = []

    def add(self, name: str, state: str, text: str) -> bool:
        self.steps.append(TestStep(name, LABELS[name], state, text))
        return state != "failed"

    @property
    def failed(self) -> TestStep | None:
        return next((s for s in self.steps if s.state == "failed"), None)

    def finish(self) -> tuple[TestStep, ...]:
        failed = self.failed
        done = {s.name for s in self.steps}
        rest = [TestStep(n, label, "not_run", N_("not run: %(step)s failed",
                                                 step=failed.label))
                for n, label in STEPS if n not in done] if failed else []
        return tuple(self.steps + rest)


def run(session, store, name: str, actor: str, organization: str | None = None,
        wait: float = 20.0) -> ConnectionTest:
    partner, org = _profiles(session, name, organization)
    url = partner.get("url")
    if not url:
        raise ServiceError(N_("the AS2 profile of '%(name)s' has no url", name=name),
                           {"url": "required"})
    now = utcnow()
    data = (f"b2bhub AS2 connection test from {org.party} to {partner.party} at "
            f"{now:%Y-%m-%d %H:%M:%S} UTC, run by {actor}. Not a business message.\r\n"
            ).encode()
    stored = store.put(data)
    message_id = store_test_message(session, NewMessage(
        source=TEST_SOURCE, from_party=org.party, to_party=partner.party,
        stages={"unpacked": (stored.digest, stored.size)},
        original_filename="connection-test.txt", actor=actor,
        lines=[{"type": "connection_test", "actor": actor,
                "text": f"{actor} ran the AS2 connection test of partner {partner.party} "
                        f"({url}) from {org.party}"}]), now)
    session.commit()
    steps = _Steps()
    try:
        _run(session, store, steps, message_id, org, partner, url, wait, data)
    finally:
        session.rollback()  # whatever a failed step left; the test's rows are committed
    found = steps.finish()
    return _finish(session, message_id, partner.party, url, found, actor)


def _profiles(session, name: str, organization: str | None):
    partner = profiles.by_party(session, name)
    if partner is None or partner.kind != "partner":
        raise NotFound(no_profile("partner", name, "AS2"))
    if organization:
        org = profiles.by_party(session, organization)
        if org is None or org.kind != "organization":
            raise NotFound(no_profile("organization", organization, "AS2"))
        return partner, org
    names = profile_parties(session, profiles.PROTOCOL, "organization")
    if len(names) != 1:
        raise ServiceError(N_("name the organization that sends the test (%(names)s)",
                              names=", ".join(names)) if names else
                           N_("name the organization that sends the test (no organization "
                              "has an AS2 profile)"),
                           {"organization": "required"})
    return partner, profiles.by_party(session, names[0])


def _run(session, store, steps: _Steps, message_id: int, org, partner, url: str,
         wait: float, data: bytes) -> None:
    parts = urlsplit(url)
    https = parts.scheme.lower() == "https"
    host, port = parts.hostname or "", parts.port or (443 if https else 80)
    addresses = _resolve(steps, host, port)
    if not addresses:
        return
    sock = _connect(steps, addresses)
    if sock is None:
        return
    with sock:
        if not https:
            steps.add("tls", "skipped", N_("http:// URL: no TLS"))
        elif not _tls(steps, sock, host, port, partner):
            return
    built = _build(session, store, steps, message_id, org, partner, data)
    if built is None:
        return
    message, headers, body, row = built
    answer = _send(steps, partner, headers, body)
    if answer is None:
        return
    mode = partner.get("mdn_mode")
    if mode == "none":
        for step in ("mdn", "mdn_signature", "mic"):
            steps.add(step, "skipped", N_("the profile asks for no MDN"))
        return
    if mode == "sync":
        raw = lib.wire(answer.headers.items(), answer.content)
        if not mdn_in.looks_like_mdn(lib.read_headers(raw.partition(b"\r\n\r\n")[0]), raw):
            steps.add("mdn", "failed", N_(
                "the answer carries no MDN (Content-Type %(type)s), although the profile "
                "asks for a synchronous one", type=answer.headers.get("Content-Type", "none")))
            return
        receipt = mdn_in.read_mdn(raw, lambda _i, _r: mdn_in.original_message(row, org,
                                                                                partner))
        mdn_in.record_receipt(session, message_id, store.put(raw), utcnow())
        session.commit()
        _mdn_steps(steps, receipt, partner, N_("synchronous MDN in the answer"))
        return
    receipt = _wait_async(session, message_id, wait)
    if receipt is None:
        text = N_("asked for an asynchronous MDN to %(url)s; none came within %(wait)s s: "
                  "it is recorded on the test message when it comes",
                  url=org.get("mdn_url") or "?", wait=f"{wait:g}")
        steps.add("mdn", "pending", text)
        for step in ("mdn_signature", "mic"):
            steps.add(step, "pending", N_("checked when the MDN comes"))
        return
    _mdn_steps(steps, receipt, partner, N_("asynchronous MDN"))


def _resolve(steps: _Steps, host: str, port: int) -> list:
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        steps.add("dns", "failed", N_("%(host)s cannot be resolved: %(why)s",
                                      host=host or "(no host)", why=str(exc)))
        return []
    addresses = list(dict.fromkeys(f[4][:2] for f in found))
    steps.add("dns", "ok", N_("%(host)s is %(addresses)s", host=host,
                              addresses=", ".join(a for a, _p in addresses)))
    return [(f[0], f[4]) for f in found]


def _connect(steps: _Steps, addresses: list) -> socket.socket | None:
    problems = []
    for family, address in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT)
        start = time.monotonic()
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            problems.append(f"{_where(address)}: {exc.strerror or exc}")
            continue
        steps.add("tcp", "ok", N_("connected to %(where)s in %(ms)s ms",
                                  where=_where(address),
                                  ms=f"{(time.monotonic() - start) * 1000:.0f}"))
        return sock
    steps.add("tcp", "failed", N_("could not connect: %(why)s", why="; ".join(problems)))
    return None


def _where(address) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _tls(steps: _Steps, sock: socket.socket, host: str, port: int, partner) -> bool:
    client = partner.tls_client
    try:
        conn = tls.context_for(partner).wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        peer = tls.peer_certificate(host, port, CONNECT_TIMEOUT)
        shown = f"; the server presents {tls.describe_certificate(peer)}" if peer else ""
        return steps.add("tls", "failed", tls.explain(exc, partner) + shown)
    except (ssl.SSLError, OSError) as exc:
        return steps.add("tls", "failed", tls.explain(exc, partner))
    with conn:
        cert = x509.load_der_x509_certificate(conn.getpeercert(binary_form=True))
        version = conn.version()
        conn.settimeout(CLIENT_VERDICT)
        try:
            closed = conn.recv(1) == b""
        except TimeoutError:
            closed = False
        except ssl.SSLZeroReturnError:
            closed = True
        except (ssl.SSLError, OSError) as exc:
            return steps.add("tls", "failed", tls.explain(exc, partner))
    if closed:
        return steps.add("tls", "failed", N_(
            "the server closed the connection right after the TLS handshake (it may refuse "
            "our client certificate: %(ours)s)",
            ours=client.subject if client else N_("none configured")))
    now = utcnow()
    left = cert.not_valid_after_utc.replace(tzinfo=None) - now
    ours = N_("client certificate %(subject)s sent", subject=client.subject) if client \
        else N_("no client certificate configured")
    if left <= profiles.EXPIRY_WARNING:
        return steps.add("tls", "ok", N_(
            "%(version)s, certificate chain verified; server certificate %(cert)s; warning: "
            "it ends within %(days)s days; %(ours)s", version=version,
            cert=tls.describe_certificate(cert), days=profiles.EXPIRY_WARNING.days,
            ours=ours))
    return steps.add("tls", "ok", N_(
        "%(version)s, certificate chain verified; server certificate %(cert)s; %(ours)s",
        version=version, cert=tls.describe_certificate(cert), ours=ours))


def _build(session, store, steps: _Steps, message_id: int, org, partner, data: bytes):
    roles = ((org, "signing", partner.get("sign")),
             (partner, "encryption", partner.get("encrypt")))
    refused = next(filter(None, (lib.refusal(p, r, partner=partner.party)
                                 for p, r, on in roles if on)), None)
    if refused:
        steps.add("message", "failed", refused)
        return None
    message = lib.Message(lib.organization(org, partner=partner.party), lib.partner(partner))
    try:
        lib.build_message(message, data,
                          filename="connection-test.txt", content_type="text/plain",
                          subject=SUBJECT,
                          disposition_notification_to=lib.disposition_notification_to(org),
                          key_encryption=partner.get("key_encryption"))
    except Exception as exc:  # a key or certificate pyas2lib cannot use
        steps.add("message", "failed", N_("the test message could not be built: %(why)s",
                                          why=str(exc)))
        return None
    body = message.content if isinstance(message.content, bytes) else b""
    headers = dict(message.headers)
    headers["User-Agent"] = lib.PRODUCT
    headers[TEST_HEADER[0]] = TEST_HEADER[1]
    row = As2Outbound(message_id=message_id, target=TEST_SOURCE,
                      as2_message_id=message.message_id, partner=partner.party,
                      mic=message.mic.decode() if message.mic else None,
                      digest_alg=message.digest_alg,
                      mdn_signed=bool(partner.get("mdn_signed")))
    session.add(row)
    record_stage(session, message_id, "sent", store.put(lib.wire(headers.items(), body)),
                 utcnow())
    add_line(session, message_id, "connection_test_sent",
             f"test message <{message.message_id}> built ({_security(partner)})",
             now=utcnow())
    session.commit()
    steps.add("message", "ok", f"<{message.message_id}>, {len(body)} bytes, "
              f"{_security(partner)}")
    return message, headers, body, row


def _security(partner) -> str:
    said = [f"signed {partner.get('digest_alg')}" if partner.get("sign") else "unsigned",
            f"encrypted {partner.get('encryption_alg')}" if partner.get("encrypt")
            else "not encrypted"]
    if partner.get("compress"):
        said.append("compressed")
    mode = partner.get("mdn_mode")
    said.append("no MDN asked" if mode == "none" else
                f"{'signed' if partner.get('mdn_signed') else 'unsigned'} {mode} MDN asked")
    return ", ".join(said)


def _send(steps: _Steps, partner, headers: dict, body: bytes):
    try:
        answer, note = sender.post(partner, headers, body, bool(partner.get("chunked")),
                                   (CONNECT_TIMEOUT, ANSWER_TIMEOUT))
    except requests.exceptions.SSLError as exc:
        steps.add("http", "failed", N_("TLS failed while sending: %(why)s",
                                       why=tls.explain(exc, partner)))
        return None
    except requests.RequestException as exc:
        steps.add("http", "failed", N_("the POST failed: %(why)s", why=str(exc)))
        return None
    code = answer.status_code
    if not 200 <= code < 300:
        steps.add("http", "failed", f"HTTP {code} {answer.reason or ''}: "
                  f"{answer.text[:200]}".strip())
        return None
    steps.add("http", "ok", f"HTTP {code} {answer.reason or ''}{note}".strip())
    return answer


def _wait_async(session, message_id: int, wait: float) -> mdn_in.Receipt | None:
    deadline = time.monotonic() + max(wait, 0)
    while True:
        receipt = recorded_receipt(session, message_id)
        if receipt is not None or time.monotonic() >= deadline:
            return receipt
        time.sleep(POLL)


def recorded_receipt(session, message_id: int) -> mdn_in.Receipt | None:
    """The MDN the receiver recorded for a test message, if one came (a fresh read)."""
    session.rollback()
    line = latest_line(session, message_id, mdn_in.TEST_MDN_LINE)
    data = line.data if line is not None else None
    return mdn_in.Receipt(**data["receipt"]) if data and data.get("receipt") else None


def _mdn_steps(steps: _Steps, receipt: mdn_in.Receipt, partner, how: str) -> None:
    """The MDN, signature and MIC steps of a receipt, as :func:`mdn_in.judge` sees it."""
    status, detail = receipt.status, receipt.detail
    if receipt.signature_error is not None:  # pyas2lib read no disposition then
        steps.add("mdn", "ok", N_("%(how)s received for <%(id)s>", how=how,
                                  id=receipt.orig_id or "?"))
        steps.add("mdn_signature", "failed", N_(
            "the MDN's signature failed our verification with the partner's certificate "
            "(%(signers)s): %(why)s", signers=_signers(partner),
            why=receipt.signature_error))
        return
    if status == "failed/Failure" and detail and detail.startswith(mdn_in.UNREADABLE):
        steps.add("mdn", "failed", N_("%(how)s could not be read: %(why)s", how=how,
                                      why=detail))
        return
    steps.add("mdn", "ok", N_("%(how)s received, disposition %(status)s: %(detail)s",
                              how=how, status=status, detail=detail) if detail else
              N_("%(how)s received, disposition %(status)s", how=how, status=status))
    signed_asked = bool(partner.get("mdn_signed"))
    if signed_asked and not receipt.signed:
        steps.add("mdn_signature", "failed",
                  N_("unsigned MDN, although a signed one was asked for"))
        return
    if receipt.signed:
        steps.add("mdn_signature", "ok", N_("verified with the partner's certificate "
                                            "(%(signers)s)", signers=_signers(partner)))
    else:
        steps.add("mdn_signature", "skipped", N_("the profile asks for an unsigned MDN"))
    ok, text = mdn_in.judge(receipt, bool(partner.get("accept_mdn_without_mic")))
    if not ok:
        steps.add("mic", "failed", text)
    elif receipt.mic:
        steps.add("mic", "ok", N_("the MDN confirms our MIC %(mic)s", mic=receipt.mic))
    elif receipt.signed:
        steps.add("mic", "ok", text)  # accepted without MIC: the text says so
    else:
        steps.add("mic", "skipped", N_("unsigned MDN without MIC: nothing to compare"))


def _signers(partner) -> str:
    found = [c.subject for c in partner.certs if c.serves("signing")]
    return "; ".join(found) or "none"


def _finish(session, message_id: int, partner: str, url: str, steps: tuple,
            actor: str) -> ConnectionTest:
    failed = next((s for s in steps if s.state == "failed"), None)
    pending = any(s.state == "pending" for s in steps)
    if failed is not None:
        summary = f"the AS2 connection test of {partner} failed at {failed.label}: {failed.text}"
    elif pending:
        summary = (f"the test message reached {partner} ({url}); its asynchronous MDN has "
                   "not come yet")
    else:
        summary = f"every step passed: {partner} takes AS2 messages at {url}"
    now = utcnow()
    add_line(session, message_id, "connection_test_result", summary[:2000], actor=actor,
             data={"steps": [asdict(s) for s in steps]}, now=now)
    finish_test_message(session, message_id, None if pending else failed is None, summary,
                        now, actor)
    session.commit()
    if pending and recorded_receipt(session, message_id) is not None:
        mdn_in.finish_pending_test(session, message_id, now)  # the MDN came meanwhile
    return ConnectionTest(ok=failed is None and not pending, steps=steps,
                          message_id=message_id, summary=summary)
