"""Operator actions, sending by hand and payload download (SPEC 12, 16)."""

from __future__ import annotations

from flask import g, jsonify, request, send_file
from sqlalchemy import select

from b2bhub import hub
from b2bhub.api import bp
from b2bhub.api.auth import requires
from b2bhub.api.errors import ApiError
from b2bhub.api.inputs import bad_request
from b2bhub.api.shapes import message_json
from b2bhub.engine import operator
from b2bhub.extensions import db
from b2bhub.models import Message, Payload, utcnow
from b2bhub.services import sending

MESSAGE_ACTIONS, DELIVERY_ACTIONS = operator.MESSAGE_ACTIONS, operator.DELIVERY_ACTIONS


@bp.post("/messages/<int:message_id>/<any(redispatch, cancel):action>")
@requires("operator")
def message_action(message_id: int, action: str):
    return _act(MESSAGE_ACTIONS[action], message_id)


@bp.post("/deliveries/<int:delivery_id>/<any(redeliver, 'send-again', cancel, resubmit, skip)"
         ":action>")
@requires("operator")
def delivery_action(delivery_id: int, action: str):
    return _act(DELIVERY_ACTIONS[action], delivery_id)


def _act(action, object_id: int):
    result = action(db.session, object_id, g.actor, utcnow())
    db.session.commit()
    return jsonify({"changed": result.changed, "message": result.text,
                    "deliveries": result.deliveries})


@bp.post("/messages")
@requires("operator")
def send_message():
    """Multipart upload: ``file``, ``from``, ``to``, optional ``target``."""
    request.max_content_length = sending.MAX_BYTES + 1024 * 1024  # room for the form
    upload = request.files.get("file")
    if upload is None:
        raise bad_request("a multipart form with a 'file' field is required", "file")
    for field in ("from", "to"):
        if not request.form.get(field):
            raise bad_request(f"missing field: {field}", field)
    message = sending.send_by_hand(
        db.session, hub.store(), hub.registry(), upload.stream, upload.filename or "",
        request.form["from"], request.form["to"], request.form.get("target") or None,
        g.actor, utcnow())
    db.session.commit()
    return jsonify(message_json(message)), 201, {"Location": f"{bp.url_prefix}/messages/"
                                                             f"{message.id}"}


@bp.get("/messages/<int:message_id>/payload")
def download_payload(message_id: int):
    """Any recorded stage of a message; a stage it does not have is a clear 404."""
    stage = request.args.get("stage", "unpacked")
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
