"""Wake-ups are published only after the transaction that made them due commits.

Engine functions call :func:`after_commit` with (delivery id, target); a session hook
hands the list to the publisher once the commit succeeded, and drops it on rollback.
The publisher (Celery in the app, anything in tests) is set with :func:`set_publisher`.
A failing publisher never fails the caller: the sweep recovers a lost wake-up.

How many deliveries a woken worker claims at once depends on the target's plugin type
(its ``claim_batch``); the process tells the engine with :func:`set_claim_batch`, so
that a target is woken once per batch it can run at once, not once per delivery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from sqlalchemy import event
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)
Publisher = Callable[[list[tuple[int, str]]], None]
_KEY = "b2bhub_wakeups"
_DEFERRED = "b2bhub_wakeups_deferred"
_publisher: Publisher | None = None
_claim_batch: Callable[[str], int] | None = None


def set_publisher(publisher: Publisher | None) -> Publisher | None:
    """Install the publisher; returns the previous one (tests restore it)."""
    global _publisher
    previous, _publisher = _publisher, publisher
    return previous


def set_claim_batch(lookup: Callable[[str], int] | None) -> None:
    """Install how many due deliveries a worker claims at once for a plugin type."""
    global _claim_batch
    _claim_batch = lookup


def claim_batch(type_name: str) -> int:
    """The claim batch of a plugin type: 1 unless the process said otherwise."""
    return max(1, _claim_batch(type_name)) if _claim_batch is not None else 1


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


def defer(session: Session) -> list[tuple[int, str]]:
    """From now on, the wake-ups of ``session``'s commits go to the list returned instead
    of the publisher (still only once committed, never on rollback): a request handler
    publishes them with :func:`publish_now` once its response is sent, so the client
    does not wait for the broker. :func:`stop_deferring` ends it."""
    return session.info.setdefault(_DEFERRED, [])


def stop_deferring(session: Session) -> list[tuple[int, str]]:
    """End :func:`defer`; the wake-ups committed meanwhile, to publish."""
    return session.info.pop(_DEFERRED, [])


def forget(session: Session, delivery_ids: Iterable[int]) -> None:
    """Drop the wake-ups of these deliveries that ``session`` has committed or will
    commit but not yet handed out (a request deferring them): the caller took care of
    the deliveries itself (the HTTP receiver's sync mode attempted them in the request,
    and what it left Retrying has its own wake-up time for the sweep)."""
    drop = set(delivery_ids)
    for key in (_KEY, _DEFERRED):
        if key in session.info:
            session.info[key][:] = [w for w in session.info[key] if w[0] not in drop]


@event.listens_for(Session, "after_commit")
def _publish(session: Session) -> None:
    committed = session.info.pop(_KEY, [])
    deferred = session.info.get(_DEFERRED)
    if deferred is not None:
        deferred.extend(committed)
    else:
        publish_now(committed)


@event.listens_for(Session, "after_rollback")
def _forget(session: Session) -> None:
    session.info.pop(_KEY, None)
