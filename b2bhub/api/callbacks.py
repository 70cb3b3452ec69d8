"""``POST /callbacks/<token>``: receipts by callback (SPEC 8, ``http_poster``).

A destination that answered 202 reports the result later to the capability URL it was
given in ``X-B2BHub-Callback-Url``: ``{"result": "completed"|"failed", "text": "..."}``.
The token is the credential (:mod:`b2bhub.domain.callbacks`), so there is no login, no
API token and no CSRF token. Answers, each error as ``{"error": {"code", "message",
"details"}}``:

* 200 ``{"changed": true, ...}``: the delivery is settled (delivered or failed);
* 404: the token is not genuine, its delivery is gone, or it was made for another
  attempt than the delivery's current one; nothing changes and nothing is recorded;
* 400: the body is not such a JSON object; nothing changes;
* 409: the delivery is not awaiting a receipt (settled already, or failed when its
  deadline passed); the refusal is recorded in its history as ``receipt_refused``.
"""

from __future__ import annotations

from flask import Blueprint, current_app, request
from marshmallow import ValidationError

from b2bhub.api.errors import error_response
from b2bhub.api.schemas import ReceiptArgs
from b2bhub.config.extensions import db
from b2bhub.engine import operator
from b2bhub.models import Delivery, utcnow
from b2bhub.runtime import hub

bp = Blueprint("callbacks", __name__)
#: the history's name for who reported a receipt through a callback URL
ACTOR = "destination callback"


@bp.post("/callbacks/<token>")
def receipt_callback(token: str):
    found = hub.callback_tokens().parse(token)
    delivery = db.session.get(Delivery, found[0]) if found else None
    if delivery is None or delivery.attempt != found[1]:
        db.session.rollback()
        return error_response(404, "not_found", "no delivery awaits a callback at this URL")
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        db.session.rollback()
        return error_response(400, "bad_request", 'the body must be a JSON object such as '
                              '{"result": "completed", "text": "..."}')
    try:
        report = ReceiptArgs().load(body)
    except ValidationError as exc:
        db.session.rollback()
        return error_response(400, "bad_request", "the receipt is not valid",
                              exc.normalized_messages())
    try:
        result = operator.record_receipt(db.session, delivery.id,
                                         report["result"] == "completed", report["text"],
                                         ACTOR, utcnow())
    except operator.ReceiptRefused as exc:
        db.session.commit()  # the refusal stays on record
        return error_response(409, "receipt_refused", str(exc))
    db.session.commit()
    current_app.logger.info("delivery %s: receipt by callback: %s", delivery.id,
                            report["result"])
    return {"changed": result.changed, "message": result.text,
            "deliveries": result.deliveries}
