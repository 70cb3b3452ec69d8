"""Expected-message rules (docs/expected-messages.md): list, create, delete, and each
rule's last windows."""

from __future__ import annotations

from flask import g
from marshmallow import Schema, fields, validate

from b2bhub.api.blueprint import bp
from b2bhub.api.schemas import UtcDateTime
from b2bhub.config.extensions import db
from b2bhub.domain.expected import DIRECTIONS
from b2bhub.models import utcnow
from b2bhub.services import expected as svc

_NAME = {"description": "1-64 of a-z 0-9 _ -", "pattern": r"^[a-z0-9_-]{1,64}$"}
_MINUTES = {"validate": validate.Range(min=1, max=525600), "allow_none": True}


class AfterIn(Schema):
    direction = fields.String(validate=validate.OneOf(DIRECTIONS))
    document_type = fields.String(validate=validate.Length(min=1, max=35))
    filename = fields.String(validate=validate.Length(min=1, max=255))


class RuleIn(Schema):
    name = fields.String(required=True, validate=validate.Regexp(_NAME["pattern"]),
                         metadata=_NAME)
    description = fields.String(validate=validate.Length(max=255))
    direction = fields.String(load_default="*", validate=validate.OneOf(DIRECTIONS))
    from_party = fields.String(data_key="from", load_default="*", validate=validate.Length(
        min=1, max=64), metadata={"description": "a party's name or *"})
    to_party = fields.String(data_key="to", load_default="*", validate=validate.Length(
        min=1, max=64), metadata={"description": "a party's name or *"})
    source = fields.String(validate=validate.Length(max=64), metadata={
        "description": "only messages of this source instance"})
    target = fields.String(validate=validate.Length(max=64), metadata={
        "description": "only messages delivered to this target instance"})
    filename = fields.String(validate=validate.Length(min=1, max=255), metadata={
        "description": "a glob of the original file name (* ? [...]); default *"})
    document_type = fields.String(validate=validate.Length(min=1, max=35), metadata={
        "description": "850, ORDERS...; default * (any message, EDI or not)"})
    schedule = fields.String(allow_none=True, validate=validate.Length(min=9, max=100),
                             metadata={"description": "cron, five fields: each time ends "
                                                      "a window (0 6 * * 1-5)"})
    timezone = fields.String(validate=validate.Length(min=1, max=64), metadata={
        "description": "the schedule's IANA time zone (Europe/Berlin); default UTC"})
    opens_minutes = fields.Integer(**_MINUTES, metadata={
        "description": "a schedule window opens this long before its end (default: at "
                       "the previous time of the schedule)"})
    after = fields.Nested(AfterIn, allow_none=True, metadata={
        "description": "a relation: each message like this (parties reversed) opens a "
                       "window of within_minutes"})
    within_minutes = fields.Integer(**_MINUTES)
    enabled = fields.Boolean(load_default=True)

    class Meta:
        ordered = True


class After(Schema):
    direction = fields.String()
    document_type = fields.String()
    filename = fields.String()


class Rule(Schema):
    name = fields.String(required=True)
    description = fields.String(required=True)
    direction = fields.String(required=True)
    from_party = fields.String(data_key="from", attribute="from", required=True)
    to_party = fields.String(data_key="to", attribute="to", required=True)
    source = fields.String(required=True)
    target = fields.String(required=True)
    filename = fields.String(required=True)
    document_type = fields.String(required=True)
    schedule = fields.String(required=True, allow_none=True)
    timezone = fields.String(required=True)
    opens_minutes = fields.Integer(required=True, allow_none=True)
    after = fields.Nested(After, required=True, allow_none=True)
    within_minutes = fields.Integer(required=True, allow_none=True)
    enabled = fields.Boolean(required=True)
    created_at = UtcDateTime(required=True)
    created_by = fields.String(required=True)


class RuleList(Schema):
    items = fields.List(fields.Nested(Rule), required=True)


class Window(Schema):
    starts_at = UtcDateTime(required=True)
    ends_at = UtcDateTime(required=True)
    state = fields.String(required=True, metadata={
        "description": "open, met, missed (expected_missing raised) or late"})
    trigger_message_id = fields.Integer(required=True, allow_none=True)
    message_id = fields.Integer(required=True, allow_none=True)
    arrived_at = UtcDateTime(required=True, allow_none=True)


class WindowList(Schema):
    items = fields.List(fields.Nested(Window), required=True)


@bp.get("/expected/rules", summary="List the expected-message rules")
@bp.response(200, RuleList)
def list_expected_rules():
    """Every expected-message rule, by name."""
    return {"items": [svc.rule_shape(r) for r in svc.list_rules(db.session)]}


@bp.post("/expected/rules", summary="Create an expected-message rule", refusals=(409,),
         server_checks=("from", "to", "source", "target", "schedule", "timezone",
                        "after", "within_minutes", "document_type"))
@bp.arguments(RuleIn)
@bp.response(201, Rule)
def create_expected_rule(data: dict):
    """A schedule (cron in a time zone) or a relation (``after`` and
    ``within_minutes``); 422 names each field the hub refuses (an unknown party or
    zone, a bad cron), 409 a taken name. A history line names who made it."""
    data = {"from": data.pop("from_party"), "to": data.pop("to_party"), **data}
    rule = svc.create_rule(db.session, data, g.actor, utcnow())
    db.session.commit()
    return svc.rule_shape(rule)


@bp.get("/expected/rules/<name>", summary="One expected-message rule")
@bp.response(200, Rule)
def get_expected_rule(name: str):
    return svc.rule_shape(svc.get_rule(db.session, name))


@bp.delete("/expected/rules/<name>", summary="Delete an expected-message rule")
@bp.response(204)
def delete_expected_rule(name: str):
    """Remove the rule and its windows; its open ``expected_missing`` alerts resolve."""
    svc.delete_rule(db.session, name, g.actor, utcnow())
    db.session.commit()


@bp.get("/expected/rules/<name>/windows", summary="A rule's last windows")
@bp.response(200, WindowList)
def list_expected_windows(name: str):
    """The rule's 20 latest windows, newest first: open, met, missed or late."""
    rule = svc.get_rule(db.session, name)
    return {"items": svc.last_windows(db.session, [rule.id], per_rule=20)[rule.id]}
