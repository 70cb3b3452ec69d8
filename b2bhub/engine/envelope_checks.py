"""Checks at intake (docs/edi.md "Checks at intake"): what a source instance does with
an interchange whose envelope the inspection found errors in, and with one whose sender
and interchange control number came before, within its ``duplicate_days``.

One call, :func:`check_intake`, takes a message as its source hands it over (with the
inspection's ``message_attributes`` rows), the instance's :class:`IntakeChecks` and the
hub's time, and returns the message to store (its parties taken from the envelope when
the instance says so, history lines added) or an :class:`IntakeRefusal` to store with
``store_refused``. :func:`store_checked_many` does both for a batch and raises the
``duplicate_received`` alerts; a source that stores its messages itself calls
:func:`alert_duplicates` once they have their ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.orm import Session, aliased

from b2bhub.domain.states import MessageStatus
from b2bhub.engine.ack_waits import party_acks
from b2bhub.engine.dispatch import NewMessage, store_and_dispatch_many, store_refused
from b2bhub.engine.envelope_parties import SOURCE, by_envelope
from b2bhub.engine.history import raise_alert
from b2bhub.engine.openpgp_stages import REFUSED_LINE
from b2bhub.models import Message, MessageAttribute

#: ``edi_errors``: an interchange with envelope errors is delivered, its history listing
#: them ("accept"), or stored Refused with them as the reason ("refuse")
ACCEPT, REFUSE = "accept", "refuse"
EDI_ERRORS = (ACCEPT, REFUSE)
#: ``duplicates``: a duplicate interchange is delivered with a line and an alert
#: ("alert"), or stored Refused naming the earlier message ("refuse")
ALERT = "alert"
DUPLICATES = (ALERT, REFUSE)
DUPLICATE_DAYS = 30
MAX_DUPLICATE_DAYS = 36_500
#: the history line and the alert of a duplicate interchange let through
DUPLICATE_LINE = "duplicate_received"
#: the history line of envelope errors let through
ERRORS_LINE = "edi_errors"


@dataclass(frozen=True)
class IntakeChecks:
    """A source instance's intake settings (its columns of the same names)."""

    parties_from: str = SOURCE
    edi_errors: str = ACCEPT
    duplicates: str = ALERT
    duplicate_days: int = DUPLICATE_DAYS

    @classmethod
    def of(cls, instance: Any) -> IntakeChecks:
        """The settings of an instance row, or of a mapping with its API fields (a
        missing or NULL one keeps its default)."""
        get = instance.get if isinstance(instance, dict) else (
            lambda key, default: getattr(instance, key, default))
        return cls(*(default if (value := get(key, default)) is None else value
                     for key, default in (
                         ("parties_from", SOURCE), ("edi_errors", ACCEPT),
                         ("duplicates", ALERT), ("duplicate_days", DUPLICATE_DAYS))))


@dataclass
class IntakeRefusal:
    """A message to store Refused (``store_refused(session, new, reason, now)``), with
    what a negative acknowledgment is made from: the envelope errors and the earlier
    message a duplicate repeats."""

    new: NewMessage
    reason: str
    errors: list[str] = field(default_factory=list)
    duplicate_of: int | None = None


def check_intake(session: Session, new: NewMessage, checks: IntakeChecks, now: datetime,
                 earlier: int | None = -1,
                 parties: dict[str, tuple[str, str]] | None = None,
                 acks_of: dict | None = None,
                 envelope: dict[str, list[str]] | None = None) -> NewMessage | IntakeRefusal:
    """``new`` as it is stored (parties from the envelope, lines of the errors and of a
    duplicate let through) or its refusal. ``earlier``: the earlier message of the same
    interchange when the caller looked it up already (None: none); else it is looked up
    here, for a message with an envelope only, when ``duplicate_days`` is over 0.
    ``parties``: the envelope's identities' parties when the caller read them already
    (a receiver's lookup, :func:`by_envelope`); ``acks_of``: the parties' acknowledgment
    settings when the caller read them for a batch (``ack_waits.party_acks``);
    ``envelope``: :func:`envelope_of` ``new`` when the caller has it (the parties' step
    changes no attribute)."""
    new = by_envelope(session, new, checks.parties_from, parties, acks_of)
    if envelope is None:
        envelope = envelope_of(new)
    errors = envelope.get("edi_error", [])
    # a payload the source's unpacking refused (OpenPGP: docs/openpgp.md)
    reasons = [line["text"] for line in new.lines if line.get("type") == REFUSED_LINE]
    new.lines, lines = [line for line in new.lines if line.get("type") != REFUSED_LINE], []
    if errors:
        text = "envelope errors: " + "; ".join(errors)
        if checks.edi_errors == REFUSE:
            reasons.append(text)
        else:
            lines.append({"type": ERRORS_LINE, "text": f"{text} (accepted, as the source's "
                          "edi_errors says)", "data": {"errors": errors}})
    key = interchange_key(envelope)
    if earlier == -1:
        earlier = (earlier_messages(session, [key], checks.duplicate_days, now).get(key)
                   if key and checks.duplicate_days > 0 else None)
    if earlier is not None and key is not None:
        sender, control = key
        text = f"interchange {control} from {sender} was received before as message {earlier}"
        if checks.duplicates == REFUSE:
            reasons.append(f"duplicate: {text}")
        else:
            lines.append({"type": DUPLICATE_LINE, "text": text, "data": {
                "message_id": earlier, "sender": sender, "interchange_control": control}})
    new.lines = [*new.lines, *lines]
    if not reasons:
        return new
    # refused, so not routed: no line says it would have been
    new.lines = [line for line in new.lines if line.get("type") != "not_routed"]
    return IntakeRefusal(new, "; ".join(reasons), list(errors), earlier)


def envelope_of(new: NewMessage) -> dict[str, list[str]]:
    """The inspection's attributes of ``new`` by name: {} for a message without one."""
    found: dict[str, list[str]] = {}
    for table, row in new.rows:
        if table.name == "message_attributes":
            found.setdefault(row["name"], []).append(row["value"])
    return found


def interchange_key(envelope: dict[str, list[str]]) -> tuple[str, str] | None:
    """(sender, interchange control number) of an envelope, None without both."""
    sender, control = envelope.get("sender"), envelope.get("interchange_control")
    return (sender[0], control[0]) if sender and control else None


def earlier_messages(session: Session, keys, days: int, now: datetime
                     ) -> dict[tuple[str, str], int]:
    """The first message received within ``days`` before ``now`` (a Refused one does
    not count: it was not taken in) of each interchange (sender, control number), in one
    statement over the indexed attributes; {} for no keys."""
    keys = {key for key in keys if key is not None}
    if not keys or days <= 0:
        return {}
    # The messages with these control numbers first (few: control numbers are nearly
    # unique), then each one's sender by its id and name, the senders compared here.
    # Materialized, and with no sender value in the SQL, so that no plan can start from
    # the sender instead: a sender names every message of a partner, and with statistics
    # not yet gathered on a young table PostgreSQL did, reading all of them for each
    # check (674 ms at 115,000 attributes, and growing with them).
    controls = (select(MessageAttribute.message_id, MessageAttribute.value)
                .where(MessageAttribute.name == "interchange_control",
                       MessageAttribute.value.in_({c for _s, c in keys}))
                .cte("controls").prefix_with("MATERIALIZED"))
    sender = aliased(MessageAttribute)
    found = session.execute(
        select(sender.value, controls.c.value, Message.id)
        .select_from(controls)
        .join(sender, and_(sender.message_id == controls.c.message_id,
                           sender.name == "sender"))
        .join(Message, Message.id == controls.c.message_id)
        .where(Message.created_at >= now - timedelta(days=days),
               Message.status != MessageStatus.REFUSED)).all()
    rows: dict[tuple[str, str], int] = {}
    for s, c, mid in found:
        if (s, c) in keys and mid < rows.get((s, c), mid + 1):
            rows[(s, c)] = mid
    return rows


def store_checked_many(session: Session, batch: list[NewMessage], checks: IntakeChecks,
                       now: datetime) -> list[int]:
    """Check and store a batch in the caller's transaction: each refusal with
    ``store_refused`` (its envelope attributes kept), the rest with
    ``store_and_dispatch_many``, the duplicate alerts raised; the ids in batch order.
    A batch holding the same interchange twice gives the second the first's id."""
    envelopes = [envelope_of(new) for new in batch]
    keys = [interchange_key(envelope) for envelope in envelopes]
    found = earlier_messages(session, keys, checks.duplicate_days, now)
    # the parties' acknowledgment settings, once for the batch's interchanges
    acks_of = party_acks(session, {name for new, envelope in zip(batch, envelopes,
                                                                 strict=True)
                                   if envelope for name in (new.from_party, new.to_party)}
                         ) if any(envelopes) else None
    ids: list[int | None] = [None] * len(batch)
    pending: list[tuple[int, NewMessage]] = []
    first: dict[tuple[str, str], int] = {}  # an interchange's first place in the batch

    def store_pending() -> None:
        made = store_and_dispatch_many(session, [new for _i, new in pending], now)
        for (place, _new), message_id in zip(pending, made, strict=True):
            ids[place] = message_id
        alert_duplicates(session, [new for _i, new in pending], made, now)
        pending.clear()

    for place, (new, envelope, key) in enumerate(zip(batch, envelopes, keys, strict=True)):
        earlier = found.get(key) if key else None
        if earlier is None and key in first and checks.duplicate_days > 0:
            if ids[first[key]] is None:
                store_pending()
            earlier = ids[first[key]]
        checked = check_intake(session, new, checks, now, earlier, acks_of=acks_of,
                               envelope=envelope)
        if isinstance(checked, IntakeRefusal):
            ids[place] = store_intake_refusal(session, checked, now)
            continue
        pending.append((place, checked))
        if key is not None and key not in found:
            first.setdefault(key, place)
    if pending:
        store_pending()
    return ids


def store_intake_refusal(session: Session, refusal: IntakeRefusal, now: datetime) -> int:
    """``store_refused`` of the refusal's message, its rows of other tables with it (its
    envelope's attributes, found by the messages' filters; its acknowledgment's job)."""
    return store_refused(session, refusal.new, refusal.reason, now)


def alert_duplicates(session: Session, batch: list[NewMessage], ids: list[int],
                     now: datetime) -> None:
    """Raise ``duplicate_received`` for each stored message of ``batch`` (ids in its
    order) that :func:`check_intake` let through as a duplicate."""
    for new, message_id in zip(batch, ids, strict=True):
        for line in new.lines:
            if line.get("type") == DUPLICATE_LINE and "sender" in (line.get("data") or {}):
                raise_alert(session, DUPLICATE_LINE, f"message:{message_id}",
                            f"message {message_id}: {line['text']}"[:500], message_id, now)
