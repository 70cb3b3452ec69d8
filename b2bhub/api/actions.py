"""Operator actions, sending by hand and payload download (SPEC 12, 16)."""

from __future__ import annotations

from flask import g, request, send_file
from sqlalchemy import select

import b2bhub.api.schemas as s
from b2bhub.api.auth import requires
from b2bhub.api.blueprint import ApiError, bp
from b2bhub.api.messages import delivery_filter
from b2bhub.config.extensions import db
from b2bhub.engine import operator
from b2bhub.models import Message, Payload, utcnow
from b2bhub.runtime import hub
from b2bhub.services import messages as messages_svc
from b2bhub.services import sending

MESSAGE_ACTIONS, DELIVERY_ACTIONS = operator.MESSAGE_ACTIONS, operator.DELIVERY_ACTIONS


#: each action: (summary, description); one operation per action, 409 when it does not
#: apply to the object as it is
MESSAGE_TEXTS = {
    "redispatch": ("Match a message's routes again", "New deliveries for targets the "
                   "routes now give; stalled ones re-queued."),
    "cancel": ("Cancel a message", "Cancel every delivery of the message not final yet."),
}
DELIVERY_TEXTS = {
    "redeliver": ("Redeliver a delivery", "A failed, stalled or retrying delivery is "
                  "queued again."),
    "send-again": ("Send a delivered delivery again", "A delivered one is sent once more."),
    "cancel": ("Cancel a delivery", "A delivery not final yet is cancelled."),
    "resubmit": ("Resubmit a blocking delivery", "The failed delivery that blocks its "
                 "ordered sequence (or its instance) is tried again."),
    "skip": ("Skip a blocking delivery", "The failed delivery that blocks its ordered "
             "sequence (or its instance) is given up, so the next ones go."),
}


def _action_view(action, id_name: str, texts: tuple[str, str]):
    def view(**ids):
        return _act(action, ids[id_name])
    view.__doc__ = texts[1] + " History line naming the operator; 409 when it does not apply."
    return bp.response(200, s.ActionResult)(requires("operator")(view))


for _name, _action in MESSAGE_ACTIONS.items():
    bp.add_url_rule(f"/messages/<int:message_id>/{_name}", f"{_name}_message",
                    _action_view(_action, "message_id", MESSAGE_TEXTS[_name]),
                    methods=["POST"], summary=MESSAGE_TEXTS[_name][0], refusals=(409,))
for _name, _action in DELIVERY_ACTIONS.items():
    bp.add_url_rule(f"/deliveries/<int:delivery_id>/{_name}",
                    f"{_name.replace('-', '_')}_delivery",
                    _action_view(_action, "delivery_id", DELIVERY_TEXTS[_name]),
                    methods=["POST"], summary=DELIVERY_TEXTS[_name][0], refusals=(409,))


@bp.document_hook
def document_bulk_rule(doc: dict, registry) -> None:
    """The rule of BulkRedeliverArgs' validator in the schema: a filter given (not empty)
    or ``all`` true."""
    schema = doc["components"]["schemas"]["BulkRedeliverArgs"]
    alternatives = [{"type": "object", "required": ["all"], "properties": {
        "all": {"type": "boolean", "enum": [True]}}}]
    for name, prop in schema["properties"].items():
        if name in ("all", "max"):
            continue
        given = {"minItems": 1} if prop.get("type") == "array" else \
            {"minLength": 1} if prop.get("type") == "string" and "format" not in prop else {}
        alternatives.append({"type": "object", "required": [name],
                             "properties": {name: {**prop, **given}}})
    schema["anyOf"] = alternatives


def _act(action, object_id: int) -> dict:
    result = action(db.session, object_id, g.actor, utcnow())
    db.session.commit()
    return {"changed": result.changed, "message": result.text,
            "deliveries": result.deliveries}


@bp.post("/deliveries/<int:delivery_id>/receipt", summary="Report a delivery's receipt",
         refusals=(409,))
@requires("operator")
@bp.arguments(s.ReceiptArgs)
@bp.response(200, s.ActionResult)
def report_receipt(body: dict, delivery_id: int):
    """Settle a delivery awaiting its receipt (an HTTP destination's callback, an external
    system finishing a long job): ``completed`` delivers it, ``failed`` fails it. A
    second report, or one after the receipt deadline failed the delivery, is refused
    (409) and recorded in the message history as unattributable."""
    completed = body["result"] == "completed"
    return _act(lambda session, object_id, actor, now: operator.record_receipt(
        session, object_id, completed, body["text"], actor, now), delivery_id)


@bp.post("/deliveries/redeliver", summary="Redeliver every delivery matching filters")
@requires("operator")
@bp.arguments(s.BulkRedeliverArgs)
@bp.response(200, s.BulkRedeliverResult)
def redeliver_matching(body: dict):
    """Redeliver every failed, stalled or retrying delivery matching the filters (as
    ``GET /deliveries`` takes them, lists as JSON arrays), oldest first, at most ``max``
    in one call. Each one gets its own history line naming the operator. One that
    changes between the selection and its turn (a worker claimed it meanwhile) is left
    as it is and listed in ``skipped``; the others still go. At least one filter, or
    ``"all": true``, is required: a request without either is refused (400)."""
    result = messages_svc.redeliver_matching(
        db.session, delivery_filter(body), body["max"], g.actor, utcnow())
    db.session.commit()
    return {"redelivered": result.redelivered, "skipped": result.skipped,
            "more": result.more}


@bp.post("/messages", summary="Send a file by hand", refusals=(400, 413),
         server_checks=("from", "to", "target"))
@requires("operator")
@bp.doc(requestBody={"required": True, "content": {"multipart/form-data": {
    "schema": s.SendForm}}})
@bp.response(201, s.Message)
def send_message():
    """Send a file by hand (multipart: ``file``, ``from``, ``to``, optional ``target``),
    at most 64 MiB. It is delivered to the given target, or to the one target the routes
    from sender to recipient give."""
    request.max_content_length = sending.MAX_BYTES + 1024 * 1024  # room for the form
    upload = request.files.get("file")
    if upload is None:
        raise ApiError(400, "invalid", "a multipart form with a 'file' field is required",
                       {"file": "required"})
    for field in ("from", "to"):
        if not request.form.get(field):
            raise ApiError(400, "invalid", f"missing field: {field}", {field: "required"})
    message = sending.send_by_hand(
        db.session, hub.store(), hub.registry(), upload.stream, upload.filename or "",
        request.form["from"], request.form["to"], request.form.get("target") or None,
        g.actor, utcnow())
    db.session.commit()
    return message, 201, {"Location": f"{bp.url_prefix}/messages/{message.id}"}


@bp.get("/messages/<int:message_id>/payload", summary="Download a payload stage")
@bp.arguments(s.PayloadArgs, location="query")
@bp.doc(responses={200: {"description": "the payload stage's bytes", "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
def download_payload(args: dict, message_id: int):
    """Any recorded stage of a message; a stage it does not have is a clear 404."""
    stage = args["stage"]
    message = db.session.get(Message, message_id)
    if message is None:
        raise ApiError(404, "not_found", f"no message {message_id}")
    payload = db.session.scalar(select(Payload).where(Payload.message_id == message_id,
                                                      Payload.stage == stage))
    if payload is None:
        recorded = ", ".join(p.stage for p in message.payloads) or "none"
        raise ApiError(404, "stage_not_found", f"message {message_id} has no '{stage}' "
                       f"payload stage (recorded: {recorded})")
    name = f"{message.original_filename or message_id}" + ("" if stage == "unpacked"
                                                            else f".{stage}")
    return send_file(hub.store().open(payload.digest), mimetype="application/octet-stream",
                     as_attachment=True, download_name=name)
