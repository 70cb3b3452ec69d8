"""``http_receiver`` (source, SPEC 9): our own systems hand documents over HTTP at
``POST /in/<instance>`` (the core's endpoint hook, no UI login).

Order of work for one request, each refusal storing nothing:

1. ``Authorization: Bearer <token>``: one of the instance's named tokens (stored as
   their sha256, shown once when made; :func:`create_token`, :func:`revoke_token`).
   Missing or wrong: 401.
2. From and to: ``X-B2BHub-From`` / ``X-B2BHub-To``, else the configured ``from_party``
   / ``to_party``; either missing or not a party: 422. An instance whose
   ``parties_from`` is ``envelope`` takes them from the body's envelope instead
   (docs/edi.md "The receivers"): the headers and configuration are then optional
   (a named party must still exist), and an envelope naming unknown identities makes
   the message Not routed with the reason.
3. The body is streamed into a payload batch (never whole in memory), at most
   ``max_size`` bytes (413 past it), and must be complete (a body shorter than its
   Content-Length or a chunked body cut off: 400). A refused body's temp file is
   removed; nothing is put in place before the message's transaction.
4. ``Idempotency-Key`` (Stripe's semantics): the key is recorded (``in_progress``) in a
   transaction of its own before the message is stored, so of concurrent requests with
   one key exactly one goes on; the others get 409 while it is handled. Once answered,
   a repeat with the same body gets the first answer again and a ``duplicate_received``
   line on its message; another body is 422. Keys are kept ``idempotency_hours`` (the
   hourly job http_receiver.expire_keys removes older ones). A request that failed
   before it stored a message forgets its key, so the client may try again; a key left
   in progress by a process that died is taken over after :data:`ABANDONED`.
5. The body's envelope is read (EDI inspection) from memory when it was preread, else
   as it streams into the payload store; its attributes go in with the message and the
   routes match its document types. The instance's checks at intake apply
   (``check_intake``, docs/edi.md): an interchange they refuse (envelope errors, a
   duplicate) is stored Refused and answered 422 ``refused`` with the reason; a
   duplicate let through is alerted.
6. Async mode: stored and dispatched by the routes, 202 with the message id and a
   ``Location`` of its API resource. On PostgreSQL a request without a key whose
   message is one statement goes with those of other requests of the process arriving
   meanwhile, in one statement and commit (:mod:`b2bhub.engine.grouped`).
7. Sync mode (seed 003): the message goes to the instance's one ``target`` (routes are
   not consulted), then is attempted inside the request through the engine's claim,
   attempt and settlement (:meth:`b2bhub.engine.runner.TargetRunner.attempt_now`),
   1 s after the previous attempt ended, up to the target's maximum attempts; the loop
   stops on delivery, a business error, a failure the policy does not retry, or when the
   target is probed offline (then not even the first attempt goes out). The answer:
   200 delivered (the destination's status and the start of its body), 202 awaiting a
   receipt, 422 business error (naming the rule), 504 when the last attempt timed out,
   502 for another technical failure, 503 when the target is offline or not running.
   What was not delivered stays Retrying (or Queued, offline) for the asynchronous path:
   the in-request attempts never use up the target's maximum attempts on their own, so
   a worker makes at least one more attempt on the target's schedule.

Choices where the SPEC is silent: the stage stored is ``unpacked``; a ``traceparent``
gives its trace id as the correlation id when there is no ``X-Correlation-Id``; a
disabled instance answers 404 like a missing one (the core's endpoint hook).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from datetime import datetime, timedelta
from typing import IO

from sqlalchemy import (
    ForeignKey,
    LargeBinary,
    String,
    UniqueConstraint,
    bindparam,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column, scoped_session

from b2bhub.plugin import (
    INTAKE_KEYS,
    N_,
    PARTIES_FROM_ENVELOPE,
    PREREAD,
    Base,
    BigId,
    Conflict,
    EndpointLookup,
    EndpointReply,
    EndpointRequest,
    Field,
    InspectingReader,
    IntakeChecks,
    IntakeRefusal,
    NewMessage,
    NotFound,
    PeriodicJob,
    Plugin,
    ServiceError,
    add_line,
    alert_duplicates,
    check_intake,
    deliver_in_request,
    delivery_standing,
    direction_of,
    envelope_identities,
    inspect_bytes,
    instance_type,
    message_rows,
    openpgp_unpacker,
    store_and_dispatch_grouped,
    store_and_dispatch_many,
    store_intake_refusal,
    utcnow,
    writes_in_one_statement,
)

TYPE = "http_receiver"
TOKEN_PREFIX = "b2bin_"
#: seconds between the end of one in-request attempt and the start of the next (seed 003)
SYNC_INTERVAL = 1.0
#: a key still in progress after this long was taken by a process that died meanwhile
ABANDONED = timedelta(minutes=15)
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
_FILENAME = re.compile(r"""filename\*?=(?:UTF-8'')?"?([^";]+)"?""", re.I)


class IntakeToken(Base):
    """A bearer token of one receiver instance, by name; only its sha256 is kept."""

    __tablename__ = "http_receiver_tokens"
    __table_args__ = (UniqueConstraint("instance", "name", name="uq_http_receiver_token"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    instance: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str] = mapped_column(String(64))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_by: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class IdempotencyKey(Base):
    """One Idempotency-Key of one instance: the body it came with and the first answer."""

    __tablename__ = "http_receiver_idempotency"
    __table_args__ = (UniqueConstraint("instance", "key", name="uq_http_receiver_idem"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    instance: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(255))
    body_sha256: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))  # in_progress | done
    message_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("messages.id", ondelete="SET NULL"), default=None, index=True)
    status: Mapped[int | None] = mapped_column(default=None)
    headers: Mapped[str] = mapped_column(String, default="{}")
    body: Mapped[bytes] = mapped_column(LargeBinary, default=b"")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)


# --- tokens ------------------------------------------------------------------------------

def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _receiver(session, instance: str) -> None:
    if instance_type(session, instance) != TYPE:
        raise NotFound(N_("no %(type)s instance named '%(name)s'", type=TYPE, name=instance))


def create_token(session, instance: str, name: str, actor: str) -> str:
    """Make a named token for the instance; returns it (shown this once). The caller
    commits. A history line names the operator."""
    _receiver(session, instance)
    if not name or len(name) > 64:
        raise ServiceError(N_("a token needs a name of 1 to 64 characters"),
                           {"name": "invalid"})
    if session.scalar(select(IntakeToken.id).where(IntakeToken.instance == instance,
                                                   IntakeToken.name == name)):
        raise Conflict(N_("%(instance)s has a token named '%(name)s' already; revoke it first",
                          instance=instance, name=name))
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(IntakeToken(instance=instance, name=name, token_sha256=_hash(token),
                            created_by=actor, created_at=utcnow()))
    add_line(session, None, "config_changed", f"{actor} created intake token '{name}' "
             f"of {instance}", actor=actor)
    session.flush()
    return token


def revoke_token(session, instance: str, name: str, actor: str) -> None:
    _receiver(session, instance)
    gone = session.execute(delete(IntakeToken).where(IntakeToken.instance == instance,
                                                     IntakeToken.name == name)).rowcount
    if not gone:
        raise NotFound(N_("%(instance)s has no token named '%(name)s'", instance=instance,
                          name=name))
    add_line(session, None, "config_changed", f"{actor} revoked intake token '{name}' "
             f"of {instance}", actor=actor)


def list_tokens(session, instance: str) -> list[dict]:
    _receiver(session, instance)
    rows = session.scalars(select(IntakeToken).where(IntakeToken.instance == instance)
                           .order_by(IntakeToken.name)).all()
    return [{"name": r.name, "created_by": r.created_by,
             "created_at": r.created_at.isoformat() + "Z"} for r in rows]


def remove_expired_keys(session, now: datetime) -> int:
    """Idempotency-Keys past their ``idempotency_hours`` (the hourly periodic job)."""
    return session.execute(delete(IdempotencyKey).where(
        IdempotencyKey.expires_at < now)).rowcount or 0


# --- the request ------------------------------------------------------------------------

class _TooLarge(Exception):
    pass


class _Incomplete(Exception):
    pass


class _Limited:
    """The request body read in chunks: past ``limit`` bytes raises :class:`_TooLarge`,
    a read that fails or ends short of ``expected`` raises :class:`_Incomplete`."""

    def __init__(self, stream: IO[bytes], limit: int, expected: int | None):
        self.stream, self.limit, self.expected, self.total = stream, limit, expected, 0

    def read(self, size: int = -1) -> bytes:
        try:
            data = self.stream.read(size if size and size > 0 else 1 << 20)
        except Exception as exc:  # a client gone, a chunked body cut off
            raise _Incomplete(f"{type(exc).__name__}: {exc}") from exc
        self.total += len(data)
        if self.total > self.limit:
            raise _TooLarge()
        if not data and self.expected is not None and self.total < self.expected:
            raise _Incomplete(f"{self.total} of {self.expected} bytes")
        return data


def _reply(status: int, body: dict, headers: dict | None = None) -> EndpointReply:
    return EndpointReply(status, {"Content-Type": "application/json", **(headers or {})},
                         json.dumps(body).encode() + b"\n")


def _error(status: int, text: str, **headers) -> EndpointReply:
    return _reply(status, {"error": text}, headers)


def _header(headers: dict[str, str], name: str) -> str | None:
    value = headers.get(name.lower())
    return value.strip() if value and value.strip() else None


def _filename(headers: dict[str, str]) -> str | None:
    given = _header(headers, "X-B2BHub-Filename")
    if given is None and (disposition := _header(headers, "Content-Disposition")):
        found = _FILENAME.search(disposition)
        given = found.group(1).strip() if found else None
    if given:
        given = given.replace("\\", "/").rsplit("/", 1)[-1][:255]
    return given or None


def _correlation(headers: dict[str, str]) -> str | None:
    given = _header(headers, "X-Correlation-Id")
    if given:
        return given[:255]
    parent = _header(headers, "traceparent")
    found = _TRACEPARENT.fullmatch(parent.lower()) if parent else None
    return found.group(1) if found else None


#: what a request reads before the body is stored, in one statement (the core's
#: intake fast path): the settings rows a new message needs, the parties' kinds and
#: the token's row (ours)
LOOKUP = EndpointLookup(TYPE, settings=INTAKE_KEYS, parties=("from_party", "to_party"),
                        extra={"token": select(IntakeToken.id).where(
                            IntakeToken.instance == bindparam("instance"),
                            IntakeToken.token_sha256 == bindparam("token"))
                            .scalar_subquery()},
                        identities=("sender", "receiver"))


def _lookups(session, request: EndpointRequest, token: str, from_header: str | None,
             to_header: str | None, identities: dict[str, str]):
    """What a request reads before the body is stored, in one statement (each is a round
    trip to PostgreSQL): the instance (when the core left it to us, for a preread body),
    the token's row, the sender's and the recipient's kinds (from the headers, else the
    instance's ``from_party`` / ``to_party``), the parties of a preread body's envelope
    (``identities``, by role) and the settings rows a new message needs. None when the
    instance is missing or disabled; else (config, from, to, kinds of the parties that
    exist, the settings rows, the token's id or None, the instance's intake checks,
    the party (name, kind) of each identity that is one's)."""
    given = request.config is not None
    config = request.config or {}
    parties = {
        "from_party": from_header or (config.get("from_party") or None if given else None),
        "to_party": to_header or (config.get("to_party") or None if given else None),
    }
    looked = LOOKUP.run(session, request.instance, look_up_instance=not given,
                        parties=parties, token=_hash(token), identities=identities)
    checks = request.checks or IntakeChecks(request.parties_from)
    if not given:
        if not looked.enabled:
            return None
        config, checks = looked.config, looked.checks
    return (config, looked.parties["from_party"], looked.parties["to_party"], looked.kinds,
            looked.settings, looked.extra["token"], checks, looked.identities)


def handle(request: EndpointRequest) -> EndpointReply:
    session, name = request.session, request.instance
    headers = {k.lower(): v for k, v in request.headers}
    auth = _header(headers, "Authorization") or ""
    scheme, _, token = auth.partition(" ")
    key = _header(headers, "Idempotency-Key")
    # A preread body without a key: the lookups read, and the message's rows are most
    # often one statement, so each may run as a transaction of its own.
    alone = (key is None and request.content_length is not None
             and request.content_length <= PREREAD and _statement_at_a_time(session))
    # A preread body is inspected from memory before the lookups, so that they read
    # its envelope's parties too, in their one statement (docs/edi.md).
    found = inspect_bytes(request.body.getvalue()) if request.config is None else None
    looked = _lookups(session, request, token.strip(), _header(headers, "X-B2BHub-From"),
                      _header(headers, "X-B2BHub-To"), envelope_identities(found or ()))
    if looked is None:
        session.rollback()
        return _error(404, f"no enabled HTTP receiver named '{name}'")
    config, from_party, to_party, kinds, known, token_id, checks, holders = looked
    envelope = checks.parties_from == PARTIES_FROM_ENVELOPE
    if scheme.lower() != "bearer" or not token.strip() or token_id is None:
        session.rollback()
        return _error(401, "a valid bearer token of this receiver is required",
                      **{"WWW-Authenticate": 'Bearer realm="b2bhub"'})
    if (not from_party or not to_party) and not envelope:
        session.rollback()
        return _error(422, "no sender or recipient: send X-B2BHub-From and X-B2BHub-To "
                           "or configure from_party and to_party")
    unknown = [p for p in (from_party, to_party) if p and p not in kinds]
    if unknown:
        session.rollback()
        return _error(422, f"unknown party: {', '.join(dict.fromkeys(unknown))}")
    max_size = int(config.get("max_size") or request.max_size)
    if request.content_length is not None and request.content_length > max_size:
        session.rollback()  # (a preread body: the core left the limit to us)
        return _error(413, f"the body is over the size limit of {max_size} bytes; "
                           "nothing was stored")
    if request.content_length is None or request.content_length > PREREAD:
        session.commit()  # no connection held while a large body arrives
    batch = request.store.batch()
    body: IO[bytes] = _Limited(request.body, max_size, request.content_length)
    if found is None:
        # A body that was not preread is inspected as it streams into the store (a tee
        # to the inspector's thread), not from the staged file afterwards: it is read
        # once, whatever the payload store (an object store stages no local file), and
        # never whole in memory.
        body = InspectingReader(body)
    try:
        stored = batch.put(body)
    except _TooLarge:
        batch.discard()
        return _error(413, f"the body is over the size limit of {max_size} bytes; "
                           "nothing was stored")
    except _Incomplete as exc:
        batch.discard()
        return _error(400, f"the body ended before it was complete ({exc}); nothing was "
                           "stored")
    except BaseException:
        batch.discard()
        raise
    finally:
        if isinstance(body, InspectingReader):
            found = body.attributes()  # [] unless the body was read to its end
    try:
        if key is not None:
            earlier = _claim_key(session, name, key[:255], stored.digest, config,
                                 request.now)
            if earlier is not None:
                batch.discard()
                return earlier
        batch.commit()
        new = NewMessage(
            source=name, from_party=from_party, to_party=to_party,
            direction=direction_of(kinds, from_party, to_party),
            stages={"unpacked": (stored.digest, stored.size)},
            original_filename=_filename(headers), correlation_id=_correlation(headers),
            sequence_key=(_header(headers, "X-B2BHub-Sequence-Key") or "")[:200] or None,
            actor=name, targets=[config["target"]] if config.get("mode") == "sync" else None,
            rows=message_rows(found))
        # the envelope's identities' parties as the lookups read them (a preread body);
        # None: check_intake reads them
        read = holders if request.config is None else None
        if config.get("openpgp_decrypt") or config.get("openpgp_verify"):
            # raw as received, unpacked decrypted, its envelope read from that one
            got = openpgp_unpacker(session, request.store, config, commit=False)(
                from_party, to_party, stored)
            new.stages, new.rows, new.lines = got.stages, got.rows, [*new.lines, *got.lines]
            found, read = [(row["name"], row["value"]) for table, row in got.rows
                           if table.name == "message_attributes"], None
        if envelope:
            new = _envelope_defaults(new, found, kinds, read)
        # the instance's checks (docs/edi.md "Checks at intake"): parties from the
        # envelope, its errors and a duplicate (one SELECT, for an interchange only)
        checked = check_intake(session, new, checks, request.now, parties=read)
        made: list[tuple[int, int, str]] = []
        refusal = checked if isinstance(checked, IntakeRefusal) else None
        new = checked.new if refusal is not None else checked
        duplicate = refusal is None and _is_duplicate(new)
        if alone and config.get("mode") != "sync" and refusal is None and not duplicate:
            # nothing else to write: with the other requests' that arrive meanwhile, in
            # one statement and commit (b2bhub.engine.grouped, which also sees to a
            # group of more than one statement going in a transaction)
            message_id = store_and_dispatch_grouped(session, new, request.now, known)
        else:
            if alone and (refusal is not None or duplicate
                          or not writes_in_one_statement(session, [new], known)):
                session.commit()  # more than one statement: the next begins a transaction
            if refusal is not None:  # kept, Refused with the reason, its envelope too
                message_id = store_intake_refusal(session, refusal, request.now)
            else:
                [message_id] = store_and_dispatch_many(session, [new], request.now, known,
                                                       made)
                alert_duplicates(session, [new], [message_id], request.now)
            if key is not None:
                _key_row(session, name, key[:255], message_id=message_id)
            session.commit()
    except BaseException:
        batch.discard()
        session.rollback()
        if key is not None:
            _forget_key(session, name, key[:255])
        raise
    if refusal is not None:  # an envelope error or a duplicate the instance refuses
        reply = _answer(422, message_id, "refused", text=refusal.reason)
    elif config.get("mode") == "sync" and not made:  # its envelope's parties unknown
        reply = _answer(422, message_id, "not_routed", text=next(
            line["text"] for line in new.lines if line["type"] == "not_routed"))
    elif config.get("mode") == "sync":
        [(delivery_id, _m, target)] = made
        reply = _deliver_in_request(session, message_id, delivery_id, target, known)
    else:
        reply = _answer(202, message_id, "received")
    if key is not None:
        _key_row(session, name, key[:255], state="done", status=reply.status,
                 headers=json.dumps(reply.headers), body=reply.body)
        session.commit()
    return reply


def _envelope_defaults(new: NewMessage, found: list[tuple[str, str]],
                       kinds: dict[str, str], holders: dict | None) -> NewMessage:
    """An ``envelope`` receiver's message before :func:`check_intake` gives it its
    envelope's parties (docs/edi.md), which win over X-B2BHub-From / -To and the
    configured ones: the parties it is stored between when they are not known (Not
    routed with the reason): those the request or the configuration named, else those
    the envelope's known identities are, else the identity itself (``?``: none).
    ``holders``: the identities' parties the lookups read (a preread body), or None."""
    named = envelope_identities(found)
    for role, attr in (("sender", "from_party"), ("receiver", "to_party")):
        if not getattr(new, attr):
            identity = named.get(role)
            held = (holders or {}).get(identity)
            setattr(new, attr, held[0] if held else (identity or "?")[:64])
    seen = {**kinds, **dict((holders or {}).values())}
    new.direction = (direction_of(seen, new.from_party, new.to_party)
                     if new.from_party in seen and new.to_party in seen else None)
    return new


def _is_duplicate(new: NewMessage) -> bool:
    """A duplicate interchange let through: its alert follows the store."""
    return any(line.get("type") == "duplicate_received" for line in new.lines)


def _statement_at_a_time(session) -> bool:
    """On PostgreSQL, the session's next transaction runs each statement as one of its
    own (autocommit): the BEGIN and COMMIT round trips, two of the four an intake made,
    are spared. Only for reads and work of one statement (atomic by itself). True when
    set; a session in a transaction already, or on SQLite (no round trips), stays."""
    own = session() if isinstance(session, scoped_session) else session
    if own.in_transaction() or own.get_bind().dialect.name != "postgresql":
        return False
    session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    return True


def _answer(status: int, message_id: int, outcome: str, **more) -> EndpointReply:
    location = f"/api/v1/messages/{message_id}"
    return _reply(status, {"message_id": message_id, "outcome": outcome,
                           "location": location, **more}, {"Location": location})


def _key_row(session, instance: str, key: str, **values) -> None:
    session.execute(update(IdempotencyKey).where(IdempotencyKey.instance == instance,
                                                 IdempotencyKey.key == key).values(**values))


def _forget_key(session, instance: str, key: str) -> None:
    try:
        session.execute(delete(IdempotencyKey).where(
            IdempotencyKey.instance == instance, IdempotencyKey.key == key,
            IdempotencyKey.state == "in_progress"))
        session.commit()
    except Exception:
        session.rollback()


def _claim_key(session, instance: str, key: str, digest: str, config: dict,
               now: datetime) -> EndpointReply | None:
    """Record the key as in progress (None: this request goes on), or the answer a
    request with a key seen before gets."""
    hours = float(config.get("idempotency_hours") or 24)
    for _ in range(2):
        try:
            session.execute(insert(IdempotencyKey).values(
                instance=instance, key=key, body_sha256=digest, state="in_progress",
                headers="{}", body=b"", created_at=now,
                expires_at=now + timedelta(hours=hours)))
            session.commit()
            return None
        except IntegrityError:
            session.rollback()
        row = session.execute(select(IdempotencyKey).where(
            IdempotencyKey.instance == instance, IdempotencyKey.key == key)).scalar_one_or_none()
        if row is None:
            continue  # forgotten meanwhile: try again
        if row.expires_at < now:
            session.execute(delete(IdempotencyKey).where(IdempotencyKey.id == row.id))
            session.commit()
            continue
        if row.body_sha256 != digest:
            session.rollback()
            return _error(422, "this Idempotency-Key came with another body before; use a "
                               "new key for a new message")
        if row.state != "done" and row.created_at < now - ABANDONED:
            # the process that took the key died before it answered
            if row.message_id is None:  # and before it stored anything: start again
                session.execute(delete(IdempotencyKey).where(IdempotencyKey.id == row.id))
                session.commit()
                continue
            reply = _answer(202, row.message_id, "received")
            session.commit()
            return reply
        if row.state != "done":
            session.rollback()
            return _error(409, "a request with this Idempotency-Key is still being "
                               "handled; try again later", **{"Retry-After": "1"})
        if row.message_id is not None:
            add_line(session, row.message_id, "duplicate_received",
                     f"the same body came again with Idempotency-Key {key}; answered as "
                     f"the first time ({row.status})", actor=instance)
        reply = EndpointReply(row.status, json.loads(row.headers), row.body)
        session.commit()
        return reply
    return _error(409, "this Idempotency-Key is changing hands; try again")


# --- sync mode ---------------------------------------------------------------------------

def _deliver_in_request(session, message_id: int, delivery_id: int, target: str,
                        known: dict) -> EndpointReply:
    """Attempts 1 s apart inside the request (the core's :func:`deliver_in_request`);
    the delivery's id came from the dispatch and the settings from the request's
    lookups: nothing is read before the claim."""
    done = deliver_in_request(session, delivery_id, target, known, interval=SYNC_INTERVAL)
    return _sync_answer(session, message_id, target, done.result, done.attempts)


def _sync_answer(session, message_id: int, target: str, result, made: int) -> EndpointReply:
    state = None if result is None else result.state  # what the last attempt settled
    online = None
    if state in (None, "queued", "retrying"):  # not attempted, or left for the worker
        _statement_at_a_time(session)
        state, online = delivery_standing(session, message_id, target)
        session.commit()
    if result is None or (state in ("queued", "retrying") and online is False):
        why = "offline" if online is False else "not taking deliveries now"
        return _answer(503, message_id, "not_attempted" if result is None else "offline",
                       attempts=made, state=state,
                       text=f"{target} is {why}; the message waits for the asynchronous "
                            "delivery")
    outcome, state = result.outcome, result.state
    answer = outcome.answer
    destination = None if answer is None else {
        "status": answer.status, "body": answer.body[:1000].decode("utf-8", "replace")}
    more = {"attempts": made, "state": state, "text": outcome.text,
            "destination": destination}
    kind = outcome.kind.value
    if state == "delivered":
        return _answer(200, message_id, "delivered", **more)
    if state == "awaiting_receipt":
        return _answer(202, message_id, "awaiting_receipt", **more)
    if kind == "business_error":
        return _answer(422, message_id, "business_error", rule=outcome.rule, **more)
    status = 504 if outcome.error_class == "timeout" else 502
    return _answer(status, message_id, "failed" if state == "failed" else "retrying", **more)


def _sync_problems(config: dict) -> dict[str, str]:
    if config.get("mode") == "sync" and not config.get("target"):
        return {"target": N_("sync mode delivers to exactly one target: name it")}
    return {}


class HttpReceiver(Plugin):
    type_name = TYPE
    roles = frozenset({"source"})
    description = ("Takes documents from our own systems at POST /in/<instance> with a "
                   "bearer token; async (202) or sync (delivered inside the request).")
    config_schema = [
        Field("mode", "choice", label="Mode", default="async", choices=("async", "sync"),
              help="async: store and answer 202; sync: deliver inside the request"),
        Field("target", "string", label="Target", default="",
              help="sync mode: the one target instance the messages go to"),
        Field("from_party", "string", label="From party", default="",
              help="the sender when a request sends no X-B2BHub-From"),
        Field("to_party", "string", label="To party", default="",
              help="the recipient when a request sends no X-B2BHub-To"),
        Field("max_size", "integer", label="Largest body (bytes)", default=100 * 1024 * 1024, min=1,
              help="largest body taken, in bytes; larger ones get 413"),
        Field("idempotency_hours", "number", label="Idempotency-Key kept (hours)",
              default=24, min=0.01, max=24 * 365,
              help="how long an Idempotency-Key is remembered"),
    ]
    endpoint_prefix = "in"
    endpoint_lookup = "handler"
    #: it applies openpgp_decrypt and openpgp_verify itself (docs/openpgp.md)
    openpgp_intake = True
    endpoint_label = "HTTP receiver"
    takes_tokens = True
    # an Idempotency-Key is honoured only until its expiry (the lookup checks it), so
    # removing expired rows hourly only bounds the table
    periodic_jobs = (PeriodicJob("http_receiver.expire_keys",
                                 lambda session, store, now: remove_expired_keys(session, now),
                                 every=3600, expires=600),)

    @classmethod
    def create_token(cls, session, instance: str, name: str, actor: str) -> str:
        return create_token(session, instance, name, actor)

    @classmethod
    def revoke_token(cls, session, instance: str, name: str, actor: str) -> None:
        revoke_token(session, instance, name, actor)

    @classmethod
    def list_tokens(cls, session, instance: str) -> list[dict]:
        return list_tokens(session, instance)

    @classmethod
    def config_problems(cls, config: dict) -> dict[str, str]:
        return _sync_problems(config)

    @classmethod
    def handle_request(cls, request: EndpointRequest) -> EndpointReply:
        return handle(request)


__all__ = ["HttpReceiver", "IdempotencyKey", "IntakeToken", "create_token",
           "list_tokens", "remove_expired_keys", "revoke_token"]
