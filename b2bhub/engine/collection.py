"""Collection errors of scheduled sources: one message per failure episode (SPEC 9,
seed 003 ERRO_COLETA).

A scheduled source that could not fetch (``SourceContext.record_collection_error``)
gets a message in status Collection error, with no payload and no deliveries, and the
``message_failed`` alert (:func:`b2bhub.engine.dispatch.store_collection_error`): the
first failed fetch of an episode. A server that stays down does not make a message per
poll: while the episode is open, each further failed fetch is counted on the episode's
message instead. Its status text becomes the latest reason with the count and the time
of the first failure; a ``collection_failed`` history line is added when the reason
changes (a refused connection becomes a 500) and otherwise at most once per
:data:`REPEAT_LINE_EVERY`, so the history of a server down for a month stays readable.

Before an episode is recorded, the source's collection retry policy (the instance's
``retry_policy`` over the plugin type's ``collection_retry_policy``; by default none:
the first failure is recorded) may try the fetch again: while
:meth:`~b2bhub.domain.retry.RetryPolicy.decide` says retry, the failures are only
counted in the episode (``message_id`` None) with the time of the next try
(``retry_at``), which the scheduler takes when it comes before the next scan. When the
policy gives up (attempts used up, or a ``fail`` rule for the error class), the message
and the alert are made, naming the failed fetches so far. A fetch that succeeds while
retrying ends the episode with nothing recorded (the probe shows the outage).

The episode ends at the first fetch that succeeds again (any answer that is no
failure: a new document, a 304, a 204): a ``collection_recovered`` line with the count
goes onto the message, and its alert is resolved (channels that ask hear of it). The
message keeps its status: it records what happened. The next failure opens a new
episode, with a new message and a new alert.

The open episode is a small JSON object the caller keeps (the source's state row, under
its own key): the message id, the count, the first failure's time, the reason and the
time of the last line. Plain SQLAlchemy, in the caller's transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from b2bhub.domain.retry import RECORD_AT_ONCE, RetryPolicy
from b2bhub.domain.states import MessageStatus
from b2bhub.engine.dispatch import STATUS_TEXT_MAX, NewMessage, store_collection_error
from b2bhub.engine.history import add_line, resolve_alert
from b2bhub.models import Message

#: at most one history line per this span while the same reason repeats
REPEAT_LINE_EVERY = timedelta(hours=1)


def failure_text(reason: str, answer_start: str = "") -> str:
    """The reason, with the start of the answer when there was one."""
    return f"{reason}: {answer_start}" if answer_start else reason


def failed(session: Session, episode: dict | None, new: NewMessage, reason: str,
           answer_start: str, now: datetime, policy: RetryPolicy = RECORD_AT_ONCE,
           error_class: str | None = None) -> dict:
    """Record one failed fetch: counted while the policy retries, then a new message
    for the episode, then counted on the episode's message. Returns the episode as it
    stands now (to keep)."""
    text = failure_text(reason, answer_start)
    data = {"reason": reason, "answer_start": answer_start}
    retrying = episode is not None and episode["message_id"] is None
    if episode is None or retrying or not _still_recorded(session, episode["message_id"]):
        failures = episode["failures"] + 1 if retrying else 1
        since = episode["since"] if retrying else now.isoformat()
        decision = policy.decide(error_class, failures, now)
        if decision.retry:
            return {"message_id": None, "failures": failures, "since": since,
                    "reason": reason, "retry_at": decision.at.isoformat()}
        if failures > 1:
            text = (f"{text} ({failures} failed fetches since "
                    f"{_shown(datetime.fromisoformat(since))}; {decision.reason})")
        message_id = store_collection_error(session, new, text, now, data)
        return {"message_id": message_id, "failures": failures, "since": since,
                "reason": reason, "line_at": now.isoformat()}
    message_id, failures = episode["message_id"], episode["failures"] + 1
    since = datetime.fromisoformat(episode["since"])
    status_text = f"{text} ({failures} failed fetches since {_shown(since)})"
    session.execute(update(Message).where(Message.id == message_id).values(
        status_text=status_text[:STATUS_TEXT_MAX], updated_at=now))
    line_at = datetime.fromisoformat(episode["line_at"])
    if reason != episode["reason"] or now - line_at >= REPEAT_LINE_EVERY:
        add_line(session, message_id, "collection_failed",
                 f"failed fetch {failures} since {_shown(since)}: {text}",
                 actor=new.actor, data={**data, "failures": failures}, now=now)
        line_at = now
    return {**episode, "failures": failures, "reason": reason,
            "line_at": line_at.isoformat()}


def retry_at(episode: dict) -> datetime | None:
    """When the policy tries again; None once the episode is recorded."""
    at = episode.get("retry_at") if episode["message_id"] is None else None
    return datetime.fromisoformat(at) if at else None


def succeeded(session: Session, episode: dict, source: str, now: datetime) -> None:
    """End the episode: a line on its message and its alert resolved (nothing when
    the policy was still retrying: nothing was recorded)."""
    message_id, failures = episode["message_id"], episode["failures"]
    if message_id is None:
        return
    since = datetime.fromisoformat(episode["since"])
    fetches = "fetch" if failures == 1 else "fetches"
    add_line(session, message_id, "collection_recovered",
             f"{source} fetched again after {failures} failed {fetches} since "
             f"{_shown(since)}", data={"failures": failures}, now=now)
    resolve_alert(session, "message_failed", f"message:{message_id}", now)


def _still_recorded(session: Session, message_id: int) -> bool:
    """The episode's message is still there as a collection error (not cleaned up)."""
    return session.scalar(select(Message.status).where(
        Message.id == message_id)) == MessageStatus.COLLECTION_ERROR


def _shown(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"
