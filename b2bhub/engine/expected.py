"""Expected-message rules at work: beat's ``expected`` tick (docs/expected-messages.md).

One process at a time (the sweep's guard, a lock of its own), each tick:

1. **plans** each schedule rule's windows up to the one open now (``planned_until``
   fences what was written: a window that ended while the hub was down is written on
   its return, once; ``(rule_id, key)`` is unique besides);
2. **matches** the messages stored since the last tick, in id order from a cursor (the
   ``expected_cursor`` setting), to the rules: each is read once, by its primary key,
   and never again, so a tick costs what arrived since the last; a relation's request
   opens a window, an expected message meets the open window it falls in, or makes the
   rule's latest missed window late (resolving its alert);
3. **judges** the open windows whose end has passed (``ix_expected_windows_state_ends``):
   missed, with an ``expected_missing`` alert and history line.

Messages are read and windows judged up to :data:`SETTLE` before now, so that a
message stored a moment before a window's end, in a transaction still committing, is
matched before that window is judged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from b2bhub.domain import expected as rules
from b2bhub.engine.history import add_line, raise_alert
from b2bhub.engine.sweep import SweepGuard
from b2bhub.models import Alert, Delivery, Message, MessageAttribute, Setting
from b2bhub.models.expected import LATE, MET, MISSED, OPEN, ExpectedRule, ExpectedWindow

log = logging.getLogger(__name__)
KIND = "expected_missing"
LOCK_NAME, ADVISORY_KEY = "expected", 0x62326265  # "b2be"
CURSOR = "expected_cursor"
SETTLE = timedelta(seconds=5)
BATCH = 500


@dataclass
class TickReport:
    ran: bool = False
    planned: int = 0
    matched: int = 0
    missed: int = 0
    late: int = 0
    messages: int = 0
    notes: list[str] = field(default_factory=list)


def run(session: Session, now: datetime, owner: str) -> TickReport:
    """Beat's tick, under the guard: plan, match, judge (each committed)."""
    report = TickReport()
    with SweepGuard(session, owner, now, name=LOCK_NAME, key=ADVISORY_KEY) as held:
        if not held:
            return report
        report.ran = True
        horizon = now - SETTLE
        report.planned = plan_windows(session, now)
        session.commit()
        while True:
            read = match_messages(session, horizon, report)
            session.commit()
            if read < BATCH:
                break
        report.missed = judge_due(session, horizon, now)
        session.commit()
    return report


# --- planning -----------------------------------------------------------------------

def plan_windows(session: Session, now: datetime) -> int:
    """Write each enabled schedule rule's windows through the one open at ``now``."""
    written = 0
    for rule in session.scalars(select(ExpectedRule).where(
            ExpectedRule.enabled.is_(True), ExpectedRule.schedule.is_not(None))):
        _start, open_end = rules.next_window(rule.schedule, rule.timezone, now,
                                             rule.opens_minutes)
        after = rule.planned_until or rule.created_at
        if open_end <= after:
            continue
        for start, end in rules.schedule_windows(rule.schedule, rule.timezone, after,
                                                 open_end, rule.opens_minutes):
            written += _add_window(session, rule, f"end:{end:%Y-%m-%dT%H:%M:%S}", start, end)
        rule.planned_until = open_end
    return written


def _add_window(session: Session, rule: ExpectedRule, key: str, start: datetime,
                end: datetime, **extra) -> int:
    """Insert a window unless its key is taken; 1 when written."""
    try:
        with session.begin_nested():
            session.add(ExpectedWindow(rule_id=rule.id, key=key, starts_at=start,
                                       ends_at=end, state=OPEN, **extra))
        return 1
    except IntegrityError:
        return 0


# --- matching -----------------------------------------------------------------------

def match_messages(session: Session, horizon: datetime, report: TickReport) -> int:
    """Match the next batch of messages after the cursor stored by ``horizon``; how
    many were read (the cursor moves past them)."""
    cursor = _cursor(session)
    enabled = list(session.scalars(select(ExpectedRule).where(ExpectedRule.enabled.is_(True))))
    if not enabled:  # nothing to match: past them all at once (the created_at index)
        newest = session.scalar(select(Message.id).where(Message.created_at <= horizon)
                                .order_by(Message.created_at.desc(), Message.id.desc())
                                .limit(1))
        if newest is not None and newest > cursor:
            _set_cursor(session, newest)
        return 0
    batch = [m for m in session.execute(
        select(Message.id, Message.direction, Message.from_party, Message.to_party,
               Message.source, Message.original_filename, Message.created_at)
        .where(Message.id > cursor).order_by(Message.id).limit(BATCH))]
    taken = []
    for row in batch:
        if row.created_at > horizon:
            break  # later ones wait for the next tick, in order
        taken.append(row)
    if not taken:
        return 0
    facts = _facts(session, taken)
    for row in taken:
        for rule in enabled:
            _match_one(session, rule, row, facts[row.id], report)
    _set_cursor(session, taken[-1].id)
    report.messages += len(taken)
    return len(taken) if len(taken) == len(batch) else 0


def _facts(session: Session, taken: list) -> dict[int, rules.Facts]:
    """The rules' view of each message: its targets and document types, read in two
    statements for the batch (both by message id, each an index)."""
    ids = [row.id for row in taken]
    targets: dict[int, set[str]] = {}
    for mid, target in session.execute(select(Delivery.message_id, Delivery.target)
                                       .where(Delivery.message_id.in_(ids))):
        targets.setdefault(mid, set()).add(target)
    types: dict[int, set[str]] = {}
    for mid, value in session.execute(select(MessageAttribute.message_id,
                                             MessageAttribute.value).where(
            MessageAttribute.message_id.in_(ids), MessageAttribute.name == "document_type")):
        types.setdefault(mid, set()).add(value)
    return {row.id: rules.Facts(
        direction=row.direction, from_party=row.from_party, to_party=row.to_party,
        source=row.source, filename=row.original_filename or "",
        targets=frozenset(targets.get(row.id, ())),
        document_types=frozenset(types.get(row.id, ()))) for row in taken}


def criteria(rule: ExpectedRule) -> rules.Criteria:
    return rules.Criteria(direction=rule.direction, from_party=rule.from_party,
                          to_party=rule.to_party, source=rule.source, target=rule.target,
                          filename=rule.filename, document_type=rule.document_type)


def after_criteria(rule: ExpectedRule) -> rules.Criteria:
    after = rule.after or {}
    return rules.Criteria(direction=after.get("direction", rules.ANY),
                          filename=after.get("filename", rules.ANY),
                          document_type=after.get("document_type", rules.ANY))


def _match_one(session: Session, rule: ExpectedRule, row, facts: rules.Facts,
               report: TickReport) -> None:
    if rule.after is not None and rules.triggers(criteria(rule), after_criteria(rule), facts):
        _add_window(session, rule, f"message:{row.id}", row.created_at,
                    row.created_at + timedelta(minutes=rule.within_minutes or 0),
                    trigger_message_id=row.id, from_party=row.to_party,
                    to_party=row.from_party)
        return
    if not rules.matches(criteria(rule), facts):
        return
    windows = select(ExpectedWindow).where(ExpectedWindow.rule_id == rule.id)
    if rule.after is not None:
        windows = windows.where(ExpectedWindow.from_party == row.from_party,
                                ExpectedWindow.to_party == row.to_party)
    latest = session.scalar(windows.where(ExpectedWindow.state != OPEN)
                            .order_by(ExpectedWindow.ends_at.desc()).limit(1))
    if latest is not None and latest.state == MISSED and latest.ends_at < row.created_at:
        _late(session, rule, latest, row)
        report.late += 1
        return
    window = session.scalar(windows.where(
        ExpectedWindow.state == OPEN, ExpectedWindow.starts_at <= row.created_at,
        ExpectedWindow.ends_at >= row.created_at).order_by(ExpectedWindow.ends_at).limit(1))
    if window is not None:
        window.state, window.message_id, window.arrived_at = MET, row.id, row.created_at
        window.judged_at = row.created_at
        report.matched += 1


def _late(session: Session, rule: ExpectedRule, window: ExpectedWindow, row) -> None:
    """The missed window's message came: late, and its alert resolved saying by how
    much."""
    minutes = rules.minutes_late(window.ends_at, row.created_at)
    window.state, window.message_id, window.arrived_at = LATE, row.id, row.created_at
    said = f"arrived {minutes} min late (message {row.id})"
    session.execute(update(Alert).where(
        Alert.kind == KIND, Alert.subject == subject(rule, window),
        Alert.resolved_at.is_(None)).values(resolved_at=row.created_at,
                                            text=Alert.text + "; " + said))
    add_line(session, row.id, "expected_late",
             f"{rule.name}: {said} for the window {window_text(rule, window)}",
             data={"rule": rule.name, "window": window.id, "minutes_late": minutes})
    log.info("expected message of rule %s %s", rule.name, said)


# --- judging ------------------------------------------------------------------------

def judge_due(session: Session, horizon: datetime, now: datetime) -> int:
    """Mark missed each open window that ended by ``horizon``, with its alert."""
    due = list(session.scalars(select(ExpectedWindow).where(
        ExpectedWindow.state == OPEN, ExpectedWindow.ends_at <= horizon)
        .order_by(ExpectedWindow.ends_at).limit(BATCH)))
    for window in due:
        rule = session.get(ExpectedRule, window.rule_id)
        window.state, window.judged_at = MISSED, now
        text = f"no message for rule {rule.name} in the window {window_text(rule, window)}"
        raise_alert(session, KIND, subject(rule, window), text,
                    message_id=window.trigger_message_id, now=now)
        add_line(session, window.trigger_message_id, KIND, text,
                 data={"rule": rule.name, "window": window.id})
    return len(due)


def subject(rule: ExpectedRule, window: ExpectedWindow) -> str:
    return f"expected:{rule.name}:{window.key}"


def window_text(rule: ExpectedRule, window: ExpectedWindow) -> str:
    """The window as people read it: the schedule's on its wall clock, a relation's as
    the request it answers."""
    if window.trigger_message_id is not None:
        return (f"{rule.within_minutes} min after message {window.trigger_message_id} "
                f"({rules.describe_window(window.starts_at, window.ends_at, 'UTC')})")
    return rules.describe_window(window.starts_at, window.ends_at, rule.timezone)


# --- the cursor ---------------------------------------------------------------------

def _cursor(session: Session) -> int:
    """The last message id matched; at the first tick, the newest (rules watch the
    messages stored after they start to be evaluated)."""
    value = session.scalar(select(Setting.value).where(Setting.key == CURSOR))
    if isinstance(value, dict) and isinstance(value.get("message_id"), int):
        return value["message_id"]
    newest = session.scalar(select(Message.id).order_by(Message.id.desc()).limit(1)) or 0
    _set_cursor(session, newest)
    return newest


def _set_cursor(session: Session, message_id: int) -> None:
    row = session.get(Setting, CURSOR) or Setting(key=CURSOR)
    row.value = {"message_id": message_id}
    session.add(row)
