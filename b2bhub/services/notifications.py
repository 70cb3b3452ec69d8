"""Notification channels (SPEC 14): create, list, delete, send a test; every change a
``config_changed`` line naming who made it. The sending is
:mod:`b2bhub.engine.notifications`."""

from __future__ import annotations

import re
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.domain.i18n import N_
from b2bhub.engine import notifications as engine
from b2bhub.engine.history import add_line
from b2bhub.models import Notification, NotificationChannel
from b2bhub.services.errors import Conflict, NotFound, ServiceError

#: the alert kinds a channel may ask for (SPEC 14)
ALERT_KINDS = ("message_not_routed", "message_failed", "delivery_stalled", "plugin_failed",
               "target_offline", "certificate_expiring", "duplicate_received",
               "ack_overdue", "cem_unanswered", "expected_missing")
NAME = re.compile(r"^[a-z0-9_-]{1,64}$")


def channel_shape(channel: NotificationChannel) -> dict:
    """A channel as the API and the UI show it: the URL's password masked."""
    return {"name": channel.name, "url": engine.mask_url(channel.url),
            "kinds": list(channel.kinds or []), "on_resolve": channel.on_resolve,
            "enabled": channel.enabled, "created_at": channel.created_at,
            "created_by": channel.created_by}


def list_channels(session: Session) -> list[NotificationChannel]:
    return list(session.scalars(select(NotificationChannel).order_by(NotificationChannel.name)))


def create_channel(session: Session, data: dict, actor: str, now: datetime
                   ) -> NotificationChannel:
    """Check every field, then add the channel; a ServiceError names each bad field."""
    problems = {}
    name = (data.get("name") or "").strip()
    if not NAME.fullmatch(name):
        problems["name"] = N_("1-64 of a-z 0-9 _ -")
    elif session.scalar(select(NotificationChannel.id).where(NotificationChannel.name == name)):
        raise Conflict(N_("a channel named '%(name)s' exists", name=name), {"name": "taken"})
    url = (data.get("url") or "").strip()
    if not url:
        problems["url"] = N_("an Apprise URL, e.g. mailto://user:pass@smtp.example.com")
    elif not _apprise_takes(url):
        problems["url"] = N_("not a URL Apprise can send to (see the Apprise URL list)")
    kinds = data.get("kinds") or []
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        problems["kinds"] = N_("a list of alert kinds")
    else:
        unknown = sorted(set(kinds) - set(ALERT_KINDS))
        if unknown:
            problems["kinds"] = N_("unknown alert kind(s) %(wrong)s; known: %(known)s",
                                   wrong=", ".join(unknown), known=", ".join(ALERT_KINDS))
    if problems:
        raise ServiceError(N_("the channel was not saved"), problems)
    channel = NotificationChannel(name=name, url=url, kinds=sorted(set(kinds)),
                                  on_resolve=bool(data.get("on_resolve")),
                                  enabled=data.get("enabled", True) is not False,
                                  created_at=now, created_by=actor)
    session.add(channel)
    session.flush()
    add_line(session, None, "config_changed",
             f"{actor}: created notification channel {name} ({engine.mask_url(url)}; "
             f"{', '.join(channel.kinds) or 'every alert kind'})", actor=actor, now=now)
    return channel


def get_channel(session: Session, name: str) -> NotificationChannel:
    channel = session.scalar(select(NotificationChannel).where(NotificationChannel.name == name))
    if channel is None:
        raise NotFound(N_("no notification channel named '%(name)s'", name=name))
    return channel


def delete_channel(session: Session, name: str, actor: str, now: datetime) -> None:
    channel = get_channel(session, name)
    session.delete(channel)
    add_line(session, None, "config_changed", f"{actor}: deleted notification channel {name}",
             actor=actor, now=now)


def test_channel(session: Session, name: str, actor: str, now: datetime,
                 send: engine.Send | None = None) -> str | None:
    """Send a test notification now; None when it went, else the reason."""
    channel = get_channel(session, name)
    error = engine.send_test(session, channel, now, actor, send)
    add_line(session, None, "config_changed",
             f"{actor}: sent a test notification to channel {name}: "
             + ("sent" if error is None else f"failed: {error}"), actor=actor, now=now)
    return error


def recent(session: Session, limit: int = 50) -> list[tuple[Notification, str]]:
    """The latest notifications with their channel's name, newest first."""
    return list(session.execute(
        select(Notification, NotificationChannel.name)
        .join(NotificationChannel, NotificationChannel.id == Notification.channel_id)
        .order_by(Notification.id.desc()).limit(limit)).all())


def _apprise_takes(url: str) -> bool:
    import apprise
    return apprise.Apprise().add(url)
