"""Delivery Errors: failed, business-error and stalled deliveries; bulk Redeliver of the
selected ones or of every one the filter matches."""

from __future__ import annotations

from flask import abort, flash, g, redirect, render_template, request, url_for
from flask_babel import gettext as _
from flask_babel import ngettext

from b2bhub.config.extensions import db
from b2bhub.models import utcnow
from b2bhub.services import delivery_errors as svc
from b2bhub.services.errors import ServiceError
from b2bhub.web.choices import instance_names, party_choices
from b2bhub.web.forms import BulkRedeliverForm, refusal
from b2bhub.web.kit import ask_first, bp, expired, requires
from b2bhub.web.messages import ui_time

PAGE_SIZE = 100
FILTER_ARGS = ("target", "partner", "kind", "since", "until")


def _filter(args) -> tuple[svc.ErrorFilter, dict]:
    errors: dict[str, str] = {}
    f = svc.ErrorFilter(target=args.get("target") or None,
                        partner=args.get("partner") or None,
                        kinds=[k for k in args.getlist("kind") if k] or None,
                        since=ui_time(args, "since", errors),
                        until=ui_time(args, "until", errors))
    return f, errors


@bp.get("/delivery-errors")
def delivery_errors():
    f, errors = _filter(request.args)
    try:
        page = svc.list_errors(db.session, f, PAGE_SIZE, request.args.get("after", type=int))
        total = svc.count_errors(db.session, f)
    except ServiceError as exc:
        errors["kind"] = refusal(exc)
        f.kinds = None
        page, total = svc.list_errors(db.session, f, PAGE_SIZE), svc.count_errors(db.session, f)
    args = {k: request.args.getlist(k) for k in FILTER_ARGS if request.args.get(k)}
    return render_template("ui/delivery_errors.html", page=page, total=total, args=args,
                           errors=errors, kinds=list(svc.KINDS), form=BulkRedeliverForm(),
                           collection_errors=svc.count_collection_errors(db.session),
                           targets=instance_names("target"),
                           partners=[p for p in party_choices(any_party=False)])


@bp.post("/delivery-errors/redeliver")
@requires("operator")
def redeliver_errors():
    form = BulkRedeliverForm()
    if not form.validate_on_submit():
        abort(400, expired())
    f, errors = _filter(request.form)
    ids = None if form.all_matching.data else [
        int(i) for i in request.form.getlist("delivery") if i.isdigit()]
    args = {k: request.form.getlist(k) for k in FILTER_ARGS if request.form.get(k)}
    if errors or ids == []:
        flash("; ".join(errors.values()) or _("Select deliveries to redeliver, or all "
                                              "matching."), "error")
        return redirect(url_for("ui.delivery_errors", **args))
    _confirm_redeliver(f, ids, url_for("ui.delivery_errors", **args))
    try:
        result = svc.redeliver_errors(db.session, f, ids, g.actor, utcnow())
    except ServiceError as exc:
        db.session.rollback()
        flash(refusal(exc), "error")
    else:
        db.session.commit()
        done, skipped = len(result.redelivered), len(result.skipped)
        flash(ngettext("%(num)s delivery queued again", "%(num)s deliveries queued again",
                       done)
              + (ngettext("; %(num)s had changed meanwhile and was left as it is",
                          "; %(num)s had changed meanwhile and were left as they are",
                          skipped) if skipped else "")
              + (_(" (at most %(limit)s at once; run it again for the rest)",
                   limit=svc.BULK_LIMIT) if result.more else ""))
    return redirect(url_for("ui.delivery_errors", **args))


def _confirm_redeliver(f: svc.ErrorFilter, ids: list[int] | None, back: str) -> None:
    if ids is None:
        try:
            count = svc.count_errors(db.session, f)
        except ServiceError:
            count = 0
        question = ngettext("Redeliver all %(num)s delivery matching the filter?",
                            "Redeliver all %(num)s deliveries matching the filter?", count)
    else:
        question = ngettext("Redeliver the %(num)s selected delivery?",
                            "Redeliver the %(num)s selected deliveries?", len(ids))
    ask_first(question,
              _("Each is queued again for a new attempt, in the name of %(user)s (at most "
                "%(limit)s at once); one that changed meanwhile is left as it is.",
                user=g.actor, limit=svc.BULK_LIMIT), back, confirm=_("Redeliver"),
              active="ui.delivery_errors")
