"""Operator actions, sending by hand and payload download (SPEC 12, 16)."""

from __future__ import annotations

from flask import g, request, send_file
from sqlalchemy import select

from b2bhub import hub
from b2bhub.api import bp
from b2bhub.api import schemas as s
from b2bhub.api.auth import requires
from b2bhub.api.blueprint import ApiError
from b2bhub.api.messages import delivery_filter
from b2bhub.engine import operator
from b2bhub.extensions import db
from b2bhub.models import Message, Payload, utcnow
from b2bhub.services import messages as messages_svc
from b2bhub.services import sending

MESSAGE_ACTIONS, DELIVERY_ACTIONS = operator.MESSAGE_ACTIONS, operator.DELIVERY_ACTIONS


@bp.post("/messages/<int:message_id>/<any(redispatch, cancel):action>")
@requires("operator")
@bp.response(200, s.ActionResult)
def message_action(message_id: int, action: str):
    """``redispatch``: match the routes again (new deliveries, stalled ones re-queued);
    ``cancel``: cancel every delivery not final yet. 409 when it does not apply."""
    return _act(MESSAGE_ACTIONS[action], message_id)


@bp.post("/deliveries/<int:delivery_id>/<any(redeliver, 'send-again', cancel, resubmit, skip)"
         ":action>")
@requires("operator")
@bp.response(200, s.ActionResult)
def delivery_action(delivery_id: int, action: str):
    """``redeliver`` a failed, stalled or retrying delivery; ``send-again`` a delivered
    one; ``cancel`` one not final; ``resubmit`` or ``skip`` the failed delivery that
    blocks its ordered sequence. 409 when it does not apply."""
    return _act(DELIVERY_ACTIONS[action], delivery_id)


def _act(action, object_id: int) -> dict:
    result = action(db.session, object_id, g.actor, utcnow())
    db.session.commit()
    return {"changed": result.changed, "message": result.text,
            "deliveries": result.deliveries}


@bp.post("/deliveries/<int:delivery_id>/receipt")
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


@bp.post("/deliveries/redeliver")
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


@bp.post("/messages")
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


@bp.get("/messages/<int:message_id>/payload")
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
