"""Delivery Errors (SPEC 12): failed, business-error and stalled deliveries, and the
bulk Redeliver of the ones selected or of every one a filter matches. Collection errors
(fetches a scheduled source could not make) have no delivery and are not listed here:
seed 003 keeps ERRO_COLETA apart from ERRO_ENTREGA; the page only counts them, with a
link to the messages in that status."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.orm import Session

from b2bhub.domain.i18n import N_
from b2bhub.domain.states import DeliveryState, FailureKind, MessageStatus
from b2bhub.engine import operator
from b2bhub.models import Delivery, Message
from b2bhub.models.pages import Page, keyset_page
from b2bhub.services.errors import ServiceError

#: what the page calls each kind of error, and the rows it stands for
KINDS = {
    "technical": and_(Delivery.state == DeliveryState.FAILED,
                      Delivery.failure_kind != FailureKind.BUSINESS),
    "business": and_(Delivery.state == DeliveryState.FAILED,
                     Delivery.failure_kind == FailureKind.BUSINESS),
    "stalled": Delivery.state == DeliveryState.STALLED,
}
#: seed 003's identifiers a client may give for a kind (docs/status-codes.md): its two
#: delivery errors; a stalled delivery is ENFILEIRADA there (still waiting for a worker)
KIND_CODES = {"ERRO_ENTREGA": "technical", "ERRO_NEGOCIO": "business"}
#: the most deliveries one bulk Redeliver takes, so one click cannot hold the database
#: for minutes; the page says when more remain
BULK_LIMIT = 5000


@dataclass
class ErrorFilter:
    """None means any. ``partner`` matches the message's from or to; times bound when the
    delivery last changed (naive UTC)."""

    target: str | None = None
    partner: str | None = None
    kinds: list[str] | None = None
    since: datetime | None = None
    until: datetime | None = None


def _query(f: ErrorFilter) -> Select:
    kinds = [KIND_CODES.get(kind, kind) for kind in f.kinds or ()]
    wrong = [kind for kind in kinds if kind not in KINDS]
    if wrong:
        raise ServiceError(N_("%(field)s: unknown value(s) %(wrong)s (known: %(known)s)",
                              field="kind", wrong=", ".join(wrong),
                              known=", ".join([*KINDS, *KIND_CODES])),
                           {"kind": "unknown value"})
    stmt = select(Delivery).join(Message, Message.id == Delivery.message_id).where(
        or_(*(KINDS[kind] for kind in kinds or KINDS)))
    if f.target:
        stmt = stmt.where(Delivery.target == f.target)
    if f.partner:
        stmt = stmt.where(or_(Message.from_party == f.partner, Message.to_party == f.partner))
    if f.since is not None:
        stmt = stmt.where(Delivery.updated_at >= f.since)
    if f.until is not None:
        stmt = stmt.where(Delivery.updated_at < f.until)
    return stmt


def list_errors(session: Session, f: ErrorFilter, limit: int, after: int | None = None
                ) -> Page:
    """The matching deliveries, newest first."""
    return keyset_page(session, _query(f), Delivery.id, limit, after, descending=True)


def count_errors(session: Session, f: ErrorFilter) -> int:
    return session.scalar(_query(f).with_only_columns(func.count(Delivery.id))) or 0


def count_collection_errors(session: Session) -> int:
    """Messages in status Collection error (on the status index)."""
    return session.scalar(select(func.count(Message.id)).where(
        Message.status == MessageStatus.COLLECTION_ERROR)) or 0


def redeliver_errors(session: Session, f: ErrorFilter, ids: list[int] | None, actor: str,
                     now: datetime) -> operator.BulkResult:
    """The bulk Redeliver (:func:`b2bhub.engine.operator.redeliver_many`) of the
    deliveries with ``ids`` that the filter matches, or of every matching one when
    ``ids`` is None, at most :data:`BULK_LIMIT`."""
    stmt = _query(f)
    if ids is not None:
        stmt = stmt.where(Delivery.id.in_(ids))
    return operator.redeliver_many(session, stmt, BULK_LIMIT, actor, now)
