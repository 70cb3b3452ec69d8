"""Alert notification channels (SPEC 14): list, create, delete, send a test; the
notifications sent and pending."""

from __future__ import annotations

from flask import g
from marshmallow import Schema, fields, validate

from b2bhub.api.auth import requires
from b2bhub.api.blueprint import bp
from b2bhub.api.schemas import UtcDateTime
from b2bhub.config.extensions import db
from b2bhub.models import utcnow
from b2bhub.services import notifications as svc


class ChannelIn(Schema):
    name = fields.String(required=True, metadata={"description": "1-64 of a-z 0-9 _ -",
                                                  "pattern": svc.NAME.pattern})
    url = fields.String(required=True, validate=validate.Length(min=1), metadata={
        "description": "an Apprise URL: mailto://, json://, slack://, msteams://, ..."})
    kinds = fields.List(fields.String(validate=validate.OneOf(svc.ALERT_KINDS)),
                        load_default=list, metadata={
                            "description": "alert kinds sent here; empty: every kind"})
    on_resolve = fields.Boolean(load_default=False, metadata={
        "description": "also notify when an alert resolves"})
    enabled = fields.Boolean(load_default=True)


class Channel(Schema):
    name = fields.String(required=True)
    url = fields.String(required=True, metadata={"description": "its password masked"})
    kinds = fields.List(fields.String(), required=True)
    on_resolve = fields.Boolean(required=True)
    enabled = fields.Boolean(required=True)
    created_at = UtcDateTime(required=True)
    created_by = fields.String(required=True)


class ChannelList(Schema):
    items = fields.List(fields.Nested(Channel), required=True)


class TestResult(Schema):
    sent = fields.Boolean(required=True)
    error = fields.String(required=True, allow_none=True)


class NotificationOut(Schema):
    id = fields.Integer(required=True)
    channel = fields.String(required=True)
    event = fields.String(required=True, metadata={
        "description": "opened, resolved, digest or test"})
    alert_ids = fields.List(fields.Integer(), required=True)
    title = fields.String(required=True)
    state = fields.String(required=True, metadata={"description": "pending, sent or failed"})
    attempts = fields.Integer(required=True)
    due_at = UtcDateTime(required=True)
    sent_at = UtcDateTime(required=True, allow_none=True)
    last_error = fields.String(required=True)


class NotificationList(Schema):
    items = fields.List(fields.Nested(NotificationOut), required=True)


@bp.get("/notifications/channels")
@bp.response(200, ChannelList)
def list_channels():
    """The notification channels, their URLs' passwords masked."""
    return {"items": [svc.channel_shape(c) for c in svc.list_channels(db.session)]}


@bp.post("/notifications/channels", refusals=(409,), server_checks=("url",))
@requires("admin")
@bp.arguments(ChannelIn)
@bp.response(201, Channel)
def create_channel(data: dict):
    """Add a channel; 400 names every bad field, 409 a taken name."""
    channel = svc.create_channel(db.session, data, g.actor, utcnow())
    db.session.commit()
    return svc.channel_shape(channel)


@bp.delete("/notifications/channels/<name>")
@requires("admin")
@bp.response(204)
def delete_channel(name: str):
    """Remove a channel and its notifications."""
    svc.delete_channel(db.session, name, g.actor, utcnow())
    db.session.commit()


@bp.post("/notifications/channels/<name>/test", summary="Send a test notification")
@requires("admin")
@bp.response(200, TestResult)
def test_channel(name: str):
    """Send a test notification now; ``sent`` false with the reason when it failed."""
    error = svc.test_channel(db.session, name, g.actor, utcnow())
    db.session.commit()
    return {"sent": error is None, "error": error}


@bp.get("/notifications", summary="List the latest notifications")
@bp.response(200, NotificationList)
def list_notifications():
    """The latest 50 notifications, newest first."""
    return {"items": [{**{k: getattr(n, k) for k in (
        "id", "event", "alert_ids", "title", "state", "attempts", "due_at", "sent_at",
        "last_error")}, "channel": name} for n, name in svc.recent(db.session)]}

