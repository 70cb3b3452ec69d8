"""Alerts: the open ones; acknowledge names the user. Below them the expected-message
rules with their last windows, and (admins) the form to add one."""

from __future__ import annotations

from flask import g, redirect, render_template, url_for
from flask_babel import lazy_gettext as _l

from b2bhub.config.extensions import db
from b2bhub.models import utcnow
from b2bhub.services import alerts as svc
from b2bhub.web import expected
from b2bhub.web.forms import ActionForm
from b2bhub.web.kit import bp, button, form_status, requires


@bp.get("/alerts")
def alerts(rule_form: expected.RuleForm | None = None):
    rule_form = rule_form or expected.RuleForm(formdata=None)
    return render_template("ui/alerts.html", alerts=svc.open_alerts(db.session),
                           form=ActionForm(), rule_form=rule_form,
                           rules=expected.rules_with_windows(),
                           window_states=expected.STATES), form_status(rule_form)


@bp.post("/alerts/expected")
@requires("admin")
def add_expected_rule():
    """The rule form's POST: back to the Alerts page, or the page again with the
    refusal beside its fields (400)."""
    form = expected.RuleForm()
    if expected.create_rule(form):
        return redirect(url_for("ui.alerts"))
    return alerts(form)


@bp.post("/alerts/<int:alert_id>/acknowledge")
@requires("operator")
def acknowledge_alert(alert_id: int):
    button(lambda: svc.acknowledge(db.session, alert_id, g.actor, utcnow()),
           lambda _alert: _l("alert %(id)s acknowledged", id=alert_id), record=False)
    return redirect(url_for("ui.alerts"))
