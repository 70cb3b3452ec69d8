"""Alert notifications: every alert reaches the channels that want its kind, once.

Nobody watches a dashboard at night. A channel is an Apprise URL (email over SMTP,
Slack, Teams, a JSON webhook, ...) with the alert kinds it wants (none named: all) and
whether it also hears of an alert's resolution. Two steps, run by the ``b2bhub.notify``
beat job every few seconds, each one transaction at a time:

``plan``
    Alerts opened at least :data:`GATHER_SECONDS` ago and not yet handed on are marked
    (a conditional UPDATE of ``alerts.notified_at``: of any number of planners at once,
    exactly one marks each alert) and, in the same transaction, a ``notifications`` row
    is made per channel that wants them: one per alert, or one digest per channel when
    more than :data:`DIGEST_OVER` arrive together, so 200 failures at once are one
    mail, not 200. The gathering wait lets alerts raised by one burst (a sweep, a
    batch) meet in one plan. Resolutions go the same way (``resolve_notified_at``), to
    channels with ``on_resolve``.

``send_due``
    Pending notifications whose time has come are leased (a conditional UPDATE, so two
    senders never take the same row), sent with no transaction open, then marked
    ``sent``; a failure keeps the row pending with its error and a later due time
    (:func:`retry_delay`: 30 s doubling to 10 min), so an SMTP server down for a minute
    delays a mail, never loses it. After :data:`MAX_ATTEMPTS` (about 8 hours) the row
    ends ``failed`` and stays visible. A sender killed between a send and its record
    sends that one again when its lease ends: at least once, never lost.

Plain Python and SQLAlchemy; the sending itself is a function handed in
(:func:`apprise_send` by default), so the engine knows no transport.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from b2bhub.config.environment import language
from b2bhub.domain import i18n
from b2bhub.domain.i18n import N_
from b2bhub.domain.status_codes import status_code
from b2bhub.models import Alert, Message, Notification, NotificationChannel

log = logging.getLogger(__name__)

#: seconds an alert waits before it is planned, so that one burst meets in one digest
GATHER_SECONDS = 5.0
#: more alerts than this for one channel in one plan become one digest
DIGEST_OVER = 5
#: attempts before a notification ends failed (30 s doubling, capped at 10 min: ~8 h)
MAX_ATTEMPTS = 50
#: how long a sender holds a notification it is sending
LEASE = timedelta(seconds=120)
#: alert texts listed in a digest; the rest are counted
DIGEST_LISTS = 20
BATCH = 200
#: alerts one plan takes per event at the most; a larger burst gives a digest per plan
MOST = 5000

Send = Callable[[str, str, str], str | None]  # (url, title, body) -> error or None


def retry_delay(attempts: int) -> timedelta:
    """The wait after the ``attempts``-th failed send: 30 s, 60 s, 2 min ... 10 min."""
    return timedelta(seconds=min(600, 30 * 2 ** max(0, attempts - 1)))


def mask_url(url: str) -> str:
    """The URL as shown: its password (an SMTP login, a token in the user part) hidden."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:****@{host}"))


# --- plan --------------------------------------------------------------------------

def plan(session: Session, now: datetime, batch: int = BATCH, most: int = MOST) -> int:
    """Hand on the alerts opened or resolved since the last plan, in one transaction
    per event (so the digest of a burst holds all of it, up to ``most`` alerts); commits.
    Returns how many notification rows it made."""
    made = 0
    channels = session.scalars(select(NotificationChannel)
                               .where(NotificationChannel.enabled.is_(True))).all()
    gathered = now - timedelta(seconds=GATHER_SECONDS)
    for event, column, since in (("opened", Alert.notified_at, Alert.created_at),
                                 ("resolved", Alert.resolve_notified_at, Alert.resolved_at)):
        alerts: list = []
        while len(alerts) < most:
            marked = _mark(session, column, since, gathered, now, batch)
            alerts += marked
            if len(marked) < batch:
                break
        statuses = message_statuses(session, alerts) if channels else {}
        for channel in channels:
            if event == "resolved" and not channel.on_resolve:
                continue
            wanted = [a for a in alerts if not channel.kinds or a.kind in channel.kinds]
            made += _notify(session, channel, event, wanted, now, statuses)
        session.commit()
    return made


def _mark(session: Session, column, since, gathered: datetime, now: datetime,
          batch: int) -> list:
    """Mark up to ``batch`` alerts of this event as handed on; the ones this call marked
    (another planner's rows are re-checked by the UPDATE and left out)."""
    due = select(Alert.id).where(column.is_(None), since.is_not(None),
                                 since <= gathered).order_by(Alert.id).limit(batch)
    return session.execute(
        update(Alert).where(Alert.id.in_(due.scalar_subquery()), column.is_(None))
        .values({column.key: now})
        .returning(Alert.id, Alert.kind, Alert.subject, Alert.text, Alert.message_id)
        .execution_options(synchronize_session=False)).all()


def message_statuses(session: Session, alerts: list) -> dict[int, str]:
    """The current status of each message the alerts are about, in one read (the
    notifications' texts and the API's alerts both show it)."""
    ids = {a.message_id for a in alerts if a.message_id is not None}
    return dict(session.execute(select(Message.id, Message.status).where(
        Message.id.in_(ids))).all()) if ids else {}


def _notify(session: Session, channel: NotificationChannel, event: str, alerts: list,
            now: datetime, statuses: dict[int, str]) -> int:
    if not alerts:
        return 0
    if len(alerts) > DIGEST_OVER:
        rows = [_digest(channel, event, alerts, now)]
    else:
        _ = i18n.translations(i18n.hub_language(language())).gettext
        rows = [{"channel_id": channel.id, "event": event, "alert_ids": [a.id],
                 "title": ("b2bhub: " + _(TITLES[event]) % {"kind": a.kind, "text": a.text}
                           )[:200],
                 "body": _body(a, event, statuses.get(a.message_id)), "due_at": now}
                for a in alerts]
    session.execute(Notification.__table__.insert(), rows)
    return len(rows)


#: what a notification says, in the hub's language (B2BHUB_LANGUAGE, docs/i18n.md); an
#: alert's kind is its identifier and its text is as the engine stored it
TITLES = {"opened": N_("%(kind)s opened: %(text)s"),
          "resolved": N_("%(kind)s resolved: %(text)s")}
BODIES = {"opened": N_("Alert %(kind)s opened: %(text)s"),
          "resolved": N_("Alert %(kind)s resolved: %(text)s")}
DIGEST_TITLES = {"opened": (N_("%(num)s alert opened"), N_("%(num)s alerts opened")),
                 "resolved": (N_("%(num)s alert resolved"), N_("%(num)s alerts resolved"))}


def _body(alert, event: str, status: str | None) -> str:
    """A notification's text in the hub's language; an alert about a message names the
    message's status now, ours and seed 003's identifier (never translated:
    ``b2bhub.domain.status_codes``)."""
    _ = i18n.translations(i18n.hub_language(language())).gettext
    lines = [_(BODIES[event]) % {"kind": alert.kind, "text": alert.text},
             _("Subject: %(subject)s") % {"subject": alert.subject}]
    if alert.message_id is not None:
        lines.append(_("Message: %(url)s") % {"url": f"/ui/messages/{alert.message_id}"})
        if status is not None:
            lines.append(_("Status: %(status)s (%(code)s)") % {"status": status,
                                                                 "code": status_code(status)})
    lines.append(_("Open alerts: %(url)s") % {"url": "/ui/alerts"})
    return "\n".join(lines)


def _digest(channel: NotificationChannel, event: str, alerts: list, now: datetime) -> dict:
    t = i18n.translations(i18n.hub_language(language()))
    kinds = Counter(a.kind for a in alerts)
    listed = "\n".join(f"- {a.kind}: {a.text}" for a in alerts[:DIGEST_LISTS])
    more = len(alerts) - DIGEST_LISTS
    headline = t.ngettext(*DIGEST_TITLES[event], len(alerts)) % {"num": len(alerts)}
    body = (f"{headline}: "
            + ", ".join(f"{count} {kind}" for kind, count in kinds.most_common())
            + f"\n\n{listed}"
            + ("\n" + t.gettext("... and %(num)s more") % {"num": more} if more > 0 else "")
            + "\n\n" + t.gettext("Open alerts: %(url)s") % {"url": "/ui/alerts"})
    return {"channel_id": channel.id, "event": "digest", "alert_ids": [a.id for a in alerts],
            "title": f"b2bhub: {headline}", "body": body, "due_at": now}


# --- send --------------------------------------------------------------------------

def send_due(session: Session, now: datetime, send: Send | None = None,
             batch: int = 50) -> tuple[int, int]:
    """Send the pending notifications that are due; (sent, failed attempts)."""
    send = send or apprise_send
    n = Notification.__table__
    due = (select(n.c.id).where(n.c.state == "pending", n.c.due_at <= now,
                                (n.c.lease_until.is_(None)) | (n.c.lease_until < now))
           .order_by(n.c.due_at, n.c.id).limit(batch))
    taken = session.execute(
        update(n).where(n.c.id.in_(due.scalar_subquery()), n.c.state == "pending",
                        (n.c.lease_until.is_(None)) | (n.c.lease_until < now))
        .values(lease_until=now + LEASE, attempts=n.c.attempts + 1)
        .returning(n.c.id, n.c.channel_id, n.c.title, n.c.body, n.c.attempts)).all()
    urls = dict(session.execute(select(NotificationChannel.id, NotificationChannel.url)
                                .where(NotificationChannel.id.in_(
                                    {t.channel_id for t in taken}))).all()) if taken else {}
    session.commit()
    sent = failed = 0
    for row in taken:
        error = _try(send, urls.get(row.channel_id), row.title, row.body)
        if error is None:
            values = {"state": "sent", "sent_at": now, "lease_until": None, "last_error": ""}
            sent += 1
        else:
            failed += 1
            final = row.attempts >= MAX_ATTEMPTS
            values = {"state": "failed" if final else "pending", "lease_until": None,
                      "last_error": error[:500],
                      "due_at": now + retry_delay(row.attempts)}
            log.warning("notification %s not sent (attempt %s%s): %s", row.id, row.attempts,
                        ", giving up" if final else "", error)
        session.execute(update(n).where(n.c.id == row.id).values(values))
        session.commit()
    if sent:
        log.info("sent %s notification(s)", sent)
    return sent, failed


def _try(send: Send, url: str | None, title: str, body: str) -> str | None:
    if url is None:
        return "the channel is gone"
    try:
        return send(url, title, body)
    except Exception as exc:  # a transport's bug is a failed send, not a dead sender
        return f"{type(exc).__name__}: {exc}"


def apprise_send(url: str, title: str, body: str) -> str | None:
    """Send through Apprise; None on success, else what went wrong (Apprise's own log
    lines, which name the reason: refused connection, authentication, HTTP status)."""
    import apprise
    sender = apprise.Apprise()
    if not sender.add(url):
        return f"not a URL Apprise can send to: {mask_url(url)}"
    with apprise.LogCapture(level=logging.WARNING) as captured:
        ok = sender.notify(title=title, body=body)
        said = captured.getvalue().strip()
    if ok:
        return None
    return said.splitlines()[-1] if said else "Apprise could not send it"


def send_test(session: Session, channel: NotificationChannel, now: datetime, actor: str,
              send: Send | None = None) -> str | None:
    """Send a test notification at once, recorded like any other; None when it went."""
    _ = i18n.translations(i18n.hub_language(language())).gettext
    title = "b2bhub: " + _("test notification")
    body = _("A test notification asked for by %(user)s for channel %(channel)s.") % {
        "user": actor, "channel": channel.name}
    error = _try(send or apprise_send, channel.url, title, body)
    session.add(Notification(channel_id=channel.id, event="test", title=title, body=body,
                             state="sent" if error is None else "failed", attempts=1,
                             due_at=now, sent_at=now if error is None else None,
                             last_error=error or "", created_at=now))
    return error
