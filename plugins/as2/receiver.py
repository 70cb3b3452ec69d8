"""Receiving AS2 (SPEC 9 ``as2_receiver``): messages from partners and MDNs for ours.

:func:`receive` takes what came over HTTP and returns the reply; it never raises for bad
input. The order of work:

1. Over ``max_size`` (by Content-Length, or while reading) → Refused without reading on.
2. An MDN (multipart/report, signed or not) settles a delivery of ours (:mod:`.mdn_in`).
3. AS2-From/AS2-To are looked up in the profiles (cached per process, see
   :class:`.profiles.ProfileCache`); a Message-ID the same partner had accepted already
   gets the stored receipt and a ``duplicate_received`` line, no message and no payload.
4. pyas2lib decrypts, decompresses, verifies the signature and computes the MIC, while
   a large raw stage (HTTP headers + body, what pyas2lib parses) is written to a temp
   file of the payload store (one up to :data:`SMALL_STAGE` is only hashed, and written
   with the sync). A signature that fails with the partner's canonicalisation is
   tried once with the other (text vs binary): partners differ on it. A body over the
   instance's ``stream_threshold`` is read into a temp file instead (:class:`Spool`,
   linked into the store as the raw stage) and parsed from there in bounded buffers
   (:mod:`.stream`), with the same checks, texts and MDN.
5. Accepted: the unpacked stage's EDI envelope is read from the content in memory (or as
   it streams into its stage), its attributes going in with the message; the instance's
   checks at intake apply (``check_intake``, docs/edi.md): with ``parties_from:
   "envelope"`` from and to are the envelope's parties; an interchange they refuse
   (envelope errors, a duplicate) is stored Refused with the reason, its MDN the
   positive one (the AS2 transfer succeeded), and a duplicate let through is alerted.
   The raw, unpacked and receipt stages are made durable and put in place by
   one sync, on a thread while the message, its deliveries and the ``as2_inbound`` row
   are inserted, and before that transaction commits; the positive MDN is returned
   (sync) or owed (async, sent by a worker) only after that commit. Refused: the message is stored
   with status Refused, the reason in its history, and a negative MDN where the partner
   asked for one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from email import policy
from email.parser import BytesHeaderParser
from typing import IO

from pyas2lib.exceptions import IntegrityError as SignatureError
from pyas2lib.exceptions import PartnerNotFound
from sqlalchemy import bindparam, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from b2bhub.plugin import (
    INTAKE_KEYS,
    ORGANIZATION,
    PARTNER,
    EndpointLookup,
    InspectingReader,
    IntakeChecks,
    IntakeRefusal,
    NewMessage,
    PayloadStore,
    StoredPayload,
    add_line,
    alert_duplicates,
    check_intake,
    connection,
    inspect_bytes,
    message_rows,
    store_and_dispatch_many,
    store_intake_refusal,
    store_refused,
)
from plugins.as2 import cem_xml, lib, mdn_in, profiles, stream
from plugins.as2.models import As2Inbound
from plugins.as2.replies import Reply, party_name
from plugins.as2.replies import text_reply as _text

log = logging.getLogger(__name__)
DEFAULT_MAX_SIZE = 100 * 1024 * 1024
TYPE = "as2_receiver"
CHUNK = 1 << 20
#: the Server header of our answers


#: a large raw stage is written here while the request parses, the stages made durable
#: here while the request inserts its rows
_writer = ThreadPoolExecutor(max_workers=4, thread_name_prefix="as2-store")
#: a stage up to this size is hashed on the request's thread and written with the sync,
#: on the writer's: the request goes on to its rows at once (writing the three temp
#: files of a small message cost it 1 ms here); a larger one is written as it comes
#: (the raw stage on the writer's thread while the message is parsed)
SMALL_STAGE = 64 * 1024


class _Stages:
    """The payload stages of one received message: temp files of one
    :class:`PayloadBatch` made durable and put in place together, by one sync, before
    the transaction that refers to them commits. A small stage is only hashed until
    then (its digest goes in the rows); the writer thread writes it with the sync."""

    def __init__(self, store: PayloadStore, raw: bytes | Spool | None):
        self._batch = store.batch()
        self._small: list[tuple[bytes, StoredPayload]] = []
        self._raw: Future | None = None
        self._durable: Future | None = None
        if isinstance(raw, Spool):  # linked into the batch, not copied
            self._raw = _writer.submit(raw.put, self._batch)
        elif raw is not None and len(raw) > SMALL_STAGE:
            self._raw = _writer.submit(self._batch.put, raw)
        elif raw is not None:
            self._raw = Future()
            self._raw.set_result(self._later(raw))

    def _later(self, data: bytes) -> StoredPayload:
        stored = StoredPayload(hashlib.sha256(data).hexdigest(), len(data))
        self._small.append((data, stored))
        return stored

    def raw(self) -> dict[str, tuple[str, int]]:
        """``{"raw": (digest, size)}`` once its digest is known (else empty)."""
        if self._raw is None:
            return {}
        stored = self._raw.result()
        return {"raw": (stored.digest, stored.size)}

    def add(self, data: bytes) -> tuple[str, int]:
        stored = self._later(data) if len(data) <= SMALL_STAGE else self._batch.put(data)
        return stored.digest, stored.size

    def add_stream(self, data: IO[bytes]) -> tuple[str, int]:
        """A stage read from a stream (in chunks, never whole)."""
        stored = self._batch.put(data)
        return stored.digest, stored.size

    def durable(self) -> Future:
        """Start writing the small stages and making every stage durable and in place
        (on a thread): wait for the future before committing the rows that refer to
        them."""
        if self._raw is not None:
            self._raw.result()
        small, self._small = self._small, []
        self._durable = _writer.submit(self._write_and_commit, small)
        return self._durable

    def _write_and_commit(self, small: list[tuple[bytes, StoredPayload]]) -> None:
        for data, stored in small:
            if self._batch.put(data) != stored:
                raise RuntimeError("a stage changed while it was written")
        self._batch.commit()

    def discard(self) -> None:
        """Remove what was written and not made durable (a no-op once it was)."""
        for started in (self._raw, self._durable):
            if started is not None:
                futures.wait([started])  # not while the writer thread still writes
        self._small = []
        self._batch.discard()


class Spool:
    """A body over the receiver's ``stream_threshold``: its raw stage (the header block,
    a blank line, the body) in a temp file of the payload store, the message parsed
    from there (:mod:`.stream`)."""

    def __init__(self, store: PayloadStore, block: bytes):
        self.ws = stream.Workspace(store.root)
        self.path = self.ws.new("raw")
        self.body_at = len(block) + 2
        self.headers = BytesHeaderParser(policy=policy.compat32).parsebytes(block)
        self._out = open(self.path, "wb")  # noqa: SIM115 (closed by finish/discard)
        self._out.write(block + b"\r\n")

    def write(self, data: bytes) -> None:
        self._out.write(data)

    def finish(self) -> Spool:
        self._out.close()
        return self

    def head(self, n: int) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.body_at)
            return f.read(n)

    def read(self) -> bytes:
        """The whole body (an MDN's: small)."""
        return self.head(-1)

    def put(self, batch) -> StoredPayload:
        with open(self.path, "rb") as f:
            return batch.put(f, link=self.path)

    def discard(self) -> None:
        self._out.close()
        self.ws.close()


def read_limited(stream: IO[bytes], limit: int) -> bytes | None:
    """The body, or None once it passes ``limit`` bytes (the rest is not read)."""
    parts, total = [], 0
    while True:
        chunk = stream.read(CHUNK)
        if not chunk:
            return b"".join(parts)
        total += len(chunk)
        if total > limit:
            return None
        parts.append(chunk)


def receive(session: Session, store: PayloadStore, instance: str, config: dict | None,
            headers: list[tuple[str, str]], body: IO[bytes], content_length: int | None,
            now: datetime, parties_from: str = "source",
            checks: IntakeChecks | None = None) -> Reply:
    """The reply to one request to the receiver ``instance``. ``config``: the instance's
    configuration when the caller looked it up already (it reads a large body only after
    that), and ``checks`` its intake checks (docs/edi.md; without them, the defaults
    with ``parties_from``); None to look both up here, with the rest
    (:func:`_lookups`), from a body the caller holds in memory."""
    block = lib.header_block(headers)
    found = lib.headers_of(headers, block)
    as2_from = lib.unquote(found.get("as2-from"))
    msgid = lib.message_id_of(found.get("message-id"))
    data = None if config is None else _read_body(body, content_length, config, store, block)
    # the partner as this process knows it, to look for its Message-ID in the same
    # statement; checked once the profiles version is read
    guess = profiles.profile_cache.peek(as2_from, PARTNER) if as2_from and msgid else None
    # the lookups are a transaction of their own, without BEGIN on PostgreSQL (one round
    # trip less: 0.1 and 0.2 ms median in one process, with and without alternating per
    # message, 300 messages, load 2.7-3.2); the rows then go in a transaction, BEGIN and
    # the insert while the stages are synced. Writing an accepted message by its one
    # statement in autocommit too (after the sync: it commits) spared the COMMIT but lost
    # that overlap: 26.62 against 25.09 and 24.26 against 24.16 ms median the same way
    # (load 3.7-4.1), so it is not done
    with _own_transaction(session):
        looked = _lookups(session, instance if config is None else None,
                          _accepted_key(guess.party, msgid) if guess else None)
    if config is None:
        if not looked.enabled:
            return no_receiver(instance)
        config = looked.config
        data = _read_body(body, content_length, config, store, block)
    else:
        looked.checks = checks or IntakeChecks(parties_from)
    if data is None:
        return _refuse_early(session, instance, found, _Stages(store, None), now,
                             f"the body is over the size limit of {_max_size(config)} bytes",
                             status=413)
    if not isinstance(data, Spool):
        return _received(session, store, instance, found, block + b"\r\n" + data, data,
                         now, looked, guess)
    try:
        if mdn_in.looks_like_mdn(found, data.head(4096)):  # an MDN: small, as always
            whole = data.read()
            return _received(session, store, instance, found, block + b"\r\n" + whole,
                             whole, now, looked, guess)
        return _received(session, store, instance, found, data, None, now, looked, guess)
    finally:
        data.discard()


def _received(session, store, instance, found, raw: bytes | Spool, data: bytes | None, now,
              looked, guess) -> Reply:
    """The reply to a body read (in memory: ``raw`` and ``data``, the body alone; or a
    :class:`Spool`, ``data`` None)."""
    as2_from, as2_to = (lib.unquote(found.get("as2-from")), lib.unquote(found.get("as2-to")))
    msgid = lib.message_id_of(found.get("message-id"))
    if data is not None and mdn_in.looks_like_mdn(found, data):
        stages = _Stages(store, raw)
        stages.durable().result()
        stored = stages.raw()["raw"]
        return mdn_in.receive_mdn(session, store, raw, StoredPayload(*stored), found, now,
                                  instance=instance)
    if not (as2_from and as2_to and msgid):
        missing = [h for h, v in (("AS2-From", as2_from), ("AS2-To", as2_to),
                                  ("Message-ID", msgid)) if not v]
        return _refuse_early(session, instance, found, _Stages(store, raw), now,
                             f"not an AS2 message: no {', '.join(missing)} header")
    known = looked.settings
    version = known.pop(profiles.VERSION_KEY)
    org = profiles.profile_cache.by_as2_id(session, version, as2_to, ORGANIZATION)
    partner = profiles.profile_cache.by_as2_id(session, version, as2_from, PARTNER)
    if partner is None:  # pyas2lib cannot build a signed MDN for nobody: refused here
        return _refuse_early(session, instance, found, _Stages(store, raw), now,
                             f"unknown-trading-partner: no partner has the AS2 ID "
                             f"'{as2_from}'", status=403,
                             to_party=org.party if org is not None else None)
    if org is not None:
        if guess is not None and guess.party == partner.party:
            duplicate_id = looked.duplicate  # looked up for this very party
        else:
            duplicate_id = _duplicate_id(session, partner.party, msgid)
        if duplicate_id is not None:
            return _duplicate(session, store, duplicate_id, partner.party, msgid, now)
    profiles.note_peer_features(session, partner, found, "message", now)  # on a change
    stages = _Stages(store, raw)  # the raw stage is written while the message is parsed
    parse = _stream_parse_and_store if isinstance(raw, Spool) else _parse_and_store
    try:
        return parse(session, store, instance, raw, stages, found, org, partner, msgid, now,
                     known, checks=looked.checks)
    except BaseException:
        stages.discard()  # nothing of it in place (a no-op once made durable)
        raise


def no_receiver(instance: str) -> Reply:
    return _text(404, f"no enabled AS2 receiver named '{instance}'")


def _max_size(config: dict) -> int:
    return int(config.get("max_size") or DEFAULT_MAX_SIZE)


def _read_body(body: IO[bytes], content_length: int | None, config: dict,
               store: PayloadStore, block: bytes) -> bytes | Spool | None:
    """The body, or None when it is over the instance's ``max_size`` (the rest is not
    read); one over its ``stream_threshold`` as a :class:`Spool`."""
    max_size = _max_size(config)
    if content_length is not None and content_length > max_size:
        return None
    limit = stream.threshold(config)
    if content_length is not None and content_length <= limit:
        return read_limited(body, max_size)
    parts: list[bytes] = []
    total, spool = 0, None
    while True:
        chunk = body.read(CHUNK)
        if not chunk:
            return spool.finish() if spool is not None else b"".join(parts)
        total += len(chunk)
        if total > max_size:
            if spool is not None:
                spool.discard()
            return None
        if spool is None and total > limit:
            spool = Spool(store, block)
            for part in parts:
                spool.write(part)
            parts = []
        if spool is not None:
            spool.write(chunk)
        else:
            parts.append(chunk)


@dataclass
class _Looked:
    enabled: bool
    config: dict
    settings: dict  # the profiles version and the intake's settings rows by key
    duplicate: int | None  # the as2_inbound row of an accepted key asked for
    #: the instance's intake checks, parties_from among them (docs/edi.md)
    checks: IntakeChecks = field(default_factory=IntakeChecks)


#: the settings rows a received message needs: the profiles version and the intake's
_KEYS = (profiles.VERSION_KEY, *INTAKE_KEYS)


#: what a request reads before parsing, in one statement (the core's intake fast path):
#: the settings rows of :data:`_KEYS` and the ``as2_inbound`` row of an accepted key
LOOKUP = EndpointLookup(TYPE, settings=_KEYS, extra={
    "duplicate": select(As2Inbound.id).where(
        As2Inbound.accepted_key == bindparam("accepted_key")).scalar_subquery()})


def _lookups(session: Session, instance: str | None, accepted_key: str | None) -> _Looked:
    """What a request reads before parsing, in one statement (each is a round trip to
    PostgreSQL, where the hub's own work per message is mostly waiting): the receiver
    instance (when ``instance`` is given), the settings rows of :data:`_KEYS`, and the
    ``as2_inbound`` row holding ``accepted_key`` (when given)."""
    looked = LOOKUP.run(session, instance, look_up_instance=instance is not None,
                        extra=("duplicate",) if accepted_key is not None else (),
                        accepted_key=accepted_key)
    return _Looked(enabled=bool(looked.enabled), config=dict(looked.config or {}),
                   settings=dict(looked.settings), duplicate=looked.extra["duplicate"],
                   checks=looked.checks)


def _duplicate_id(session: Session, partner: str, msgid: str) -> int | None:
    """The ``as2_inbound`` row of a Message-ID ``partner`` had accepted, if any."""
    return connection(session).execute(select(As2Inbound.id).where(
        As2Inbound.accepted_key == _accepted_key(partner, msgid))).scalar()


def _duplicate(session: Session, store: PayloadStore, inbound_id: int, partner: str,
               msgid: str, now: datetime) -> Reply:
    """The reply to a Message-ID accepted before (``as2_inbound`` row ``inbound_id``): its
    stored receipt, with a ``duplicate_received`` line; no message and no payload."""
    row = session.get(As2Inbound, inbound_id)
    add_line(session, row.message_id, "duplicate_received",
             f"{partner} sent Message-ID <{msgid}> again; the stored receipt was returned "
             "and no new message made", now=now)
    session.commit()
    if row.mdn_state == "sync" and row.mdn_digest:
        with store.open(row.mdn_digest) as f:
            _head, _sep, mdn_body = f.read().partition(b"\r\n\r\n")
        return Reply(200, dict(row.mdn_headers or {}), mdn_body, message_id=row.message_id)
    if row.mdn_state in ("pending", "sent", "failed") and row.mdn_url:
        row.mdn_state, row.mdn_due_at, row.mdn_attempts = "pending", now, 0
        session.commit()
        return _text(200, "duplicate: the receipt is sent again", message_id=row.message_id,
                     mdn_owed=True)
    return _text(200, f"duplicate of an accepted message ({msgid})", message_id=row.message_id)


def _accepted_key(partner: str, msgid: str) -> str:
    return f"{partner}\n{msgid}"[:330]


class BuiltMdn:
    """An MDN pyas2lib built, serialised once (its ``content`` re-serialises the MIME
    tree on every read, which costs as much as parsing a small message)."""

    def __init__(self, mdn):
        self.headers = dict(mdn.headers)
        self.content = lib.mdn_content(mdn)
        self.mdn_mode, self.mdn_url = mdn.mdn_mode, mdn.mdn_url
        self.headers_str = lib.header_block(self.headers.items())


def _parse(raw: bytes, org: profiles.As2Profile | None, partner: profiles.As2Profile | None,
           binary: bool | None = None):
    message = lib.Message()
    with lib.parsing(), lib.collecting_warnings() as warnings:
        status, (exc, _tb), mdn = message.parse(
            raw, find_org_cb=lambda _id: lib.organization(
                org, partner=partner.party if partner else None) if org else None,
            find_partner_cb=lambda _id: lib.partner(partner, binary) if partner else None)
    message.certificate_warnings = list(warnings)
    return message, status, exc, BuiltMdn(mdn) if mdn is not None else None


def _parse_and_store(session, store, instance, raw, stages: _Stages, found, org, partner,
                     msgid, now, known: dict, checks: IntakeChecks | None = None) -> Reply:
    try:
        with lib.held_logs() as held:
            message, status, exc, mdn = _parse(raw, org, partner)
            if isinstance(exc, SignatureError) and partner is not None:
                other = not partner.get("canonicalize_as_binary")
                retry = _parse(raw, org, partner, binary=other)
                if retry[1] == "processed":
                    log.debug("AS2 message %s from %s: signature verified with %s "
                              "canonicalisation after the other failed (%s)", msgid,
                              partner.party, "binary" if other else "text", exc)
                    held.expected = True  # the first check's ERROR was a fallback
                    message, status, exc, mdn = retry
    except Exception as error:  # malformed MIME pyas2lib could not even start on
        log.info("AS2 message could not be parsed: %r", error)
        return _refuse_early(session, instance, found, stages, now,
                             f"malformed AS2 message: {error}")
    if status == "processed" and org is not None and cem_xml.is_cem(message.payload):
        return _cem(session, instance, stages, found, org, partner, msgid, now, mdn,
                    message.payload)

    def content():
        content = message.content  # decoded anew at every read
        content = content if isinstance(content, bytes) else b""
        # inspected as it is, in memory (docs/edi.md): not read back from the store
        return stages.add(content), inspect_bytes(content)
    return _store_parsed(session, store, instance, stages, found, org, partner, msgid, now, known,
                         status, exc, mdn, content, _filename(message),
                         message.certificate_warnings, checks)


def _cem(session, instance, stages: _Stages, found, org, partner, msgid, now, mdn,
         entity) -> Reply:
    """A CEM request or response (:mod:`.cem`): consumed by the AS2 plugin, never routed;
    what it did is a history line (and a step on the partner page), the MDN as the
    partner asked. One we cannot read is refused with the reason."""
    from plugins.as2 import cem
    try:
        text = cem.consume(session, partner, org, entity, msgid, now)
    except cem_xml.CemFormatError as exc:
        session.rollback()
        return _refuse_early(session, instance, found, stages, now,
                             f"CEM document refused: {exc}")
    mode = _mdn_mode(mdn)
    if mode == "pending":  # the owed MDN's row, as for any message (no message row)
        mdn_stage = _mdn_stage(stages, mdn)
        stages.durable().result()
        _insert_inbound(session, instance, partner.party, msgid, None, mdn, mode,
                        mdn_stage, now)
    else:
        stages.discard()
    session.commit()
    reply = _reply(mdn, mode, None, text)
    reply.cem_owed = True
    return reply


def _stream_parse_and_store(session, store, instance, spool: Spool, stages: _Stages, found,
                            org, partner, msgid, now, known: dict,
                            checks: IntakeChecks | None = None) -> Reply:
    """:func:`_parse_and_store` of a message over the stream threshold (:mod:`.stream`)."""
    with lib.collecting_warnings() as warnings:
        if org is None:
            as2_to = lib.unquote(found.get("as2-to"))
            received = stream.refused(PartnerNotFound(
                f"Unknown AS2 organization with id {as2_to}"), spool.headers)
        else:
            received = stream.receive(
                spool.ws, spool.path, spool.body_at, spool.headers, lib.partner(partner),
                decrypt_keys=lambda: lib.decrypt_keys(
                    org, partner.party if partner else None),
                verify_certs=lambda: lib.verify_certs(partner),
                receipt_alg=lib.micalg(found.get("disposition-notification-options")),
                content_head=lib.content_head)
        mdn = _streamed_mdn(received, found, org, partner, msgid)
    if received.exc is not None:
        log.info("AS2 message %s (streamed) not processed: %r", msgid, received.exc)

    def content():
        # inspected as the decoded content streams into its stage (a tee to the
        # inspector's thread): read once, never whole in memory, and done when the
        # stage is written, before the sync (docs/edi.md)
        with received.payload.body_stream() as body:
            reader = InspectingReader(body)
            try:
                return stages.add_stream(reader), reader.attributes()
            finally:
                reader.close()
    return _store_parsed(session, store, instance, stages, found, org, partner, msgid, now, known,
                         received.status, received.exc, mdn, content, _safe_name(
                             received.filename()), list(warnings), checks)


def _streamed_mdn(received: stream.Received, found: dict, org, partner, msgid: str):
    """The MDN of a streamed message, built as pyas2lib builds it (small), from the MIC
    the stream computed."""
    if not found.get("disposition-notification-to"):
        return None
    message = lib.Message()
    message.payload = received.merged
    message.message_id = msgid
    message.receiver = lib.organization(
        org, partner=partner.party if partner else None) if org is not None \
        else lib.organization_stub(lib.unquote(found.get("as2-to")), None)
    message.sender = lib.partner(partner)
    message.mic, message.digest_alg = received.mic, received.digest_alg
    url = found.get("receipt-delivery-option")
    options = found.get("disposition-notification-options")
    mdn = lib.Mdn(mdn_mode="ASYNC" if url else "SYNC", mdn_url=url,
                  digest_alg=options.split(";")[-1].split(",")[-1].strip() if options else None)
    detail = None if received.exc is None else getattr(
        received.exc, "disposition_modifier", "unexpected-processing-error")
    with lib.parsing():
        mdn.build(message=message, status=received.status, detailed_status=detail)
    return BuiltMdn(mdn)


def _store_parsed(session, store, instance, stages: _Stages, found, org, partner, msgid, now,
                  known: dict, status: str, exc, mdn, content, filename: str | None,
                  warnings: list[str], checks: IntakeChecks | None = None) -> Reply:
    """Store a parsed message (``content()`` adds its unpacked stage and returns it with
    the attributes its inspection found) and reply. ``checks``: the instance's intake
    checks (docs/edi.md "Checks at intake"): from and to from the envelope, its errors
    and a duplicate interchange. A message they refuse was received all the same at the
    AS2 level: it is stored Refused, and its MDN is the positive one pyas2lib built."""
    # the receipt and the business document join the raw stage's batch
    mdn_stage = _mdn_stage(stages, mdn)
    unpacked, attributes = content() if status == "processed" else (None, [])
    durable = stages.durable()  # one sync for all three, while the rows go in
    from_party = partner.party if partner else party_name(lib.unquote(found.get("as2-from")))
    to_party = org.party if org else party_name(lib.unquote(found.get("as2-to")))
    stored = stages.raw()
    if mdn_stage:
        stored["receipt"] = mdn_stage
    mode = _mdn_mode(mdn)
    if status != "processed":
        reason = _reason(status, exc)
        return _store_refusal(session, instance, NewMessage(
            source=instance, from_party=from_party, to_party=to_party, stages=stored,
            external_id=msgid, correlation_id=msgid), reason, mdn, mode, mdn_stage, durable, now)
    stored["unpacked"] = unpacked
    new = NewMessage(source=instance, from_party=from_party, to_party=to_party,
                     stages=stored, external_id=msgid, correlation_id=msgid,
                     original_filename=filename,
                     direction=_direction(org, partner),
                     lines=_mdn_lines(mode, mdn) + [
                         {"type": "warning", "text": w} for w in warnings])
    # its as2_inbound row goes in with the message, in the same statement on PostgreSQL
    # and so do its attributes (its envelope), read before it is routed
    new.rows = [(As2Inbound.__table__, _inbound_row(
        instance, from_party, msgid, mdn, mode, mdn_stage, now,
        accepted_key=_accepted_key(from_party, msgid))), *message_rows(attributes)]
    # the envelope's parties (the AS2 partner stays the as2_inbound row's), its errors, a
    # duplicate interchange (one SELECT, for an interchange only)
    checked = check_intake(session, new, checks or IntakeChecks(), now)
    try:
        if isinstance(checked, IntakeRefusal):  # its as2_inbound row goes in too
            made = store_intake_refusal(session, checked, now)
        else:
            [made] = store_and_dispatch_many(session, [checked], now, known)
            alert_duplicates(session, [checked], [made], now)
        durable.result()  # the stages are in place before the rows referring to them
        session.commit()
    except IntegrityError:  # the same Message-ID committed meanwhile by another request
        session.rollback()
        duplicate_id = _duplicate_id(session, from_party, msgid)
        if duplicate_id is None:
            return _text(503, "try again")
        return _duplicate(session, store, duplicate_id, from_party, msgid, now)
    if isinstance(checked, IntakeRefusal):
        log.info("AS2 message %s from %s received and refused: %s", msgid, from_party,
                 checked.reason)
        return _reply(mdn, mode, made, f"received; refused: {checked.reason}")
    return _reply(mdn, mode, made, "accepted")


@contextmanager
def _own_transaction(session):
    """On PostgreSQL, while nothing was sent in the session's transaction yet, each
    statement of the block runs as a transaction of its own (psycopg in autocommit):
    psycopg sends BEGIN and COMMIT as round trips of their own. For reads only here. The
    connection stays the session's (the request holds one); the next statement after
    the block begins a transaction as before. Yields whether it does (not on SQLite, nor
    in a transaction)."""
    conn = connection(session)
    if conn.dialect.name != "postgresql":
        yield False
        return
    from psycopg.pq import TransactionStatus  # here: a process on SQLite never loads psycopg
    dbapi = conn.connection.dbapi_connection
    if dbapi.autocommit \
            or dbapi.info.transaction_status != TransactionStatus.IDLE:
        yield False
        return
    dbapi.autocommit = True
    try:
        yield True
    finally:
        if dbapi.info.transaction_status == TransactionStatus.IDLE:
            dbapi.autocommit = False  # else broken: SQLAlchemy discards the connection


def _store_refusal(session, instance, new: NewMessage, reason: str, mdn, mode: str,
                   mdn_stage, durable: Future, now) -> Reply:
    new.lines = _mdn_lines(mode, mdn)
    message_id = store_refused(session, new, reason, now)
    _insert_inbound(session, instance, new.from_party, new.external_id or "?", message_id, mdn,
                    mode, mdn_stage, now)
    durable.result()
    session.commit()
    log.info("AS2 message %s from %s refused: %s", new.external_id, new.from_party, reason)
    if mode == "none":
        return _text(403 if "unknown" in reason else 400, f"refused: {reason}",
                     message_id=message_id)
    return _reply(mdn, mode, message_id, f"refused: {reason}")


def _insert_inbound(session, instance: str, partner: str, msgid: str, message_id: int, mdn,
                    mode: str, mdn_stage, now) -> None:
    """The ``as2_inbound`` row of a refused message (one Core statement); an accepted
    one's goes in with its message (:func:`_store_parsed`)."""
    connection(session).execute(insert(As2Inbound.__table__), {
        **_inbound_row(instance, partner, msgid, mdn, mode, mdn_stage, now),
        "message_id": message_id})


def _inbound_row(instance: str, partner: str, msgid: str, mdn, mode: str, mdn_stage, now,
                 accepted_key: str | None = None) -> dict:
    """The ``as2_inbound`` row of a received message but its message id: its receipt,
    owed or returned; ``accepted_key`` for an accepted one (a Message-ID accepted twice
    raises IntegrityError when the row goes in). Every column is given (the row may go
    in through :mod:`b2bhub.engine.dispatch_rows`, where no ORM default applies)."""
    return {"instance": instance, "partner": partner, "as2_message_id": msgid[:255],
            "accepted_key": accepted_key,
            "mdn_digest": mdn_stage[0] if mdn_stage else None,
            "mdn_headers": dict(mdn.headers) if mdn else None,
            "mdn_url": mdn.mdn_url if mode == "pending" else None, "mdn_state": mode,
            "mdn_due_at": now if mode == "pending" else None, "mdn_attempts": 0,
            "mdn_last_error": "", "created_at": now}


def _refuse_early(session, instance, found, payloads: _Stages, now, reason: str,
                  status: int = 400, to_party: str | None = None) -> Reply:
    """Refused before pyas2lib could read it: recorded with what was kept, the negative
    MDN (unsigned, as nothing is verified) when the partner asked for one and it can be
    addressed: an MDN goes from the AS2-To of the message to its AS2-From, so without
    both the refusal is the HTTP answer ``status`` with the reason, and no MDN.
    ``to_party``: the organization's name when its AS2 ID is known."""
    msgid = lib.message_id_of(found.get("message-id"))
    mdn = None
    if found.get("disposition-notification-to"):
        if lib.unquote(found.get("as2-from")) and lib.unquote(found.get("as2-to")):
            mdn = _negative_mdn(found, msgid, reason)
        else:
            reason += "; no MDN: one cannot be addressed without AS2-From and AS2-To"
    mdn_stage = _mdn_stage(payloads, mdn)
    durable = payloads.durable()
    stages = payloads.raw()
    if mdn_stage:
        stages["receipt"] = mdn_stage
    new = NewMessage(source=instance,
                     from_party=party_name(lib.unquote(found.get("as2-from"))),
                     to_party=to_party or party_name(lib.unquote(found.get("as2-to"))),
                     stages=stages, external_id=msgid)
    reply = _store_refusal(session, instance, new, reason, mdn, _mdn_mode(mdn), mdn_stage,
                           durable, now)
    if mdn is None:
        reply.status = status
    return reply


def _negative_mdn(found: dict, msgid: str | None, reason: str):
    stub = lib.Message()
    stub.payload = lib.email_message()
    for key, value in found.items():
        stub.payload[key] = value
    stub.payload.set_type("application/octet-stream")
    stub.message_id = msgid or "unknown"
    stub.receiver = lib.organization_stub(lib.unquote(found.get("as2-to")), None)
    mdn = lib.Mdn(mdn_mode="ASYNC" if found.get("receipt-delivery-option") else "SYNC",
                  mdn_url=found.get("receipt-delivery-option"))
    mdn.build(message=stub, status="processed/Error",
              detailed_status=re.sub(r"[\r\n]+", " ", reason)[:200])
    return BuiltMdn(mdn)


def _mdn_mode(mdn) -> str:
    if mdn is None:
        return "none"
    return "pending" if mdn.mdn_mode == "ASYNC" and mdn.mdn_url else "sync"


def _mdn_stage(stages: _Stages, mdn) -> tuple[str, int] | None:
    return stages.add(mdn.headers_str + b"\r\n" + mdn.content) if mdn is not None else None


def _mdn_lines(mode: str, mdn) -> list[dict]:
    """The history line of the MDN returned or owed, written with the message."""
    if mdn is None:
        return []
    signed = "signed " if mdn.headers.get("Content-Type", "").startswith(
        "multipart/signed") else ""
    where = "returned in the response" if mode == "sync" else f"owed to {mdn.mdn_url}"
    return [{"type": "mdn_sent" if mode == "sync" else "mdn_queued",
             "text": f"{signed}MDN {where}"}]


def _direction(org, partner) -> str | None:
    """From a partner's profile to an organization's: inbound (else the parties' kinds
    are looked up)."""
    return "inbound" if org is not None and partner is not None else None


def _reply(mdn, mode: str, message_id: int, text: str) -> Reply:
    if mode == "sync":
        return Reply(200, dict(mdn.headers), mdn.content, message_id=message_id)
    return _text(200, text, message_id=message_id, mdn_owed=mode == "pending")


def _reason(status: str, exc) -> str:
    detail = getattr(exc, "disposition_modifier", None) or "unexpected-processing-error"
    return f"{status}: {detail}: {exc}" if exc else f"{status}: {detail}"


def _filename(message) -> str | None:
    return _safe_name(stream.decoded_filename(message.payload))


def _safe_name(name: str | None) -> str | None:
    if not name:
        return None
    name = os.path.basename(name.replace("\\", "/")).strip()
    return name[:255] if name and name not in (".", "..") and "\x00" not in name else None
