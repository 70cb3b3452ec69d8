"""``GET /audit``: the audit export (docs/audit.md), streamed as CSV or JSON Lines;
for admins. Taking it is itself a history line naming the caller."""

from __future__ import annotations

from flask import Response, g, stream_with_context
from marshmallow import Schema, fields, validate

from b2bhub.api.auth import requires
from b2bhub.api.blueprint import ApiError, bp
from b2bhub.api.schemas import UtcDateTime
from b2bhub.config.extensions import db
from b2bhub.models import utcnow
from b2bhub.services import audit as svc


class AuditArgs(Schema):
    since = UtcDateTime(required=True, metadata={
        "description": "lines written at or after this time (ISO 8601)"})
    until = UtcDateTime(metadata={"description": "lines written before this time; "
                                                 "left out: up to the call"})
    actor = fields.String(validate=validate.Length(min=1, max=128), metadata={
        "description": "only the lines of this operator (exact)"})
    type = fields.String(validate=validate.Length(min=1, max=40), metadata={
        "description": "only lines of this type (config_changed, user_created, "
                       "token_created, redeliver_requested ...)"})
    format = fields.String(load_default="jsonl", validate=validate.OneOf(list(svc.FORMATS)),
                           metadata={"description": "csv (with a header row) or jsonl"})


_LINE = {"type": "object", "properties": {
    "id": {"type": "integer"}, "created_at": {"type": "string", "format": "date-time"},
    "type": {"type": "string"}, "actor": {"type": "string"},
    "message_id": {"type": "integer", "nullable": True},
    "delivery_id": {"type": "integer", "nullable": True},
    "text": {"type": "string"}, "data": {"nullable": True}}}
_STREAMED = {"description": (
    "The lines in id order, streamed. CSV: a header row then one row per line, columns "
    + ", ".join(svc.COLUMNS) + " (data as JSON). JSON Lines: one object per line "
    "(``x-line``)."),
    "content": {"text/csv": {"schema": {"type": "string"},
                             "example": ",".join(svc.COLUMNS) + "\r\n"},
                "application/x-ndjson": {"schema": {"type": "string", "x-line": _LINE},
                                         "example": '{"id": 1, "type": "config_changed"}\n'}}}


@bp.get("/audit", summary="Export the audit trail (CSV or JSON Lines)", refusals=(422,),
        server_checks=("until",))
@requires("admin")
@bp.arguments(AuditArgs, location="query")
@bp.doc(responses={200: _STREAMED})
def export_audit(args: dict):
    """Every history line of the period: operator actions, configuration changes
    (parties, profiles, certificates, routes, instances, users, tokens) and message
    lines, filtered by ``actor`` and ``type``. Refused (422) when ``until`` is not after
    ``since``. The export is recorded as an ``audit_exported`` line naming the caller."""
    since, until = args["since"], args.get("until")
    if until is not None and until <= since:
        raise ApiError(422, "invalid", "until must be after since",
                       {"until": "not after since"})
    export = svc.begin(db.session, since, until, args.get("actor"), args.get("type"),
                       args["format"], g.actor, utcnow())
    db.session.commit()
    name = f"audit-{since:%Y%m%dT%H%M%S}.{export.format}"
    return Response(stream_with_context(svc.stream(db.engine, export)),
                    mimetype=svc.FORMATS[export.format].split(";")[0],
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})
