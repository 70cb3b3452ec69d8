"""The marshmallow schemas of the API: what each call takes and answers.

The same schemas validate requests, serialize responses and make the OpenAPI document
(``/api/v1/openapi.json``), so the document cannot drift from the code.

Times are ISO 8601 UTC with a ``Z``. Field names are snake_case, except that routes and
message filters say ``from`` and ``to`` as the SPEC does. Lists are pages: ``items`` and
``next_cursor`` (null on the last page); ``limit`` (1-500, default 50) and ``cursor`` in
the query ask for one.
"""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from b2bhub.domain import business_rules, retry, routing
from b2bhub.domain.states import DeliveryState, FailureKind, MessageStatus
from b2bhub.domain.status_codes import CODES, status_code
from b2bhub.observability import tracing
from b2bhub.plugin import STEP_STATES
from b2bhub.services import config as config_rules
from b2bhub.services import users
from b2bhub.services.config import SECRET_MASK
from b2bhub.services.messages import ACKNOWLEDGMENTS
from b2bhub.services.tokens import ROLES

MAX_ID = 2**63 - 1  # what a BIGINT holds
MAX_SMALL_ID = 2**31 - 1  # routes, tokens and users have INTEGER ids
#: the URL rule part of an id of those tables
SMALL_ID = f"int(max={MAX_SMALL_ID})"
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
STATUSES = [s.value for s in MessageStatus]
#: what a status filter takes: ours, or seed 003's identifiers (docs/status-codes.md)
STATUS_FILTERS = STATUSES + list(CODES)
STATES = [s.value for s in DeliveryState]


# --- fields -------------------------------------------------------------------------

class UtcDateTime(fields.DateTime):
    """A naive UTC time of a row, written as ISO 8601 with a ``Z``; read from a query
    string with or without an offset (one with an offset becomes naive UTC)."""

    def _serialize(self, value, attr, obj, **kwargs):
        if value is None or isinstance(value, str):  # None, or written already
            return value
        return value.isoformat() + "Z"

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, str):
            raise ValidationError("must be an ISO 8601 time, e.g. 2024-05-01T12:00:00Z")
        if "T" in value:  # an unescaped "+" of an offset arrives as a space
            value = value.replace(" ", "+")
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValidationError(
                "must be an ISO 8601 time, e.g. 2024-05-01T12:00:00Z") from None
        if moment.tzinfo is not None:
            moment = moment.astimezone(UTC).replace(tzinfo=None)
        return moment


class CommaList(fields.String):
    """Several values in one query argument, comma-separated (``status=error,stalled``),
    each one of ``choices``."""

    def __init__(self, choices: list[str], **kwargs):
        kwargs.setdefault("metadata", {})
        kwargs["metadata"].setdefault(
            "description", "one or more of: " + ", ".join(choices) + " (comma-separated)")
        # empty: no filter, as a form's empty field sends it
        kwargs["metadata"]["pattern"] = "^((" + "|".join(choices) + ")(,(" + \
            "|".join(choices) + "))*)?$"
        super().__init__(**kwargs)
        self.choices = choices

    def _deserialize(self, value, attr, data, **kwargs):
        text = super()._deserialize(value, attr, data, **kwargs)
        given = text.split(",") if text else []
        wrong = [v for v in given if v not in self.choices]
        if wrong:
            raise ValidationError(f"unknown value(s) {', '.join(wrong)} "
                                  f"(known: {', '.join(self.choices)})")
        return given or None


#: a list by id: the cursor is the last id of the page (digits, fewer than a BIGINT's or an
#: INTEGER's, so every cursor of the pattern is a position in the list)
ID_CURSOR = "^[0-9]{1,18}$"
SMALL_ID_CURSOR = "^[0-9]{1,9}$"
#: a list by name: the last name, base64url without padding (any such text is a position)
NAME_CURSOR = "^([A-Za-z0-9_-]{4})*([A-Za-z0-9_-]{2,3})?$"


class Cursor(fields.String):
    """The position a list handed out as ``next_cursor``; ``kind`` is the type of the key
    it stands for (int or str). Every text of the documented pattern is a position, and
    anything else is refused: a client can tell a good cursor from a bad one."""

    def __init__(self, kind: type, max_key: int = MAX_ID, **kwargs):
        self.pattern = NAME_CURSOR if kind is str else \
            SMALL_ID_CURSOR if max_key <= MAX_SMALL_ID else ID_CURSOR
        super().__init__(metadata={"description": "next_cursor of the previous page",
                                   "pattern": self.pattern,
                                   **({"minLength": 2} if kind is str else {})}, **kwargs)
        self.kind = kind

    def _deserialize(self, value, attr, data, **kwargs):
        value = super()._deserialize(value, attr, data, **kwargs)
        if not re.fullmatch(self.pattern, value) or (self.kind is str and len(value) < 2):
            raise ValidationError("cursor is not one this list handed out")
        if self.kind is int:
            return int(value)
        # any bytes are a position among names; no name holds a NUL (PostgreSQL takes none)
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode(
            "utf-8", "replace").replace("\x00", "")


def encode_cursor(key: Any) -> str | None:
    """The cursor for a page that starts after ``key``; None when no more pages."""
    if key is None:
        return None
    if isinstance(key, int):
        return str(key)
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


class StrictBoolean(fields.Boolean):
    """true or false, not "yes" or 1."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, bool):
            raise ValidationError("must be true or false")
        return value


def _int(**kwargs) -> fields.Integer:
    return fields.Integer(strict=True, **kwargs)


def _id(**kwargs) -> fields.Integer:
    """A row id, as a query argument (strict=False) or in a JSON body."""
    return fields.Integer(validate=validate.Range(1, MAX_ID), **kwargs)


#: the name rule of parties and plugin instances (``b2bhub.domain.routing``)
NAME_PATTERN = f"^{routing.NAME_RE.pattern}$"
#: a route's ``from`` or ``to``: a party's name, or ``*`` for any
PARTY_OR_ANY = f"^(\\*|{routing.NAME_RE.pattern})$"
#: a route's ``document_type``: an envelope's document type, or ``*`` for any message
DOCUMENT_TYPE_OR_ANY = f"^(\\*|{routing.DOCUMENT_TYPE_RE.pattern})$"


def _name(**kwargs) -> fields.String:
    """A party's or instance's name: the pattern the document declares is the one
    refused (400) before any service reads it."""
    metadata = {"pattern": NAME_PATTERN, **kwargs.pop("metadata", {})}
    return fields.String(validate=[validate.Length(min=1, max=64), validate.Regexp(
        NAME_PATTERN, error=f"must be {routing.NAME_RULE}")], metadata=metadata, **kwargs)


# --- common -------------------------------------------------------------------------

class ErrorBody(Schema):
    code = fields.String(required=True, metadata={"description": "machine-readable reason"})
    message = fields.String(required=True, metadata={"description": "what went wrong"})
    details = fields.Dict(required=True, metadata={
        "description": "per field, what is wrong with it (may be empty)"})


class ErrorSchema(Schema):
    """Every refusal: ``{"error": {"code", "message", "details"}}``."""

    error = fields.Nested(ErrorBody, required=True)


class PageArgs(Schema):
    """A query argument no list knows is refused: a misspelt filter must not quietly
    return everything."""

    class Meta:
        unknown = RAISE

    limit = fields.Integer(load_default=DEFAULT_LIMIT,
                           validate=validate.Range(1, MAX_LIMIT, error=(
                               f"limit must be a whole number from 1 to {MAX_LIMIT}")))


class IdPageArgs(PageArgs):
    cursor = Cursor(int)


class SmallIdPageArgs(PageArgs):
    cursor = Cursor(int, MAX_SMALL_ID)


class NamePageArgs(PageArgs):
    cursor = Cursor(str)


def page_of(item: type[Schema], name: str) -> type[Schema]:
    """The schema of a page of ``item``s."""
    return Schema.from_dict({
        "items": fields.List(fields.Nested(item), required=True),
        "next_cursor": fields.String(required=True, allow_none=True, metadata={
            "description": "pass as cursor for the next page; null on the last page"}),
    }, name=name)


def page_json(page) -> dict[str, Any]:
    """A :class:`b2bhub.models.pages.Page` as the page schemas take it."""
    return {"items": page.items, "next_cursor": encode_cursor(page.next_key)}


class ActionResult(Schema):
    changed = fields.Boolean(required=True)
    message = fields.String(required=True)
    deliveries = fields.List(fields.Integer(), required=True,
                             metadata={"description": "ids of the deliveries it moved"})


# --- parties ------------------------------------------------------------------------

class ConnectionTestArgs(Schema):
    """A partner profile's connection test: who sends, how long to wait."""

    organization = fields.String(load_default=None, allow_none=True, metadata={
        "description": "the organization that sends the test message; default: the only "
                       "organization with a profile of the kind"})
    wait = fields.Integer(load_default=20, validate=validate.Range(min=0, max=120), metadata={
        "description": "seconds to wait for a receipt that comes later (an asynchronous "
                       "MDN); 0: do not wait, report it as pending"})


class TestStep(Schema):
    name = fields.String(required=True, metadata={"description": "e.g. dns, tcp, tls, http, "
                                                   "mdn, mdn_signature, mic"})
    label = fields.String(required=True)
    state = fields.String(required=True, validate=validate.OneOf(list(STEP_STATES)),
                          metadata={"description": "ok, failed, skipped (does not apply), "
                                    "pending (waits on the partner), not_run (an earlier "
                                    "step failed)"})
    text = fields.String(required=True)


class ConnectionTest(Schema):
    ok = fields.Boolean(required=True, metadata={"description": "no step failed or pending"})
    summary = fields.String(required=True)
    message_id = fields.Integer(allow_none=True, required=True,
                                metadata={"description": "the test message (its history)"})
    steps = fields.List(fields.Nested(TestStep), required=True)


def _identities(note: str = "", **kwargs) -> fields.List:
    return fields.List(fields.String(validate=validate.Length(min=3, max=40)),
                       validate=validate.Length(max=100), metadata={
                           "description": "the party's EDI identities, qualifier:id as an "
                           "envelope names it (ZZ:ACME); each one party's at most "
                           f"(409 identity_taken){note}"}, **kwargs)


def _functional_acks(note: str = "", **kwargs) -> fields.String:
    return fields.String(validate=validate.OneOf(["none", "997", "999"]), metadata={
        "description": "the functional acknowledgment the partner gets for each "
        "interchange it sends: none, 997 or 999 (X12); any but none: a CONTRL for "
        f"EDIFACT{note}"}, **kwargs)


def _ack_hours(note: str = "", **kwargs) -> fields.Integer:
    return fields.Integer(allow_none=True, validate=validate.Range(1, 720), metadata={
        "description": "hours within which the partner acknowledges an interchange we "
        f"send it (else ack_overdue); null: no acknowledgment expected{note}"}, **kwargs)


class Party(Schema):
    name = fields.String(required=True)
    display_name = fields.String(required=True)
    kind = fields.String(required=True, validate=validate.OneOf(["organization", "partner"]))
    edi_identities = fields.List(fields.String(), required=True)
    functional_acks = fields.String(required=True)
    ack_hours = fields.Integer(required=True, allow_none=True)
    created_at = UtcDateTime(required=True)


class PartyCreate(Schema):
    name = _name(required=True)
    display_name = fields.String(load_default="", validate=validate.Length(max=200))
    edi_identities = _identities(load_default=list)
    functional_acks = _functional_acks(load_default="none")
    ack_hours = _ack_hours(load_default=None)


class PartyUpdate(Schema):
    name = _name(metadata={"description": "may be sent, but must be the current name"})
    display_name = fields.String(required=True, validate=validate.Length(max=200))
    edi_identities = _identities("; left out: unchanged")
    functional_acks = _functional_acks("; left out: unchanged")
    ack_hours = _ack_hours("; left out: unchanged")


PartyPage = page_of(Party, "PartyPage")


# --- plugins ------------------------------------------------------------------------

class PluginType(Schema):
    name = fields.String(required=True)
    roles = fields.List(fields.String(validate=validate.OneOf(["source", "target"])),
                        required=True)
    description = fields.String(required=True)
    schema = fields.Dict(required=True, metadata={
        "description": "JSON Schema of the type's configuration"})


PluginTypePage = page_of(PluginType, "PluginTypePage")


#: a target's retry policy as the API takes and gives it (b2bhub.domain.retry); keys left
#: out come from the type's default. One rule JSON Schema cannot say is left to the
#: hub (``x-server-checks``): the ``schedule`` strategy needs a non-empty ``schedule``.
RETRY_POLICY = {
    "type": "object", "nullable": True, "additionalProperties": False,
    "description": "how failed attempts are retried; keys left out come from the type's "
                   "default; null: the default",
    "properties": {
        "strategy": {"type": "string", "enum": [str(x) for x in retry.Strategy]},
        "base_delay": {"type": "number", "minimum": 0, "description": "seconds"},
        "max_delay": {"type": "number", "minimum": 0, "nullable": True,
                      "description": "seconds; null: no cap"},
        "max_attempts": {"type": "integer", "minimum": 1},
        "jitter": {"type": "number", "minimum": 0, "maximum": 1,
                   "description": "a fraction of the delay, at random"},
        "schedule": {"type": "array", "items": {"type": "number", "minimum": 0},
                     "description": "the delay before each retry (strategy schedule)"},
        "rules": {"type": "array", "description": "retry or fail an error class", "items": {
            "type": "object", "additionalProperties": False, "required": ["match", "action"],
            "properties": {"match": {"type": "string", "minLength": 1,
                                     "description": "connection, http_5xx, http_404, ..."},
                           "action": {"type": "string", "enum": list(retry.ACTIONS)}}}},
    },
}

#: one business-error rule (b2bhub.domain.business_rules); what the hub alone can judge
#: (the regular expression and JSONPath compile, at least one condition, a json_value
#: only with a json_path, unique names) is left to it (``x-server-checks``)
BUSINESS_RULE = {
    "type": "object", "additionalProperties": False, "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 100},
        "status": {"nullable": True, "description": "an HTTP status (100-599) or a class "
                                                    "such as '4xx'; null or '': any",
                   # null in a branch too: OpenAPI 3.0.3's nullable adds null only to
                   # a schema's own type, which this one has none of
                   "oneOf": [{"type": "integer", "minimum": 100, "maximum": 599},
                             {"type": "string", "nullable": True}]},
        "body_regex": {"type": "string", "nullable": True,
                       "description": "searched in the decoded body"},
        "json_path": {"type": "string", "nullable": True,
                      "description": "RFC 9535 JSONPath over the JSON body"},
        "json_value": {"description": "the value expected at json_path; without it the "
                                      "path matching anything is enough"},
        "block": {"type": "string", "nullable": True,
                  "enum": [*business_rules.BLOCKS, "", None],
                  "description": "none (default), sequence or instance"},
    },
}


class InstanceFields(Schema):
    """What a plugin instance takes; the type's own schema checks ``config`` (the served
    document types it per type: :func:`b2bhub.api.plugins.document_plugin_configs`)."""

    name = _name()
    type = fields.String()
    enabled = StrictBoolean()
    config = fields.Dict(metadata={
        "description": f"the type's settings; a secret shown as {SECRET_MASK} and sent "
                       "back unchanged keeps its stored value"})
    max_concurrent_deliveries = _int(validate=validate.Range(
        min=1, max=config_rules.MAX_CONCURRENT_DELIVERIES))
    retry_policy = fields.Dict(allow_none=True, metadata=RETRY_POLICY)
    ordered = StrictBoolean()
    queue = fields.String(allow_none=True)
    probe_interval = _int(validate=validate.Range(
        min=0, max=config_rules.MAX_PROBE_INTERVAL), metadata={
        "description": "0 (default): the System > Settings probe_interval; else at least 5"})
    retention_days = _int(allow_none=True, validate=validate.Range(
        min=-1, max=config_rules.MAX_RETENTION_DAYS), metadata={
        "description": "days a source's messages are kept once final; null or 0: the "
                       "retention_days setting; -1: kept forever"})
    parties_from = fields.String(validate=validate.OneOf(["source", "envelope"]), metadata={
        "description": "a source's from and to: source (default: as its path or "
                       "configuration says) or envelope (the parties whose EDI identities "
                       "the envelope's sender and receiver are; unknown: Not routed)"})
    edi_errors = fields.String(validate=validate.OneOf(["accept", "refuse"]), metadata={
        "description": "a source's interchange with envelope errors (control numbers, "
                       "counts, trailers): accept (default: delivered, a history line "
                       "lists the errors) or refuse (stored Refused, the errors the "
                       "reason)"})
    duplicates = fields.String(validate=validate.OneOf(["alert", "refuse"]), metadata={
        "description": "a source's interchange whose envelope sender and interchange "
                       "control number came within duplicate_days: alert (default: "
                       "delivered, a duplicate_received line and alert) or refuse (stored "
                       "Refused, naming the earlier message)"})
    duplicate_days = _int(validate=validate.Range(
        min=0, max=config_rules.MAX_DUPLICATE_DAYS), metadata={
        "description": "the days an interchange counts as a duplicate of an earlier one "
                       "(default 30; 0: no duplicate check)"})
    business_rules = fields.Raw(allow_none=True, metadata={
        "type": "array", "nullable": True, "items": BUSINESS_RULE,
        "description": "a target's business-error rules, checked in order on every "
                       "answer: name, status (200 or '4xx'), body_regex, json_path, "
                       "json_value, block (none, sequence, instance); each refused with "
                       "its reason in details.business_rules"})


class InstanceCreate(InstanceFields):
    name = _name(required=True)
    type = fields.String(required=True)


class BlockedBy(Schema):
    delivery_id = fields.Integer(required=True)
    message_id = fields.Integer(required=True, allow_none=True)
    resubmit = fields.String(required=True, metadata={"description": "POST to resubmit"})
    skip = fields.String(required=True, metadata={"description": "POST to skip"})


class Instance(Schema):
    name = fields.String(required=True)
    type = fields.String(required=True)
    enabled = fields.Boolean(required=True)
    config = fields.Dict(required=True)
    max_concurrent_deliveries = fields.Integer(required=True)
    retry_policy = fields.Dict(required=True, allow_none=True, metadata=RETRY_POLICY)
    ordered = fields.Boolean(required=True)
    queue = fields.String(required=True, allow_none=True)
    probe_interval = fields.Integer(required=True, metadata={
        "description": "seconds between probes of a target whose type can probe; 0: the "
                       "System > Settings probe_interval"})
    retention_days = fields.Integer(required=True, allow_none=True)
    parties_from = fields.String(required=True)
    edi_errors = fields.String(required=True)
    duplicates = fields.String(required=True)
    duplicate_days = fields.Integer(required=True)
    state = fields.String(required=True)
    state_reason = fields.String(required=True, allow_none=True)
    online = fields.Boolean(required=True, allow_none=True, metadata={
        "description": "the last probe's result: true online, false offline (deliveries "
                       "wait, alert target_offline), null never probed or no probe"})
    probe_checked_at = UtcDateTime(required=True, allow_none=True, metadata={
        "description": "when the last recorded probe began"})
    probe_text = fields.String(required=True, allow_none=True, metadata={
        "description": "what the last probe said (the reason when offline)"})
    business_rules = fields.List(fields.Dict(metadata=BUSINESS_RULE), required=True)
    blocked_by = fields.Nested(BlockedBy, required=True, allow_none=True, metadata={
        "description": "the delivery whose business error blocks the instance, null "
                       "when it is not blocked"})
    created_at = UtcDateTime(required=True)
    updated_at = UtcDateTime(required=True)


InstancePage = page_of(Instance, "InstancePage")


# --- routes -------------------------------------------------------------------------

def _party_or_any(**kwargs) -> fields.String:
    return fields.String(load_default="*", metadata={
        "pattern": PARTY_OR_ANY, "description": "a party's name, or * (any)"}, **kwargs)


class RouteCreate(Schema):
    source = _name(required=True, metadata={"description": "a source instance"})
    from_party = _party_or_any(data_key="from")
    to_party = _party_or_any(data_key="to")
    target = _name(required=True, metadata={"description": "a target instance"})
    document_type = fields.String(load_default="*", validate=validate.Regexp(
        DOCUMENT_TYPE_OR_ANY, error=f"must be {routing.DOCUMENT_TYPE_RULE}"), metadata={
        "pattern": DOCUMENT_TYPE_OR_ANY,
        "description": "a document type the message's envelope must hold (850, ORDERS), "
                       "or * (any message, EDI or not)"})


class RouteTestArgs(Schema):
    source = fields.String(required=True, validate=validate.Length(min=1))
    from_party = fields.String(data_key="from", load_default="*",
                               validate=validate.Length(min=1))
    to_party = fields.String(data_key="to", load_default="*", validate=validate.Length(min=1))
    document_types = fields.List(fields.String(validate=validate.Length(min=1, max=255)),
                                 load_default=list, validate=validate.Length(max=100),
                                 metadata={"description": "the types of the message's "
                                           "envelope (850, ORDERS:D:96A); none: a message "
                                           "without one"})


class Route(Schema):
    id = fields.Integer(required=True)
    source = fields.String(required=True)
    from_party = fields.String(data_key="from", required=True)
    to_party = fields.String(data_key="to", required=True)
    document_type = fields.String(required=True)
    target = fields.String(required=True)
    created_at = UtcDateTime(required=True)
    created_by = fields.String(required=True)


RoutePage = page_of(Route, "RoutePage")


class RouteTestResult(Schema):
    targets = fields.List(fields.String(), required=True)
    routes = fields.List(fields.Dict(), required=True, metadata={
        "description": "every route of the source: target, matched and the reason"})


# --- messages and deliveries ----------------------------------------------------------

#: a filter's text may hold any character but NUL, which PostgreSQL's text takes none of:
#: an id in a text argument, as its documented pattern says: ASCII digits only (int()
#: would also take "+5", " 5" and other scripts' digits)
DIGITS = validate.Regexp("^[0-9]+$", error="must be digits 0-9 only")
#: refused as the request's fault (400) rather than failing the query (500)
NO_NUL = validate.Regexp("^[^\x00]*$", error="must not contain a NUL character")


def _filter(description: str | None = None, max_length: int | None = None,
            **kwargs) -> fields.String:
    """A text filter of a list: a name or an exact value."""
    checks = [NO_NUL] + ([validate.Length(min=1, max=max_length)] if max_length else [])
    return fields.String(validate=checks, metadata={"description": description}
                         if description else {}, **kwargs)


def _exact(description: str) -> fields.String:
    """An envelope filter: an exact value (docs/edi.md)."""
    return _filter(description, 255)


class MessageFilterArgs(IdPageArgs):
    status = CommaList(STATUS_FILTERS, metadata={"description": (
        "one or more of our statuses or seed 003's identifiers (ERRO_ENTREGA stands for "
        "every status mapped to it; docs/status-codes.md), comma-separated")})
    from_party = _filter(data_key="from")
    to_party = _filter(data_key="to")
    source = _filter()
    target = _filter("has a delivery to this target")
    since = UtcDateTime(metadata={"description": "created at or after (ISO 8601)"})
    until = UtcDateTime(metadata={"description": "created before (ISO 8601)"})
    q = _filter("a message id, or text found in the original file name (any case), or an "
                "external or correlation id (exact)", 200)
    correlation_id = _filter("the correlation id (exact)", 255)
    document_type = _exact("holds a transaction set / message of this type (850, ORDERS:D:96A)")
    sender = _exact("the envelope's sender, qualifier:id (ZZ:ACME)")
    receiver = _exact("the envelope's receiver, qualifier:id")
    interchange_control = _exact("the interchange control number (ISA13, UNB 0020)")
    group_control = _exact("a functional group's control number (GS06, UNG 0048)")
    transaction_control = _exact("a transaction set's control number (ST02, UNH 0062)")
    reference = _exact("a business reference (BEG03 PO number, BIG02, BGM 1004)")
    acknowledgment = fields.String(validate=validate.OneOf(ACKNOWLEDGMENTS), metadata={
        "description": "the acknowledgment expected of the partner: awaiting, overdue "
                       "(awaiting, past the partner's ack_hours), acknowledged, rejected, "
                       "or none (none expected)"})


class DeliveryFilterArgs(MessageFilterArgs):
    status = CommaList(STATUS_FILTERS, metadata={"description": (
        "of the delivery's message: our statuses or seed 003's identifiers, "
        "comma-separated")})
    target = _filter()
    state = CommaList(STATES)
    message = _id(metadata={"description": "deliveries of this message"})
    since = UtcDateTime(metadata={"description": "delivery created at or after"})
    until = UtcDateTime(metadata={"description": "delivery created before"})


class ReceiptArgs(Schema):
    """What an external system reports about a delivery awaiting its receipt."""

    result = fields.String(required=True, validate=validate.OneOf(["completed", "failed"]))
    text = fields.String(load_default="", validate=validate.Length(max=2000))


class BulkRedeliverArgs(Schema):
    """The filters of ``GET /deliveries``; only failed, stalled or retrying deliveries
    are taken (a ``state`` narrows that further). A bulk action takes at least one
    filter, or ``"all": true`` to mean every such delivery: an empty body is refused,
    never read as "everything"."""

    status = fields.List(fields.String(validate=validate.OneOf(STATUS_FILTERS)), metadata={
        "description": "of the delivery's message: our statuses or seed 003's identifiers"})
    from_party = _filter(data_key="from")
    to_party = _filter(data_key="to")
    source = _filter()
    target = _filter()
    state = fields.List(fields.String(validate=validate.OneOf(
        ["failed", "stalled", "retrying"])))
    message = _id(strict=True)
    since = UtcDateTime()
    until = UtcDateTime()
    q = fields.String(validate=validate.Length(min=1, max=200))
    max = _int(load_default=500, validate=validate.Range(1, 5000), metadata={
        "description": "at most this many in one call (1-5000, default 500)"})
    all = StrictBoolean(load_default=False, metadata={
        "description": "true: every failed, stalled or retrying delivery (the filters "
                       "given still apply); required when no filter is given"})

    @validates_schema
    def _a_filter_or_all(self, data: dict, **kwargs) -> None:
        filters = [key for key, value in data.items()
                   if key not in ("max", "all") and value not in (None, "", [])]
        if not filters and not data.get("all"):
            raise ValidationError(
                "a bulk redeliver needs at least one filter (status, from, to, source, "
                'target, state, message, since, until, q) or "all": true to redeliver '
                "every failed, stalled and retrying delivery", "_schema")


class BulkRedeliverResult(Schema):
    redelivered = fields.List(fields.Integer(), required=True)
    skipped = fields.List(fields.Integer(), required=True, metadata={
        "description": "matched, but changed before their turn (a worker claimed one "
                       "meanwhile): left as they were, no history line"})
    more = fields.Boolean(required=True, metadata={
        "description": "true when more deliveries matched than max: call again"})


class Message(Schema):
    id = fields.Integer(required=True)
    source = fields.String(required=True)
    from_party = fields.String(data_key="from", required=True)
    to_party = fields.String(data_key="to", required=True)
    direction = fields.String(required=True)
    status = fields.String(required=True, validate=validate.OneOf(STATUSES))
    status_code = fields.Function(
        lambda m: status_code(m["status"] if isinstance(m, dict) else m.status),
        required=True, metadata={"type": "string", "enum": list(CODES), "description": (
            "the status as seed 003's identifier (never translated; docs/status-codes.md)")})
    status_text = fields.String(required=True)
    original_filename = fields.String(required=True, allow_none=True)
    external_id = fields.String(required=True, allow_none=True)
    correlation_id = fields.String(required=True, allow_none=True)
    trace_id = fields.Function(lambda m: tracing.trace_id(
        m.get("trace_parent") if isinstance(m, dict) else m.trace_parent), required=True,
                               allow_none=True, metadata={
        "description": "the OpenTelemetry trace id of the message (when traces were on "
                       "as it was received)", "type": "string"})
    sequence_key = fields.String(required=True, allow_none=True)
    size = fields.Integer(required=True)
    sha256 = fields.String(required=True, allow_none=True)
    created_at = UtcDateTime(required=True)
    updated_at = UtcDateTime(required=True)
    acknowledgment = fields.Function(lambda m: _acknowledgment(m)[0], required=True,
                                     allow_none=True, metadata={
        "type": "string", "enum": ["awaiting", "acknowledged", "rejected", None],
        "description": "the functional acknowledgment expected of the partner for an "
                       "interchange we sent (docs/edi.md): null when none is expected"})
    acknowledgment_overdue = fields.Function(lambda m: _acknowledgment(m)[1],
                                             required=True, metadata={
        "type": "boolean",
        "description": "awaiting, and the partner's ack_hours have passed (ack_overdue)"})


def _acknowledgment(message) -> tuple[str | None, bool]:
    """(state, overdue) as the list or the detail attached it; read here otherwise."""
    if isinstance(message, dict):
        return message.get("acknowledgment"), bool(message.get("acknowledgment_overdue"))
    found = getattr(message, "acknowledgment", None)
    if found is None:
        from sqlalchemy.orm import object_session

        from b2bhub.engine.ack_waits import acknowledgments
        session = object_session(message)
        if session is None:
            return None, False
        found = acknowledgments(session, [message.id])[message.id]
    return found


class Delivery(Schema):
    id = fields.Integer(required=True)
    message_id = fields.Integer(required=True)
    target = fields.String(required=True)
    state = fields.String(required=True, validate=validate.OneOf(STATES))
    failure_kind = fields.String(required=True, allow_none=True, validate=validate.OneOf(
        [k.value for k in FailureKind]))
    attempt = fields.Integer(required=True)
    failures = fields.Integer(required=True)
    due_at = UtcDateTime(required=True, allow_none=True)
    wake_count = fields.Integer(required=True)
    lease_until = UtcDateTime(required=True, allow_none=True)
    receipt_ref = fields.String(required=True, allow_none=True)
    receipt_deadline = UtcDateTime(required=True, allow_none=True)
    sequence_key = fields.String(required=True, allow_none=True)
    last_result = fields.String(required=True)
    created_at = UtcDateTime(required=True)
    updated_at = UtcDateTime(required=True)
    settled_at = UtcDateTime(required=True, allow_none=True)


class HistoryLine(Schema):
    id = fields.Integer(required=True)
    type = fields.String(required=True)
    actor = fields.String(required=True)
    text = fields.String(required=True)
    delivery_id = fields.Integer(required=True, allow_none=True)
    data = fields.Dict(required=True, allow_none=True)
    created_at = UtcDateTime(required=True)


class HistoryEvent(Schema):
    """The ``data:`` of one event of ``GET /events``, as JSON: a history line and its
    message's status now (``b2bhub.engine.events.line_json``)."""

    id = fields.Integer(required=True, metadata={"description": "the line's id, also the "
                                                 "event's ``id:``"})
    message_id = fields.Integer(required=True, allow_none=True)
    delivery_id = fields.Integer(required=True, allow_none=True)
    type = fields.String(required=True, metadata={"description": "also the event's "
                                                  "``event:``"})
    text = fields.String(required=True)
    actor = fields.String(required=True)
    created_at = fields.String(required=True, metadata={"format": "date-time"})
    message_status = fields.String(required=True, allow_none=True, validate=validate.OneOf(
        STATUSES))
    message_status_code = fields.String(required=True, allow_none=True,
                                        validate=validate.OneOf(CODES))


class PayloadStage(Schema):
    stage = fields.String(required=True)
    size = fields.Integer(required=True)
    digest = fields.String(required=True)
    created_at = UtcDateTime(required=True)


class MessageDetail(Message):
    deliveries = fields.List(fields.Nested(Delivery), required=True)
    history = fields.List(fields.Nested(HistoryLine), required=True)
    payloads = fields.List(fields.Nested(PayloadStage), required=True)
    envelope = fields.List(fields.Dict(), metadata={
        "description": "what the document inspector read: name and value, in the "
                       "order read (docs/edi.md); empty when none recognised it"})


MessagePage = page_of(Message, "MessagePage")
DeliveryPage = page_of(Delivery, "DeliveryPage")


class PayloadArgs(Schema):
    stage = fields.String(load_default="unpacked", metadata={
        "description": "raw, unpacked, sent or receipt"})


class SendForm(Schema):
    """Send Message by hand: a multipart form."""

    file = fields.Raw(required=True, metadata={"type": "string", "format": "binary"})
    from_party = fields.String(data_key="from", required=True, validate=validate.Length(min=1))
    to_party = fields.String(data_key="to", required=True, validate=validate.Length(min=1))
    target = fields.String(metadata={
        "description": "needed when the routes from sender to recipient give not one"})


# --- alerts -------------------------------------------------------------------------

class AlertArgs(IdPageArgs):
    state = fields.String(load_default="open", validate=validate.OneOf(
        ["open", "unacknowledged", "resolved", "all"]), metadata={
        "description": "open (default): not resolved; unacknowledged: open and not "
                       "acknowledged; resolved; all"})
    kind = _filter()


class Alert(Schema):
    id = fields.Integer(required=True)
    kind = fields.String(required=True)
    subject = fields.String(required=True)
    text = fields.String(required=True)
    message_id = fields.Integer(required=True, allow_none=True)
    message_status = fields.Function(
        lambda a: getattr(a, "message_status", None), required=True, allow_none=True,
        metadata={"type": "string", "enum": STATUSES + [None], "description": (
            "the current status of the message the alert is about (null: none)")})
    status_code = fields.Function(
        lambda a: status_code(getattr(a, "message_status", None)), required=True,
        allow_none=True, metadata={"type": "string", "enum": list(CODES) + [None],
                                   "description": "that status as seed 003's identifier"})
    created_at = UtcDateTime(required=True)
    acknowledged_at = UtcDateTime(required=True, allow_none=True)
    acknowledged_by = fields.String(required=True, allow_none=True)
    resolved_at = UtcDateTime(required=True, allow_none=True)


AlertPage = page_of(Alert, "AlertPage")


# --- users and tokens -----------------------------------------------------------------

class User(Schema):
    name = fields.String(required=True)
    role = fields.String(required=True, validate=validate.OneOf(ROLES))
    disabled = fields.Function(lambda user: user.disabled_at is not None,
                               required=True, metadata={"type": "boolean"})
    created_at = UtcDateTime(required=True)
    disabled_at = UtcDateTime(required=True, allow_none=True)
    last_login_at = UtcDateTime(required=True, allow_none=True)


UserPage = page_of(User, "UserPage")


def _password(**kwargs) -> fields.String:
    return fields.String(load_only=True, metadata={"minLength": users.MIN_PASSWORD,
                                                   "format": "password"}, **kwargs)


class UserCreate(Schema):
    name = fields.String(required=True, metadata={"pattern": users.NAME_RE.pattern})
    password = _password(required=True)
    role = fields.String(load_default="viewer", validate=validate.OneOf(ROLES))


class UserUpdate(Schema):
    role = fields.String(validate=validate.OneOf(ROLES))
    password = _password()
    disabled = StrictBoolean()


class Token(Schema):
    id = fields.Integer(required=True)
    name = fields.String(required=True)
    user = fields.Function(lambda row: row.user_name, required=True, allow_none=True,
                           metadata={"type": "string", "nullable": True})
    role = fields.String(required=True)
    created_at = UtcDateTime(required=True)
    revoked_at = UtcDateTime(required=True, allow_none=True)
    last_used_at = UtcDateTime(required=True, allow_none=True)


TokenPage = page_of(Token, "TokenPage")


class TokenCreate(Schema):
    name = fields.String(required=True, validate=validate.Length(min=1, max=100))
    user = fields.String(metadata={"description": "the user the token acts as"})
    role = fields.String(validate=validate.OneOf(ROLES), metadata={
        "description": "a token without a user acts under its own name with this role "
                       "(default viewer); a user's token has the user's role"})


class TokenCreated(Token):
    token = fields.String(required=True, metadata={
        "description": "the bearer token; shown this once, only its hash is kept"})


class TokenArgs(SmallIdPageArgs):
    revoked = fields.Boolean(load_default=False,
                             metadata={"description": "include revoked tokens"})


# --- the views that answer plain JSON: their shapes, for the document ---------------------
# (they build their answers themselves; these schemas only describe them)

def _counts(text: str) -> fields.Dict:
    return fields.Dict(keys=fields.String(), values=fields.Integer(), required=True,
                       metadata={"description": text})


def _seconds(text: str) -> fields.Float:
    return fields.Float(required=True, allow_none=True, metadata={"description": text})


class StatsMessages(Schema):
    by_status = _counts("messages by status")
    by_status_code = _counts("messages by seed 003's status identifier (each one's count "
                             "is that of the statuses mapped to it)")
    total = fields.Integer(required=True)


class StatsDeliveries(Schema):
    by_state = _counts("deliveries by state")
    total = fields.Integer(required=True)
    due = fields.Integer(required=True, metadata={"description": "due, waiting for a claim"})
    oldest_due_seconds = _seconds("how long the oldest due delivery has waited")


class StatsInstance(Schema):
    name = fields.String(required=True)
    state = fields.String(required=True)
    enabled = fields.Boolean(required=True)
    online = fields.Boolean(required=True, allow_none=True)
    probe_checked_at = UtcDateTime(required=True, allow_none=True)
    blocked_by = fields.Integer(required=True, allow_none=True, metadata={
        "description": "the delivery whose business error blocks the instance"})


class StatsInstances(Schema):
    by_state = _counts("instances by state")
    offline = fields.Integer(required=True)
    blocked = fields.Integer(required=True)
    items = fields.List(fields.Nested(StatsInstance), required=True)


class StatsAttempts(Schema):
    last_hour = fields.Integer(required=True)
    delivered_last_hour = fields.Integer(required=True)
    failures_last_hour = fields.Integer(required=True)
    duration_avg_seconds = _seconds("average attempt duration over the last hour")
    duration_max_seconds = _seconds("longest attempt over the last hour")


class StatsPoint(Schema):
    minute = UtcDateTime(required=True)
    messages_in = fields.Integer(required=True)
    attempts = fields.Integer(required=True)
    delivered = fields.Integer(required=True)
    failures = fields.Integer(required=True)
    duration_avg_seconds = _seconds("average attempt duration in the minute")
    duration_max_seconds = _seconds("longest attempt in the minute")
    due = fields.Integer(required=True)
    oldest_due_seconds = _seconds("the oldest due delivery's wait at the minute's end")


class StatsSeries(Schema):
    span = fields.String(required=True, validate=validate.OneOf(["hour", "day", "none"]))
    points = fields.List(fields.Nested(StatsPoint), required=True)


class Stats(Schema):
    at = UtcDateTime(required=True)
    messages = fields.Nested(StatsMessages, required=True)
    deliveries = fields.Nested(StatsDeliveries, required=True)
    instances = fields.Nested(StatsInstances, required=True)
    attempts = fields.Nested(StatsAttempts, required=True)
    processes = _counts("connected processes by kind")
    series = fields.Nested(StatsSeries, required=True)


class StatsArgs(Schema):
    class Meta:
        unknown = RAISE

    series = fields.String(load_default="hour", validate=validate.OneOf(
        ["hour", "day", "none"], error="series must be hour, day or none"), metadata={
        "description": "the per-minute series: the last 60 minutes, the last 1440, none"})


class ProcessArgs(Schema):
    class Meta:
        unknown = RAISE

    all = fields.String(load_default="false", validate=validate.OneOf(
        ["true", "false"], error="all must be true or false"), metadata={
        "description": "true: also those stopped or gone (kept a day)"})


class Process(Schema):
    id = fields.String(required=True)
    kind = fields.String(required=True, metadata={"description": "web, worker or beat"})
    host = fields.String(required=True)
    pid = fields.Integer(required=True)
    started_at = UtcDateTime(required=True)
    last_seen = UtcDateTime(required=True)
    stopped_at = UtcDateTime(required=True, allow_none=True)
    instances = fields.List(fields.String(), required=True)
    state = fields.String(required=True)


ProcessPage = page_of(Process, "ProcessPage")


class InstanceState(Schema):
    name = fields.String(required=True)
    state = fields.String(required=True)
    state_reason = fields.String(required=True, allow_none=True)
    message = fields.String(required=True, metadata={"description": "what happened"})


class IntakeToken(Schema):
    name = fields.String(required=True)
    created_by = fields.String(required=True)
    created_at = UtcDateTime(required=True)


IntakeTokenPage = page_of(IntakeToken, "IntakeTokenPage")


class IntakeTokenCreate(Schema):
    name = fields.String(required=True, validate=validate.Length(min=1, max=64))


class IntakeTokenCreated(Schema):
    instance = fields.String(required=True)
    name = fields.String(required=True)
    token = fields.String(required=True, metadata={
        "description": "the bearer token senders use; shown this once"})


LEVELS = ["debug", "info", "warning", "error", "critical"]


def _level() -> fields.String:
    return fields.String(validate=validate.OneOf(LEVELS, error=(
        "level must be a log level: debug, info, warning, error or critical")), metadata={
        "description": "that level and above"})


def _process() -> fields.String:
    return fields.String(metadata={"description": "a process id, or a kind: web, worker, "
                                   "beat"})


class LogArgs(IdPageArgs):
    level = _level()
    process = _process()


class LogStreamArgs(Schema):
    class Meta:
        unknown = RAISE

    level = _level()
    process = _process()
    after = fields.String(validate=DIGITS, metadata={
        "description": "resume after this record id", "pattern": "^[0-9]+$"})


class LogRecord(Schema):
    id = fields.Integer(required=True)
    created_at = UtcDateTime(required=True)
    level = fields.String(required=True)
    level_no = fields.Integer(required=True)
    logger = fields.String(required=True)
    message = fields.String(required=True)
    process_id = fields.String(required=True, allow_none=True)
    kind = fields.String(required=True, allow_none=True)
    host = fields.String(required=True, allow_none=True)
    pid = fields.Integer(required=True, allow_none=True)


LogPage = page_of(LogRecord, "LogPage")


class EventArgs(Schema):
    class Meta:
        unknown = RAISE

    after = fields.String(validate=DIGITS, metadata={
        "description": "resume after this history line id (or send Last-Event-ID)",
        "pattern": "^[0-9]+$"})
    message = fields.String(validate=DIGITS, metadata={
        "description": "only this message's lines", "pattern": "^[0-9]+$"})
    type = fields.String(metadata={"description": "only these line types, comma-separated"})


class StorageTarget(Schema):
    target = fields.String(required=True)
    messages = fields.Integer(required=True)
    bytes = fields.Integer(required=True)


class StorageSource(Schema):
    source = fields.String(required=True)
    messages = fields.Integer(required=True)
    bytes = fields.Integer(required=True)
    retention_days = fields.Integer(required=True, allow_none=True, metadata={
        "description": "null: kept forever"})
    retention = fields.String(required=True)
    oldest_message_at = UtcDateTime(required=True, allow_none=True)
    targets = fields.List(fields.Nested(StorageTarget), required=True)


class StorageParty(Schema):
    party = fields.String(required=True)
    messages = fields.Integer(required=True)
    bytes = fields.Integer(required=True)
    sources = fields.List(fields.Nested(StorageSource), required=True)


class StorageStore(Schema):
    measured_at = UtcDateTime(required=True, allow_none=True)
    files = fields.Integer(required=True)
    bytes = fields.Integer(required=True)
    referenced_files = fields.Integer(required=True)
    referenced_bytes = fields.Integer(required=True)
    unreferenced_files = fields.Integer(required=True)
    unreferenced_bytes = fields.Integer(required=True)


class Storage(Schema):
    parties = fields.List(fields.Nested(StorageParty), required=True)
    messages = fields.Integer(required=True)
    bytes = fields.Integer(required=True)
    default_retention_days = fields.Integer(required=True, allow_none=True)
    computed_at = UtcDateTime(required=True)
    store = fields.Nested(StorageStore, required=True, allow_none=True, metadata={
        "description": "the payload store as the last cleanup run found it; null before"})


class StorageArgs(Schema):
    class Meta:
        unknown = RAISE

    fresh = fields.String(load_default="false", validate=validate.OneOf(["true", "false"]),
                          metadata={"description": "true: compute the figures now"})
