"""Messages: the list (filters, search, live rows), one message with its actions, and
Send Message."""

from __future__ import annotations

from datetime import UTC, datetime

from flask import abort, flash, g, redirect, render_template, request, url_for
from flask_babel import gettext as _
from werkzeug.datastructures import MultiDict

from b2bhub.config.extensions import db
from b2bhub.domain.states import DeliveryState, MessageStatus
from b2bhub.engine import operator
from b2bhub.engine.dispatch import TEST_SOURCE
from b2bhub.models import Delivery, utcnow
from b2bhub.models.pages import Page
from b2bhub.runtime import hub
from b2bhub.services import messages as svc
from b2bhub.services import sending
from b2bhub.services.envelope import envelope_view
from b2bhub.services.errors import ServiceError
from b2bhub.web.choices import instance_names, party_choices
from b2bhub.web.forms import ActionForm, SendForm, refusal, show_service_error
from b2bhub.web.kit import bp, expired, requires

PAGE_SIZE = 50
#: the envelope filters (docs/edi.md) are the API's, by the same names
FILTER_ARGS = ("status", "from", "to", "source", "target", "since", "until", "q",
               "correlation_id", *svc.ENVELOPE_FILTERS)
#: the envelope filters the list shows under its "Envelope" disclosure (the others,
#: document type and reference, are always shown)
MORE_ENVELOPE = ("sender", "receiver", "interchange_control", "group_control",
                 "transaction_control")


def ui_time(args: MultiDict, name: str, errors: dict) -> datetime | None:
    """A time typed in a filter (``2024-05-01T12:00``, UTC) as the naive UTC rows hold."""
    value = (args.get(name) or "").strip()
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        errors[name] = _("a time like %(example)s (UTC)", example="2024-05-01T12:00")
        return None
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def message_filter(args: MultiDict) -> tuple[svc.MessageFilter, dict]:
    errors: dict[str, str] = {}
    statuses = [s for s in args.getlist("status") if s]
    wrong = [s for s in statuses if s not in MessageStatus.__members__.values()]
    if wrong:
        errors["status"] = _("unknown status %(status)s", status=", ".join(wrong))
    filters = svc.MessageFilter(
        status=[s for s in statuses if s not in wrong] or None,
        from_party=args.get("from") or None, to_party=args.get("to") or None,
        source=args.get("source") or None, target=args.get("target") or None,
        since=ui_time(args, "since", errors), until=ui_time(args, "until", errors),
        q=(args.get("q") or "").strip() or None,
        correlation_id=(args.get("correlation_id") or "").strip() or None,
        **{name: (args.get(name) or "").strip() or None for name in svc.ENVELOPE_FILTERS})
    return filters, errors


#: the delivery states that explain a message's trouble, the worst first
TROUBLE = (DeliveryState.FAILED, DeliveryState.STALLED, DeliveryState.RETRYING)
#: message statuses the list and the page explain with a reason
EXPLAINED = frozenset({MessageStatus.ERROR, MessageStatus.BUSINESS_ERROR,
                       MessageStatus.STALLED, MessageStatus.RETRYING, MessageStatus.REFUSED,
                       MessageStatus.COLLECTION_ERROR, MessageStatus.NOT_ROUTED})


def trouble(m) -> tuple[Delivery | None, str]:
    """Why a message is where it is: the delivery that explains its status (failed
    first, then stalled, then retrying) and that delivery's last result, or the
    message's own status text (refused, not routed); ``(None, "")`` when all is well."""
    if m.status not in EXPLAINED:
        return None, ""
    for state in TROUBLE:
        for d in m.deliveries:
            if d.state == state:
                return d, d.last_result or ""
    return None, m.status_text or ""


def explaining_lines(history: list, deliveries: list) -> dict[int, int]:
    """{delivery id: id of the history line that took it to its present state}: the
    last line of the delivery that names that state, else its last line."""
    states = {d.id: d.state for d in deliveries}
    last: dict[int, int] = {}
    naming: dict[int, int] = {}
    for line in history:
        if line.delivery_id in states:
            last[line.delivery_id] = line.id
            if (line.data or {}).get("state") == states[line.delivery_id]:
                naming[line.delivery_id] = line.id
    return {**last, **naming}


def short(text: str | None, width: int = 120) -> str:
    """A reason in one line of at most ``width`` characters (the page keeps the rest in
    the element's title)."""
    line = " ".join((text or "").split())
    return line if len(line) <= width else line[:width - 1].rstrip() + "…"


@bp.get("/messages")
def messages():
    filters, errors = message_filter(request.args)
    after = request.args.get("after", type=int)
    # a filter with a mistake lists nothing: every message would look like a match
    page = Page([], None) if errors else svc.list_messages(db.session, filters, PAGE_SIZE,
                                                            after)
    args = {k: request.args.getlist(k) for k in FILTER_ARGS if request.args.get(k)}
    return render_template("ui/messages.html", page=page, errors=errors, args=args,
                           statuses=list(MessageStatus), first_page=after is None,
                           sources=instance_names("source") + [sending.OPERATOR_SOURCE],
                           targets=instance_names("target"),
                           envelope_open=any(request.args.get(k) for k in MORE_ENVELOPE))


@bp.get("/messages/rows")
def message_rows():
    """Rows of the messages with ``ids`` as the list draws them, for live updates; each
    says whether it still matches the list's filters (``data-match``)."""
    ids = [int(i) for i in request.args.get("ids", "").split(",") if i.isdigit()][:200]
    filters, _errors = message_filter(request.args)
    rows = svc.messages_by_id(db.session, ids)
    matching = svc.matching_ids(db.session, filters, ids) if ids else set()
    return render_template("ui/_message_rows.html", messages=rows, matching=matching)


@bp.get("/messages/<int:message_id>")
def message(message_id: int):
    try:
        found = svc.get_message(db.session, message_id)
    except ServiceError:
        abort(404, _("no message %(id)s", id=message_id))
    history = svc.message_history(db.session, message_id)
    svc.attach_acknowledgments(db.session, [found])
    return render_template("ui/message.html", m=found, form=ActionForm(), history=history,
                           envelope=envelope_view(db.session, hub.store(), found),
                           explained_by=explaining_lines(history, found.deliveries),
                           can_redispatch=_can_redispatch(found),
                           can_cancel=_can_cancel(found), D=DeliveryActions,
                           blocking={d.id for d in found.deliveries
                                     if operator.is_blocker(db.session, d)},
                           active="ui.messages")


def _can_redispatch(m) -> bool:
    return m.source != TEST_SOURCE and not (
        m.status in (MessageStatus.REFUSED, MessageStatus.COLLECTION_ERROR,
                     MessageStatus.CANCELLED) and not m.deliveries)


def _can_cancel(m) -> bool:
    return m.status == MessageStatus.NOT_ROUTED or any(
        d.state in operator.CANCELLABLE for d in m.deliveries)


class DeliveryActions:
    """Which delivery actions its state allows (the engine refuses the others too)."""

    redeliver = operator.REDELIVERABLE
    send_again = frozenset({DeliveryState.DELIVERED})
    cancel = operator.CANCELLABLE


@bp.post("/messages/<int:message_id>/<any(redispatch, cancel):action>")
@requires("operator")
def message_action(message_id: int, action: str):
    _act(operator.MESSAGE_ACTIONS[action], message_id)
    return redirect(url_for("ui.message", message_id=message_id))


@bp.post("/deliveries/<int:delivery_id>/<any(redeliver, 'send-again', cancel, resubmit, skip)"
         ":action>")
@requires("operator")
def delivery_action(delivery_id: int, action: str):
    delivery = db.session.get(Delivery, delivery_id)
    if delivery is None:
        abort(404, _("no delivery %(id)s", id=delivery_id))
    message_id = delivery.message_id
    _act(operator.DELIVERY_ACTIONS[action], delivery_id)
    return redirect(url_for("ui.message", message_id=message_id))


def _act(action, object_id: int) -> None:
    """Run an operator action as the logged-in user and say what happened."""
    if not ActionForm().validate_on_submit():
        abort(400, expired())
    try:
        result = action(db.session, object_id, g.actor, utcnow())
    except operator.UnknownObject as exc:
        db.session.rollback()
        abort(404, refusal(exc))
    except operator.ActionRefused as exc:
        db.session.rollback()
        flash(refusal(exc), "error")
        return
    db.session.commit()
    flash(result.text[:1].upper() + result.text[1:])


@bp.route("/messages/send", methods=["GET", "POST"])
@requires("operator")
def send_message():
    request.max_content_length = sending.MAX_BYTES + 1024 * 1024  # room for the form
    form = SendForm()
    parties = party_choices(any_party=False)
    form.from_party.choices = form.to_party.choices = [("", _("choose…"))] + parties
    form.target.choices = [("", _("(from the routes)"))] + [
        (n, n) for n in instance_names("target")]
    if form.validate_on_submit():
        upload = form.file.data
        try:
            found = sending.send_by_hand(
                db.session, hub.store(), hub.registry(), upload.stream,
                upload.filename or "", form.from_party.data, form.to_party.data,
                form.target.data or None, g.actor, utcnow())
        except ServiceError as exc:
            db.session.rollback()
            show_service_error(form, exc, {"from": "from_party", "to": "to_party"})
        else:
            db.session.commit()
            flash(_("Message %(id)s stored and sent to %(target)s", id=found.id,
                    target=found.deliveries[0].target)
                  if found.deliveries else _("Message %(id)s stored", id=found.id))
            return redirect(url_for("ui.message", message_id=found.id))
    status = 400 if form.errors or form.form_errors else 200
    return render_template("ui/send.html", form=form, active="ui.messages"), status
