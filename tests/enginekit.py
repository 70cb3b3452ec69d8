"""Helpers for the engine tests: a fixed clock, a broker stand-in, row readers and the
usual parties and instances. Times are naive UTC like every time column."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from b2bhub.engine import dispatch
from b2bhub.engine.machine import claiming
from b2bhub.models import Alert, Delivery, HistoryLine, Message
from b2bhub.services import config as svc

#: the moment every engine test starts at; later moments are T0 + an interval
T0 = datetime(2030, 1, 7, 9, 0, 0)


class Clock:
    """The runner's clock, moved by the test instead of waiting; starts at now."""

    def __init__(self):
        from b2bhub.models import utcnow
        self.now = utcnow()

    def __call__(self):
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def at(seconds: float = 0, **interval: float) -> datetime:
    """T0 plus ``seconds`` (and any other ``timedelta`` keyword)."""
    return T0 + timedelta(seconds=seconds, **interval)


def standard_hub(hub, targets: tuple[str, ...] = ("writer_a",), **target_fields) -> None:
    """Organization mycompany, partners acme and globex, source inbox, noop targets."""
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    hub.instance("inbox", "manual_source")
    for name in targets:
        hub.instance(name, "noop", **target_fields)


class Broker:
    """Stands in for the broker behind the wake-up publisher: records what it is given,
    can lose wake-ups silently (``lose``) or be down and raise (``down``)."""

    def __init__(self) -> None:
        self.published: list[tuple[int, str]] = []
        self.lose = False
        self.down = False

    def __call__(self, items: list[tuple[int, str]]) -> None:
        if self.down:
            raise ConnectionRefusedError("broker is down")
        if not self.lose:
            self.published.extend(items)

    def take(self) -> list[tuple[int, str]]:
        """What was published since the last call."""
        items, self.published = self.published, []
        return items


def deliveries(session: Session, message_id: int) -> list[Delivery]:
    """The message's deliveries as stored now, by target name."""
    session.expire_all()
    return list(session.scalars(select(Delivery).where(Delivery.message_id == message_id)
                                .order_by(Delivery.target)))


def delivery(session: Session, delivery_id: int) -> Delivery:
    session.expire_all()
    return session.get(Delivery, delivery_id)


def message(session: Session, message_id: int) -> Message:
    session.expire_all()
    return session.get(Message, message_id)


def lines(session: Session, message_id: int, type_: str | None = None) -> list[HistoryLine]:
    """The message's history lines in order, optionally of one type."""
    query = select(HistoryLine).where(HistoryLine.message_id == message_id)
    if type_ is not None:
        query = query.where(HistoryLine.type == type_)
    return list(session.scalars(query.order_by(HistoryLine.id)))


def texts(session: Session, message_id: int, type_: str | None = None) -> list[str]:
    return [line.text for line in lines(session, message_id, type_)]


def alerts(session: Session, kind: str, subject: str) -> list[Alert]:
    """Every alert of this kind for the subject, open or resolved, oldest first."""
    session.expire_all()
    return list(session.scalars(select(Alert).where(Alert.kind == kind,
                                                    Alert.subject == subject)
                                .order_by(Alert.id)))


def claim_one(session: Session, target: str, owner: str, now: datetime,
              lease_seconds: int = 300) -> claiming.Claim:
    """Claim exactly one due delivery of ``target`` and commit."""
    claims = claiming.claim(session, target, owner, now, 1, lease_seconds)
    session.commit()
    assert len(claims) == 1, f"expected one claim for {target} at {now}, got {claims}"
    return claims[0]


@contextlib.contextmanager
def counted_statements(target) -> Iterator[Counter[str]]:
    """Count the statements sent through ``target`` (an engine, or the Engine class for
    every engine of the process) while the block runs, by their first word."""
    seen: Counter[str] = Counter()

    def before(conn, cursor, statement, params, context, executemany):
        seen[statement.split()[0].upper()] += 1

    event.listen(target, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(target, "before_cursor_execute", before)


@contextlib.contextmanager
def as_process(monkeypatch, cache: dispatch.RouteCache) -> Iterator[None]:
    """Run the block as another process would: with its own route cache, so only the
    routes version in the database can tell that cache that the routes changed."""
    with monkeypatch.context() as patch:
        patch.setattr(dispatch, "route_cache", cache)
        patch.setattr(svc, "route_cache", cache)
        yield

