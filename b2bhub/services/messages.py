"""The read side of messages and deliveries: lists with filters, one message in full."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from b2bhub.domain.states import DeliveryState, MessageStatus
from b2bhub.models import Delivery, HistoryLine, Message
from b2bhub.services.errors import NotFound, ServiceError
from b2bhub.services.pages import Page, keyset_page


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


@dataclass
class DeliveryFilter:
    target: str | None = None
    state: list[str] | None = None
    message_id: int | None = None


def _check_values(field: str, given: list[str] | None, allowed: type) -> None:
    known = [member.value for member in allowed]
    wrong = [value for value in given or () if value not in known]
    if wrong:
        raise ServiceError(f"{field}: unknown value(s) {', '.join(wrong)} "
                           f"(known: {', '.join(known)})", {field: "unknown value"})


def _message_query(f: MessageFilter) -> Select:
    stmt = select(Message)
    for column, value in ((Message.from_party, f.from_party), (Message.to_party, f.to_party),
                          (Message.source, f.source)):
        if value is not None:
            stmt = stmt.where(column == value)
    if f.status:
        stmt = stmt.where(Message.status.in_(f.status))
    if f.target is not None:
        stmt = stmt.where(Message.id.in_(
            select(Delivery.message_id).where(Delivery.target == f.target)))
    if f.since is not None:
        stmt = stmt.where(Message.created_at >= f.since)
    if f.until is not None:
        stmt = stmt.where(Message.created_at < f.until)
    if f.q:
        stmt = stmt.where(_search(f.q.strip()))
    return stmt


def _search(text: str):
    """``q``: a message id, or a part of the file name, external or correlation id."""
    pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    found = [column.ilike(pattern, escape="\\") for column in (
        Message.original_filename, Message.external_id, Message.correlation_id)]
    if text.isdigit():
        found.append(Message.id == int(text))
    return or_(*found)


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
    return keyset_page(session, _message_query(filters), Message.id, limit, after,
                       descending=True)


def get_message(session: Session, message_id: int) -> Message:
    message = session.get(Message, message_id)
    if message is None:
        raise NotFound(f"no message {message_id}")
    return message


def message_history(session: Session, message_id: int) -> list[HistoryLine]:
    """Every history line of a message, oldest first."""
    return list(session.scalars(select(HistoryLine).where(
        HistoryLine.message_id == message_id).order_by(HistoryLine.id)))


def list_deliveries(session: Session, filters: DeliveryFilter, limit: int,
                    after: int | None = None) -> Page:
    """Deliveries matching ``filters``, newest first."""
    _check_values("state", filters.state, DeliveryState)
    stmt = select(Delivery)
    if filters.target is not None:
        stmt = stmt.where(Delivery.target == filters.target)
    if filters.state:
        stmt = stmt.where(Delivery.state.in_(filters.state))
    if filters.message_id is not None:
        stmt = stmt.where(Delivery.message_id == filters.message_id)
    return keyset_page(session, stmt, Delivery.id, limit, after, descending=True)
