"""The read side of messages and deliveries: lists with filters, one message in full."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from b2bhub.domain.i18n import N_
from b2bhub.domain.states import DeliveryState, MessageStatus
from b2bhub.domain.status_codes import CODES, statuses_of
from b2bhub.engine import ack_waits, operator
from b2bhub.models import AckWait, Delivery, HistoryLine, Message, MessageAttribute
from b2bhub.models.acks import ACKNOWLEDGED, AWAITING, REJECTED
from b2bhub.models.pages import Page, keyset_page
from b2bhub.services.errors import NotFound, ServiceError


@dataclass
class MessageFilter:
    """What ``GET /messages`` may filter on; None means any. Times are naive UTC."""

    status: list[str] | None = None
    from_party: str | None = None
    to_party: str | None = None
    source: str | None = None
    target: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    q: str | None = None
    correlation_id: str | None = None  # exact (indexed)
    #: envelope attributes (docs/edi.md), each exact: every one given must be among the
    #: message's own (an interchange holding an 850 and an 810 matches either type)
    document_type: str | None = None
    sender: str | None = None
    receiver: str | None = None
    interchange_control: str | None = None
    group_control: str | None = None
    transaction_control: str | None = None
    reference: str | None = None
    #: the acknowledgment expected of its partner (docs/edi.md): one of
    #: :data:`ACKNOWLEDGMENTS`
    acknowledgment: str | None = None


#: the values of the ``acknowledgment`` filter: as the message shows it (``overdue``:
#: awaiting and overdue; ``none``: none expected)
ACKNOWLEDGMENTS = (AWAITING, "overdue", ACKNOWLEDGED, REJECTED, "none")


#: the envelope filters of :class:`MessageFilter`, each a message attribute's name
ENVELOPE_FILTERS = ("document_type", "sender", "receiver", "interchange_control",
                    "group_control", "transaction_control", "reference")


@dataclass
class DeliveryFilter(MessageFilter):
    """The message filters (on the delivery's message; ``target``, ``since`` and
    ``until`` on the delivery itself) plus the delivery's ``state`` and message."""

    state: list[str] | None = None
    message_id: int | None = None


def _check_values(field: str, given: list[str] | None, allowed: type) -> None:
    """Refuse a value of ``given`` that is not one of ``allowed`` (a message status may
    also be one of seed 003's identifiers: ``b2bhub.domain.status_codes``)."""
    known = [member.value for member in allowed] + (
        list(CODES) if allowed is MessageStatus else [])
    wrong = [value for value in given or () if value not in known]
    if wrong:
        raise ServiceError(N_("%(field)s: unknown value(s) %(wrong)s (known: %(known)s)",
                              field=field, wrong=", ".join(wrong), known=", ".join(known)),
                           {field: "unknown value"})


def _message_conditions(f: MessageFilter) -> list:
    """Conditions on the message's own columns (not target, since, until)."""
    conditions = [column == value for column, value in (
        (Message.from_party, f.from_party), (Message.to_party, f.to_party),
        (Message.source, f.source), (Message.correlation_id, f.correlation_id))
        if value is not None]
    if f.status:
        conditions.append(Message.status.in_(statuses_of(f.status)))
    if f.q:
        conditions.append(_text_search(f.q))
    for name in ENVELOPE_FILTERS:
        value = getattr(f, name)
        if value is not None:
            conditions.append(select(MessageAttribute.id).where(
                MessageAttribute.message_id == Message.id, MessageAttribute.name == name,
                MessageAttribute.value == value).exists())
    if f.acknowledgment is not None:
        conditions.append(_acknowledged(f.acknowledgment))
    return conditions


def _acknowledged(value: str):
    """The messages whose acknowledgment (:func:`b2bhub.engine.ack_waits.state_of`) is
    ``value``, by their waits: rejected outranks awaiting, which outranks acknowledged."""
    def waits(*where):
        return select(AckWait.id).where(AckWait.message_id == Message.id, *where).exists()

    rejected, awaiting = waits(AckWait.state == REJECTED), waits(AckWait.state == AWAITING)
    if value == REJECTED:
        return rejected
    if value == AWAITING:
        return awaiting & ~rejected
    if value == "overdue":
        return waits(AckWait.state == AWAITING, AckWait.overdue.is_(True)) & ~rejected
    if value == ACKNOWLEDGED:
        return waits() & ~awaiting & ~rejected
    return ~waits()


def attach_acknowledgments(session: Session, messages) -> list:
    """Give each message its ``acknowledgment`` (state, overdue) for the API's shape,
    read for all of them in one statement."""
    messages = list(messages)
    found = ack_waits.acknowledgments(session, [m.id for m in messages])
    for message in messages:
        message.acknowledgment = found[message.id]
    return messages


def _text_search(q: str):
    """``q``: a message id, text in the original file name (any case), or an external
    or correlation id (exact). The file name part reads every row the other filters
    leave, so on a large store combine it with a time range or a party."""
    found = [func.lower(Message.original_filename).contains(q.lower(), autoescape=True),
             Message.external_id == q, Message.correlation_id == q]
    if q.isdigit() and len(q) < 19:
        found.append(Message.id == int(q))
    return or_(*found)


def _message_query(f: MessageFilter) -> Select:
    stmt = select(Message).where(*_message_conditions(f))
    if f.target is not None:
        # EXISTS, not IN: SQLite would first list every message id of the target
        stmt = stmt.where(select(Delivery.id).where(
            Delivery.message_id == Message.id, Delivery.target == f.target).exists())
    if f.since is not None or f.until is not None:
        # Newest first is by id: bound the ids by the window's lowest and highest (read
        # from the (created_at, id) index alone), so the database reads the window's
        # newest rows by primary key instead of every row of the window and a sort.
        # "id + 0": otherwise PostgreSQL answers min(id) by walking the primary key
        # from the oldest row, reading every row older than the window.
        window = _in_time_range(select(Message.id), Message.created_at, f)
        bound = Message.id + 0
        stmt = _in_time_range(stmt, Message.created_at, f).where(
            Message.id >= window.with_only_columns(func.min(bound)).scalar_subquery(),
            Message.id <= window.with_only_columns(func.max(bound)).scalar_subquery())
    return stmt


def _in_time_range(stmt: Select, column, f: MessageFilter) -> Select:
    """``since`` inclusive, ``until`` exclusive."""
    if f.since is not None:
        stmt = stmt.where(column >= f.since)
    if f.until is not None:
        stmt = stmt.where(column < f.until)
    return stmt


def messages_by_id(session: Session, ids: list[int]) -> list[Message]:
    """The messages with these ids, newest first (unknown ids are left out)."""
    if not ids:
        return []
    return list(session.scalars(select(Message).where(Message.id.in_(ids))
                                .order_by(Message.id.desc())))


def matching_ids(session: Session, filters: MessageFilter, ids: list[int]) -> set[int]:
    """Which of ``ids`` the filters match (a live list asks this of rows that changed)."""
    return set(session.scalars(_message_query(filters).with_only_columns(Message.id)
                               .where(Message.id.in_(ids))))


def list_messages(session: Session, filters: MessageFilter, limit: int,
                  after: int | None = None) -> Page:
    """Messages matching ``filters``, newest first, ``limit`` at a time after id ``after``."""
    _check_values("status", filters.status, MessageStatus)
    if filters.acknowledgment is not None and filters.acknowledgment not in ACKNOWLEDGMENTS:
        raise ServiceError(N_("acknowledgment: unknown value %(wrong)s (known: %(known)s)",
                              wrong=filters.acknowledgment,
                              known=", ".join(ACKNOWLEDGMENTS)),
                           {"acknowledgment": "unknown value"})
    return keyset_page(session, _message_query(filters), Message.id, limit, after,
                       descending=True)


def get_message(session: Session, message_id: int) -> Message:
    message = session.get(Message, message_id)
    if message is None:
        raise NotFound(N_("no message %(id)s", id=message_id))
    return message


def message_history(session: Session, message_id: int) -> list[HistoryLine]:
    """Every history line of a message, oldest first."""
    return list(session.scalars(select(HistoryLine).where(
        HistoryLine.message_id == message_id).order_by(HistoryLine.id)))


def message_envelope(session: Session, message_id: int) -> list[dict]:
    """What the inspector read of a message's envelope (docs/edi.md): ``name`` and
    ``value`` pairs in the order read; [] for a message no inspector recognised."""
    return [{"name": name, "value": value} for name, value in session.execute(
        select(MessageAttribute.name, MessageAttribute.value).where(
            MessageAttribute.message_id == message_id).order_by(MessageAttribute.id))]


def delivery_query(filters: DeliveryFilter, columns=(Delivery,)) -> Select:
    """Deliveries matching ``filters`` (also what the bulk redeliver selects)."""
    _check_values("status", filters.status, MessageStatus)
    _check_values("state", filters.state, DeliveryState)
    stmt = select(*columns)
    on_message = _message_conditions(filters)
    if on_message:
        stmt = stmt.join(Message, Message.id == Delivery.message_id).where(*on_message)
    for column, value in ((Delivery.target, filters.target),
                          (Delivery.message_id, filters.message_id)):
        if value is not None:
            stmt = stmt.where(column == value)
    if filters.state:
        stmt = stmt.where(Delivery.state.in_(filters.state))
    return _in_time_range(stmt, Delivery.created_at, filters)


def list_deliveries(session: Session, filters: DeliveryFilter, limit: int,
                    after: int | None = None) -> Page:
    """Deliveries matching ``filters``, newest first."""
    return keyset_page(session, delivery_query(filters), Delivery.id, limit, after,
                       descending=True)


def redeliver_matching(session: Session, filters: DeliveryFilter, max_count: int,
                       actor: str, now: datetime) -> operator.BulkResult:
    """The bulk Redeliver (:func:`b2bhub.engine.operator.redeliver_many`) of the
    failed, stalled or retrying deliveries matching ``filters``."""
    allowed = sorted(operator.REDELIVERABLE)
    states = [state for state in (filters.state or allowed) if state in allowed]
    if not states:
        return operator.BulkResult([], [], False)
    return operator.redeliver_many(
        session, delivery_query(replace(filters, state=states)), max_count, actor, now)
