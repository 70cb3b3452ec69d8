"""``POST /as2/<instance>``: the AS2 endpoint of each enabled ``as2_receiver`` instance.

No login and no CSRF token: AS2 is authenticated by signatures and party profiles. The
view never answers 500: an unexpected failure (the database unreachable, say) is logged
and answered 503, which an AS2 sender retries; nothing was accepted then.

No request holds a database connection while its body arrives: a body of at most
:data:`PREREAD` bytes (by Content-Length) is read first, and the receiver looks the
instance up with the rest it reads before parsing, in one statement, so the whole
request is one transaction on one connection; a larger one is read after the
instance's lookup and its transaction ended, the instance's ``max_size`` known.
"""

from __future__ import annotations

import io
import logging

from flask import Blueprint, Response, request

from b2bhub import hub
from b2bhub.engine import wakeups
from b2bhub.extensions import db
from b2bhub.models import utcnow
from plugins.as2 import receiver

bp = Blueprint("as2", __name__)
log = logging.getLogger(__name__)
#: bodies up to this size (by Content-Length) are read before any database work
PREREAD = 256 * 1024


def _plain(status: int, text: str) -> Response:
    return Response(text + "\n", status, {"Content-Type": "text/plain; charset=utf-8"})


@bp.post("/as2/<instance>")
def receive(instance: str):
    wakeups.defer(db.session)  # what the request commits is woken once it is answered
    try:
        response, mdn_owed = _receive(instance)
    finally:
        committed = wakeups.stop_deferring(db.session)
    return _after_response(response, committed, mdn_owed)


def _receive(instance: str) -> tuple[Response, bool]:
    try:
        length, body = request.content_length, request.stream
        small = length is not None and length <= PREREAD
        config = None  # for a small body the receiver looks it up with the rest
        if small:
            body = io.BytesIO(body.read())
        else:
            config = receiver.instance_config(db.session, instance)
            db.session.commit()  # its connection back to the pool while the body arrives
        if config is None and not small:
            reply = receiver.no_receiver(instance)
        else:
            reply = receiver.receive(
                db.session, hub.store(), instance, config,
                [(k, v) for k, v in request.headers.items() if k.lower() != "host"],
                body, length, utcnow())
    except Exception:
        db.session.rollback()
        log.exception("AS2 receiver %s failed; answered 503", instance)
        return _plain(503, "the hub could not take the message now; try again later"), False
    return Response(reply.body, reply.status, reply.headers), reply.mdn_owed


def _after_response(response: Response, committed: list, mdn_owed: bool) -> Response:
    """Wake the workers for what the request committed once the response is sent (the
    partner waits for its MDN, not for the broker); the sweep re-wakes what is lost."""
    if committed or mdn_owed:
        response.call_on_close(lambda: _wake(committed, mdn_owed))
    return response


def _wake(committed: list, mdn_owed: bool) -> None:
    wakeups.publish_now(committed)
    if mdn_owed:
        _wake_mdn_sender()


def _wake_mdn_sender() -> None:
    """Ask a worker to send the owed MDN now; beat asks every 5 s anyway."""
    try:
        from b2bhub.tasks import as2_send_mdns
        as2_send_mdns.apply_async(retry=False, expires=60)
    except Exception:
        log.info("could not publish the MDN wake-up; beat sends it", exc_info=True)
