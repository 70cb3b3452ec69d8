"""Wake-ups are published only after the transaction that made them due commits.

Engine functions call :func:`after_commit` with (delivery id, target); a session hook
hands the list to the publisher once the commit succeeded, and drops it on rollback.
The publisher (Celery in the app, anything in tests) is set with :func:`set_publisher`.
A failing publisher never fails the caller: the sweep recovers a lost wake-up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from sqlalchemy import event
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)
Publisher = Callable[[list[tuple[int, str]]], None]
_KEY = "b2bhub_wakeups"
_publisher: Publisher | None = None


def set_publisher(publisher: Publisher | None) -> Publisher | None:
    """Install the publisher; returns the previous one (tests restore it)."""
    global _publisher
    previous, _publisher = _publisher, publisher
    return previous


def after_commit(session: Session, wakeups: Iterable[tuple[int, str]]) -> None:
    session.info.setdefault(_KEY, []).extend(wakeups)


def publish_now(wakeups: list[tuple[int, str]]) -> None:
    if not wakeups or _publisher is None:
        return
    try:
        _publisher(wakeups)
    except Exception:  # a broker that is down never fails an intake
        log.warning("could not publish %d wake-up(s); the sweep will retry",
                    len(wakeups), exc_info=True)


@event.listens_for(Session, "after_commit")
def _publish(session: Session) -> None:
    publish_now(session.info.pop(_KEY, []))


@event.listens_for(Session, "after_rollback")
def _forget(session: Session) -> None:
    session.info.pop(_KEY, None)
