"""The read side of messages and deliveries."""

from __future__ import annotations

import b2bhub.api.schemas as s
from b2bhub.api.blueprint import bp
from b2bhub.config.extensions import db
from b2bhub.services import messages as svc

MESSAGE_FILTERS = ("status", "from_party", "to_party", "source", "target", "since",
                   "until", "q", "correlation_id", *svc.ENVELOPE_FILTERS, "acknowledgment")


def message_filter(args: dict) -> svc.MessageFilter:
    return svc.MessageFilter(**{key: args.get(key) for key in MESSAGE_FILTERS})


def delivery_filter(args: dict) -> svc.DeliveryFilter:
    return svc.DeliveryFilter(**{key: args.get(key) for key in MESSAGE_FILTERS},
                              state=args.get("state"), message_id=args.get("message"))


@bp.get("/messages")
@bp.arguments(s.MessageFilterArgs, location="query")
@bp.response(200, s.MessagePage)
def list_messages(args: dict):
    """Messages newest first; every filter given must match."""
    return _messages(args)


@bp.get("/messages/<int:message_id>")
@bp.response(200, s.MessageDetail)
def get_message(message_id: int):
    """One message with its deliveries, history (oldest first) and payload stages."""
    return _message(message_id)


# Seed 003's paths, for clients written against them (docs/status-codes.md): the same
# answers as /messages, whose ``status`` filter takes the seed's identifiers too.
@bp.get("/mensagens", summary="Messages (seed 003's path)")
@bp.arguments(s.MessageFilterArgs, location="query")
@bp.response(200, s.MessagePage)
def list_mensagens(args: dict):
    """``GET /messages`` under seed 003's path: the same filters (``status`` takes
    ``ERRO_ENTREGA`` and the seed's other identifiers) and the same answer."""
    return _messages(args)


@bp.get("/mensagens/<int:message_id>", summary="One message (seed 003's path)")
@bp.response(200, s.MessageDetail)
def get_mensagem(message_id: int):
    """``GET /messages/{message_id}`` under seed 003's path: the same answer."""
    return _message(message_id)


def _messages(args: dict) -> dict:
    page = svc.list_messages(db.session, message_filter(args), args["limit"],
                             args.get("cursor"))
    svc.attach_acknowledgments(db.session, page.items)
    return s.page_json(page)


def _message(message_id: int):
    message = svc.get_message(db.session, message_id)
    message.history = svc.message_history(db.session, message_id)
    message.envelope = svc.message_envelope(db.session, message_id)
    svc.attach_acknowledgments(db.session, [message])
    return message


@bp.get("/deliveries")
@bp.arguments(s.DeliveryFilterArgs, location="query")
@bp.response(200, s.DeliveryPage)
def list_deliveries(args: dict):
    """Deliveries newest first; the message filters apply to each delivery's message."""
    return s.page_json(svc.list_deliveries(db.session, delivery_filter(args),
                                           args["limit"], args.get("cursor")))
