"""Acknowledgments we receive for interchanges we send (docs/edi.md).

- **A wait starts when the message is stored.** An outbound message (from one of our
  organizations to a partner) whose envelope the intake read (X12 or EDIFACT, not
  itself an acknowledgment) and whose partner has ``ack_hours`` gets a row in
  ``edi_ack_waits`` per X12 functional group (matched by GS06) or per EDIFACT
  interchange (matched by UNB 0020), inserted with the message; it is due
  ``ack_hours`` after that.
- **An acknowledgment received** (a message whose envelope acknowledges something) gets
  a row in ``edi_acks_received``, due at once, inserted with the message. A worker
  (beat's ``edi-acks`` tick, every 5 s) claims each due row by clearing its due time (an
  UPDATE only one worker wins), matches it to the waits and settles them, with their
  history lines and alerts, in that one transaction: a worker killed half-way leaves
  the row due for the next tick.
- **Overdue**: the same tick marks every awaiting wait whose time has come overdue, with
  an ``ack_overdue`` history line and alert on its message, in one transaction per
  batch (fenced by the due time, cleared as it is taken). An acknowledgment arriving
  later still settles it, and resolves the alert once nothing of the message is overdue.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import case, exists, func, select, update
from sqlalchemy.orm import Session

from b2bhub.engine.history import add_lines, raise_alert, resolve_alert
from b2bhub.models import ORGANIZATION, PARTNER, AckJob, AckReceived, AckWait, Party, utcnow
from b2bhub.models.acks import ACKNOWLEDGED, AWAITING, REJECTED
from b2bhub.plugin import Envelope

log = logging.getLogger(__name__)
#: document types that are acknowledgments: never acknowledged themselves
ACK_TYPES = frozenset({"997", "999", "CONTRL"})
#: the results that settle a wait as rejected (the others: acknowledged)
REJECTING = frozenset({"rejected", "partially accepted"})
PENDING, MATCHED, UNMATCHED = "pending", "matched", "unmatched"
BATCH = 100


# --- at intake: rows that go in with the message ----------------------------------

def envelope_rows(env: Envelope, waits: bool = True) -> list[tuple]:
    """The rows an envelope brings beside its attributes: a received acknowledgment's
    ``edi_acks_received`` row, or, for any other X12 / EDIFACT interchange and
    ``waits``, the waits it would have (completed or dropped by :func:`with_waits` once
    the parties are known)."""
    if env.standard not in ("X12", "EDIFACT") or not env.sender or not env.receiver:
        return []
    if env.acknowledges:
        now = utcnow()
        document = ", ".join(dict.fromkeys(t.split(":")[0] for t in env.types))
        return [(AckReceived.__table__, {
            "standard": env.standard, "sender": env.sender[:64],
            "receiver": env.receiver[:64],
            "acknowledges": [{**entry, "document": document} for entry in env.acknowledges],
            "state": PENDING, "due_at": now, "created_at": now})]
    if not waits or not env.types or set(env.types) <= ACK_TYPES or not env.control:
        return []
    base = {"standard": env.standard, "our_identity": env.sender[:64],
            "partner_identity": env.receiver[:64], "interchange_control": env.control[:35]}
    if env.standard == "EDIFACT":
        keys = [(env.control, "")]
    else:
        keys = list(dict.fromkeys((g["control"], g["functional_id"]) for g in env.groups
                                  if g["control"]))
    return [(AckWait.__table__, {**base, "control": control[:35],
                                 "functional_id": functional_id[:8]})
            for control, functional_id in keys]


def ack_due(sender_kind: str | None, functional_acks: str | None,
            receiver_kind: str | None) -> bool:
    """Whether an interchange is due a functional acknowledgment from us: its sender is
    a partner set to get them, its receiver one of our organizations (docs/edi.md; the
    same rule as ``acks.drop_unwanted``'s SQL)."""
    return sender_kind == PARTNER and functional_acks not in (None, "none") \
        and receiver_kind == ORGANIZATION


def party_acks(session: Session, names) -> dict[str, tuple[str, int | None, str]]:
    """Each named party's kind, ``ack_hours`` and ``functional_acks``, in one statement
    (for a batch of messages at once: :func:`with_waits` takes them)."""
    return {name: (kind, hours, acks) for name, kind, hours, acks in session.execute(
        select(Party.name, Party.kind, Party.ack_hours, Party.functional_acks).where(
            Party.name.in_(set(names))))}


def with_waits(session: Session, new, acks_of: dict | None = None):
    """``new`` (a :class:`b2bhub.engine.dispatch.NewMessage`) with its waits complete
    when it goes from one of our organizations to a partner that has ``ack_hours``, and
    without them otherwise; once its parties are read, without the job of an
    acknowledgment its sender is not due (:mod:`b2bhub.engine.acks`; the worker asks
    again). ``acks_of``: :func:`party_acks` of a batch's parties, read before; else one
    statement, only for a message that has an envelope and whose direction its source
    did not give as inbound or internal (an inbound one's job stays for the worker)."""
    table = AckWait.__table__
    waits = [row for t, row in new.rows if t is table]
    if not waits:
        return new
    new.rows = [(t, row) for t, row in new.rows if t is not table]
    if new.direction in ("inbound", "internal"):
        return new  # its source knew its parties' kinds: no partner waits on us
    wanted = {new.from_party, new.to_party}
    if acks_of is None or not wanted <= acks_of.keys():
        acks_of = {**(acks_of or {}), **party_acks(session, wanted)}
    sender, receiver = acks_of.get(new.from_party), acks_of.get(new.to_party)
    if not ack_due(sender and sender[0], sender and sender[2], receiver and receiver[0]):
        new.rows = [(t, row) for t, row in new.rows if t is not AckJob.__table__]
    if sender is None or receiver is None or sender[0] != ORGANIZATION \
            or receiver[0] != PARTNER or not receiver[1]:
        return new
    now = utcnow()
    new.rows += [(table, {**row, "partner": new.to_party, "state": AWAITING,
                          "due_at": now + timedelta(hours=receiver[1]), "overdue": False,
                          "ack_message_id": None, "result": "", "codes": [],
                          "created_at": now, "settled_at": None}) for row in waits]
    return new


def acknowledgment_received(message_id: int):
    """An EXISTS clause: the message is an acknowledgment received (kept, not routed on
    unless a route asks: its Not routed raises no alert)."""
    return exists(select(AckReceived.id).where(AckReceived.message_id == message_id))


# --- the worker: matching and overdue ---------------------------------------------

def run(session: Session, now: datetime) -> dict:
    """Beat's tick: match the acknowledgments due, then raise the overdue waits."""
    matched = match_due(session, now)
    overdue = 0
    while True:
        found = raise_overdue(session, now)
        overdue += found
        if found < BATCH:
            break
    return {"matched": matched, "overdue": overdue}


def match_due(session: Session, now: datetime, limit: int = BATCH) -> int:
    """Match each due acknowledgment in a transaction of its own; how many were taken."""
    ids = list(session.scalars(select(AckReceived.id).where(AckReceived.due_at <= now)
                               .order_by(AckReceived.due_at, AckReceived.id).limit(limit)))
    session.rollback()
    taken = 0
    for row_id in ids:
        try:
            claimed = session.execute(update(AckReceived.__table__).where(
                AckReceived.id == row_id, AckReceived.due_at.is_not(None))
                .values(due_at=None)).rowcount
            if claimed:
                _settle(session, session.get(AckReceived, row_id), now)
                taken += 1
            session.commit()
        except Exception:
            session.rollback()
            log.exception("acknowledgment %s could not be matched; it stays due", row_id)
    return taken


def _settle(session: Session, ack: AckReceived, now: datetime) -> None:
    lines: list[dict] = []
    cleared: set[int] = set()
    found = False
    for entry in ack.acknowledges or []:
        what = describe(entry)
        wait = _wait_for(session, ack, entry)
        if wait is None:
            lines.append({"message_id": ack.message_id, "type": "ack_unmatched",
                          "text": f"acknowledges {what} ({entry.get('result')}), which "
                                  f"matches no interchange we sent to {ack.sender}"})
            continue
        found = True
        result = entry.get("result") or "accepted"
        codes = list(entry.get("codes") or [])
        again = wait.state != AWAITING
        wait.state = REJECTED if result in REJECTING else ACKNOWLEDGED
        wait.result, wait.codes, wait.ack_message_id = result[:32], codes, ack.message_id
        wait.due_at, wait.settled_at = None, now
        kind = _document(ack)
        lines.append({"message_id": wait.message_id, "type": "ack_received",
                      "text": f"{kind} (message {ack.message_id}): {what} {result}"
                              + (f"; codes {', '.join(codes)}" if codes else "")
                              + (" (acknowledged before)" if again else ""),
                      "data": {"result": result, "state": wait.state, "codes": codes,
                               "ack_message_id": ack.message_id}})
        lines.append({"message_id": ack.message_id, "type": "ack_matched",
                      "text": f"acknowledges message {wait.message_id}: {what} {result}",
                      "data": {"message_id": wait.message_id, "result": result}})
        if wait.overdue:
            cleared.add(wait.message_id)
    ack.state = MATCHED if found else UNMATCHED
    session.flush()
    add_lines(session, lines, now)
    for message_id in cleared:
        if not _still_overdue(session, message_id):
            resolve_alert(session, "ack_overdue", f"message:{message_id}", now)


def _wait_for(session: Session, ack: AckReceived, entry: dict) -> AckWait | None:
    """The wait an entry acknowledges: the newest awaiting one with its key, else the
    newest settled one (an acknowledgment sent again)."""
    if entry.get("standard") == "EDIFACT":
        ours = entry.get("sender") or ack.receiver
        theirs = entry.get("receiver") or ack.sender
        control, functional_id = entry.get("interchange_control") or "", None
    else:
        ours, theirs = ack.receiver, ack.sender
        control = entry.get("group_control") or ""
        functional_id = entry.get("functional_id") or None
    if not control:
        return None
    query = select(AckWait).where(
        AckWait.standard == ack.standard, AckWait.partner_identity == theirs,
        AckWait.our_identity == ours, AckWait.control == control)
    if functional_id is not None:
        query = query.where(AckWait.functional_id == functional_id)
    return session.scalars(query.order_by(
        case((AckWait.state == AWAITING, 0), else_=1), AckWait.id.desc()).limit(1)).first()


def _still_overdue(session: Session, message_id: int) -> bool:
    return session.scalar(select(func.count()).select_from(AckWait).where(
        AckWait.message_id == message_id, AckWait.state == AWAITING,
        AckWait.overdue.is_(True))) > 0


def raise_overdue(session: Session, now: datetime, limit: int = BATCH) -> int:
    """Mark the waits whose time has come overdue, in one transaction: a line and the
    ``ack_overdue`` alert on each message. How many waits were taken."""
    table = AckWait.__table__
    due = select(table.c.id).where(table.c.due_at <= now).limit(limit).scalar_subquery()
    try:
        taken = session.execute(update(table).where(
            table.c.id.in_(due), table.c.due_at <= now)
            .values(due_at=None, overdue=True)
            .returning(table.c.message_id, table.c.partner, table.c.standard,
                       table.c.control, table.c.functional_id, table.c.created_at)).all()
        by_message: dict[int, list] = {}
        for row in taken:
            by_message.setdefault(row.message_id, []).append(row)
        lines = []
        for message_id, waits in sorted(by_message.items()):
            first = waits[0]
            hours = _hours(session, first.partner)
            what = ", ".join(_wait_text(w) for w in waits)
            text = (f"no acknowledgment from {first.partner} for {what} within "
                    f"{hours} h" if hours else
                    f"no acknowledgment from {first.partner} for {what} in time")
            lines.append({"message_id": message_id, "type": "ack_overdue", "text": text})
            raise_alert(session, "ack_overdue", f"message:{message_id}",
                        f"message {message_id}: {text}"[:500], message_id, now)
        add_lines(session, lines, now)
        session.commit()
    except Exception:
        session.rollback()
        raise
    return len(taken)


def _hours(session: Session, partner: str) -> int | None:
    return session.scalar(select(Party.ack_hours).where(Party.name == partner))


def _wait_text(wait) -> str:
    if wait.standard == "EDIFACT":
        return f"interchange {wait.control}"
    return f"group {wait.functional_id} {wait.control}".replace("  ", " ")


def _document(ack: AckReceived) -> str:
    """The acknowledgment's document type(s) as its envelope gave them (997, CONTRL)."""
    entries = ack.acknowledges or [{}]
    return entries[0].get("document") or ("CONTRL" if ack.standard == "EDIFACT" else "997")


def describe(entry: dict) -> str:
    """What an entry of ``Envelope.acknowledges`` acknowledges, as history says it."""
    if entry.get("standard") == "EDIFACT":
        return f"interchange {entry.get('interchange_control')}"
    return f"group {entry.get('functional_id', '')} {entry.get('group_control')}".replace(
        "  ", " ")


# --- what a message shows --------------------------------------------------------

def state_of(waits: list[tuple[str, bool]]) -> tuple[str | None, bool]:
    """A message's acknowledgment from its waits' (state, overdue): None (none
    expected), rejected (any group or interchange rejected), awaiting (any still
    awaited; overdue when one of those is), else acknowledged."""
    if not waits:
        return None, False
    states = {state for state, _ in waits}
    if REJECTED in states:
        return REJECTED, False
    if AWAITING in states:
        return AWAITING, any(o for s, o in waits if s == AWAITING)
    return ACKNOWLEDGED, False


def acknowledgments(session: Session, message_ids) -> dict[int, tuple[str | None, bool]]:
    """:func:`state_of` of each message, in one statement."""
    ids = list(message_ids)
    found: dict[int, list[tuple[str, bool]]] = {}
    if ids:
        for mid, state, overdue in session.execute(select(
                AckWait.message_id, AckWait.state, AckWait.overdue).where(
                AckWait.message_id.in_(ids))):
            found.setdefault(mid, []).append((state, bool(overdue)))
    return {mid: state_of(found.get(mid, [])) for mid in ids}
