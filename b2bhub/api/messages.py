"""The read side of messages and deliveries."""

from __future__ import annotations

from flask import jsonify

from b2bhub.api import bp
from b2bhub.api.inputs import cursor_arg, int_arg, limit_arg, list_arg, text_arg, time_arg
from b2bhub.api.shapes import delivery_json, message_detail_json, message_json, page_json
from b2bhub.extensions import db
from b2bhub.services import messages as svc


@bp.get("/messages")
def list_messages():
    filters = svc.MessageFilter(
        status=list_arg("status"), from_party=text_arg("from"), to_party=text_arg("to"),
        source=text_arg("source"), target=text_arg("target"), since=time_arg("since"),
        until=time_arg("until"), q=text_arg("q"))
    page = svc.list_messages(db.session, filters, limit_arg(), cursor_arg(int))
    return jsonify(page_json(page, message_json))


@bp.get("/messages/<int:message_id>")
def get_message(message_id: int):
    message = svc.get_message(db.session, message_id)
    return jsonify(message_detail_json(message, svc.message_history(db.session, message_id)))


@bp.get("/deliveries")
def list_deliveries():
    filters = svc.DeliveryFilter(target=text_arg("target"), state=list_arg("state"),
                                 message_id=int_arg("message"))
    page = svc.list_deliveries(db.session, filters, limit_arg(), cursor_arg(int))
    return jsonify(page_json(page, delivery_json))
