"""Sending AS2 (SPEC 9 ``as2_sender``): build per the partner profile, post, read the MDN.

Outcomes: a synchronous MDN that is positive with the MIC we computed → delivered; a
negative one or a MIC that differs → failed; asynchronous MDN → awaiting receipt until
the profile's Receipt Timeout; no MDN asked → delivered on a 2xx answer. 5xx, 429,
timeouts, connection and TLS failures are errors the retry policy retries; other answers
fail. Over https:// the partner profile's CA bundle and client certificate apply
(:mod:`.tls`); a TLS failure says what failed (the server's certificate, or ours). The
AS2 Message-ID is kept per (message, target) in ``as2_outbound``, so a retry or a Send
again repeats the same Message-ID (and the partner can recognise it). A stage over the
sender's ``stream_threshold`` is built on temp files and sent from its file
(:mod:`.stream`) instead of in memory by pyas2lib.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import requests
from sqlalchemy import select

from b2bhub.plugin import DeliveryInfo, Outcome, PayloadReader, add_line, record_stage
from plugins.as2 import lib, mdn_in, profiles, stream, tls
from plugins.as2.models import As2Outbound

CHUNK = 1 << 16


def _chunks(data: bytes | Path) -> Iterator[bytes]:
    if isinstance(data, Path):
        yield from stream.file_chunks(data)
        return
    for i in range(0, len(data), CHUNK):
        yield data[i:i + CHUNK]


def post(partner, headers: dict, body: bytes | Path, chunked: bool, timeout
         ) -> tuple[requests.Response, str]:
    """POST a built message to the partner (its profile's TLS); on 411 to a chunked
    body, once more with Content-Length. Returns the answer and how it was sent.
    ``body``: the bytes, or the file of a message built by :mod:`.stream` (read in
    chunks, never whole)."""
    url = partner.get("url")
    answer = _post(partner, url, headers, body, chunked, timeout)
    note = ""
    if answer.status_code == 411 and chunked:
        # Length Required: the partner takes no chunked body; once more with
        # Content-Length (README "AS2 defaults")
        answer = _post(partner, url, headers, body, False, timeout)
        note = " (411 to chunked: sent again with Content-Length)"
    return answer, note


def _post(partner, url: str, headers: dict, body: bytes | Path, chunked: bool, timeout
          ) -> requests.Response:
    """One POST: the body chunked (Transfer-Encoding) or whole (Content-Length)."""
    if chunked or not isinstance(body, Path):
        return tls.post(partner, url, headers=headers,
                        data=_chunks(body) if chunked else body, timeout=timeout)
    with open(body, "rb") as f:  # requests sends a file by its size, in blocks
        return tls.post(partner, url, headers={**headers, "Content-Length": str(
            body.stat().st_size)}, data=f, timeout=timeout)


def send(delivery: DeliveryInfo, payload: PayloadReader, context, config: dict) -> Outcome:
    stage = config.get("payload_stage") or "unpacked"
    if stage not in payload.stages():
        return Outcome.failed(f"the message has no '{stage}' payload stage")
    session = context.open_session()
    try:
        org = profiles.by_party(session, delivery.from_party)
        partner = profiles.by_party(session, delivery.to_party)
        if org is None or partner is None or org.kind != "organization":
            missing = delivery.from_party if org is None else delivery.to_party
            return Outcome.failed(f"no AS2 profile for '{missing}' (from must be an "
                                  "organization, to a partner, both with AS2 profiles)")
        if not partner.get("url"):
            return Outcome.failed(f"the AS2 profile of '{partner.party}' has no url")
        roles = ((org, "signing", partner.get("sign")),
                 (partner, "encryption", partner.get("encrypt")))
        refused = next(filter(None, (lib.refusal(p, r, partner=partner.party)
                                     for p, r, on in roles if on)), None)
        if refused:
            return Outcome.failed(refused)
        previous = session.scalar(select(As2Outbound).where(
            As2Outbound.message_id == delivery.message_id,
            As2Outbound.target == delivery.target))
        left, domain = (previous.as2_message_id.rsplit("@", 1) if previous
                        and "@" in previous.as2_message_id else (None, None))
        message = lib.Message(lib.organization(org, domain=domain, partner=partner.party),
                              lib.partner(partner))
        choices = dict(filename=delivery.original_filename,
                       content_type=partner.get("content_type"),
                       subject=partner.get("subject"), message_id=left,
                       disposition_notification_to=lib.disposition_notification_to(org),
                       key_encryption=partner.get("key_encryption"))
        if payload.size(stage) > stream.threshold(config) \
                and partner.get("encryption_alg") != "rc2_128_cbc":
            ws = stream.Workspace(context.store.root)
            return _send_streamed(ws, delivery, payload, context, config, session, org,
                                  partner, previous, roles, message, choices, stage)
        with payload.open(stage) as f:
            data = f.read()
        lib.build_message(message, data, **choices)
        body = message.content if isinstance(message.content, bytes) else b""
        headers = dict(message.headers)
        return _send(delivery, context, config, session, org, partner, previous, roles,
                     message, headers, body, message.mic, message.digest_alg)
    finally:
        session.close()


def _send_streamed(ws, delivery, payload, context, config, session, org, partner,
                   previous, roles, message, choices, stage) -> Outcome:
    """:func:`send` of a stage over the sender's ``stream_threshold``: built on temp files
    (:mod:`.stream`), sent from its file."""
    try:
        with payload.open(stage) as source:
            made = message.receiver
            built = stream.build(
                ws, source, sender=message.sender, receiver=made,
                sign_with=lib.sign_pair(message.sender) if made.sign else None,
                encrypt_for=lib.encrypt_cert(made) if made.encrypt else None, **choices)
        message.message_id = built.message_id
        return _send(delivery, context, config, session, org, partner, previous, roles,
                     message, built.headers, built.body, built.mic, built.digest_alg)
    finally:
        ws.close()


def _send(delivery, context, config, session, org, partner, previous, roles, message,
          headers: dict, body: bytes | Path, mic: bytes | None, digest_alg: str | None
          ) -> Outcome:
    """Record the sent stage, post the built message, judge the answer."""
    headers["User-Agent"] = lib.PRODUCT
    if isinstance(body, Path):
        block = lib.header_block(headers.items()) + b"\r\n"
        sent = context.store.put(stream.ChunkReader(stream.chained(
            block, stream.file_chunks(body))))
    else:
        sent = context.store.put(lib.wire(headers.items(), body))
    mic = mic.decode() if mic else None
    if previous is None:
        previous = As2Outbound(message_id=delivery.message_id, target=delivery.target,
                               as2_message_id=message.message_id, partner=partner.party)
        session.add(previous)
    previous.mic, previous.digest_alg = mic, digest_alg
    previous.mdn_signed = bool(partner.get("mdn_signed"))
    record_stage(session, delivery.message_id, "sent", sent, context.now)
    for p, r, on in roles:
        for warning in lib.warnings_of(p, r, partner=partner.party) if on else ():
            add_line(session, delivery.message_id, "warning", f"{delivery.target}: "
                     f"{warning}", delivery_id=delivery.id, now=context.now)
    session.commit()
    mode = partner.get("mdn_mode")
    context.wire_started()
    timeout = (10, float(config.get("timeout") or 120))
    chunked = bool(partner.get("chunked"))
    try:
        answer, note = post(partner, headers, body, chunked, timeout)
        sent_as = f"sent as <{message.message_id}>{note}"
    except requests.exceptions.SSLError as exc:
        return Outcome.error("tls", f"TLS failed: {tls.explain(exc, partner)}")
    except requests.Timeout as exc:
        return Outcome.error("timeout", f"timed out: {exc}")
    except requests.ConnectionError as exc:
        return Outcome.error("connection", f"connection failed: {exc}")
    code = answer.status_code
    if code >= 500:
        return Outcome.error("http_5xx", f"HTTP {code}: {answer.text[:200]}")
    if code == 429 or code == 408:
        return Outcome.error(f"http_{code}", f"HTTP {code}")
    if not 200 <= code < 300:
        return Outcome.failed(f"HTTP {code}: {answer.text[:200]}")
    if mode == "async":
        deadline = context.now + timedelta(seconds=partner.get("receipt_timeout"))
        return Outcome.awaiting_receipt(message.message_id, deadline,
                                        f"{sent_as}; MDN to follow")
    if mode != "sync":
        return Outcome.delivered(f"{sent_as}: HTTP {code}")
    raw = lib.wire(answer.headers.items(), answer.content)
    receipt = context.store.put(raw)
    read = mdn_in.read_mdn(
        raw, lambda _i, _r: mdn_in.original_message(previous, org, partner))
    mdn_in.record_receipt(session, delivery.message_id, receipt, context.now)
    profiles.note_peer_features(session, partner, answer.headers, "receipt", context.now)
    session.commit()
    ok, text = mdn_in.judge(read, bool(partner.get("accept_mdn_without_mic")))
    text = f"{sent_as}: {text}"
    return Outcome.delivered(text) if ok else Outcome.failed(text)

