"""Expected-message rules on the Alerts page: each rule's last windows, adding a rule
(admins), deleting one after a confirmation; the partner page shows the rules naming
the partner (:func:`rules_with_windows`)."""

from __future__ import annotations

from flask import abort, flash, g, redirect, url_for
from flask_babel import gettext as _
from flask_babel import lazy_gettext as _l
from flask_wtf import FlaskForm
from wtforms import IntegerField, SelectField, StringField
from wtforms.validators import Optional

from b2bhub.config.extensions import db
from b2bhub.domain.expected import DIRECTIONS
from b2bhub.models import utcnow
from b2bhub.services import expected as svc
from b2bhub.services.errors import ServiceError
from b2bhub.web.forms import ActionForm, show_service_error
from b2bhub.web.kit import ask_first, bp, expired, requires

#: a window's state as the pages say it
STATES = {"open": _l("open"), "met": _l("met"), "missed": _l("missed"), "late": _l("late")}
#: the service's field names -> the form's
ALIASES = {"from": "from_party", "to": "to_party", "after": "after_direction"}


class RuleForm(FlaskForm):
    name = StringField(_l("Name"), description=_l("1-64 of a-z 0-9 _ -"))
    description = StringField(_l("Description"))
    direction = SelectField(_l("Direction"), choices=[(d, d) for d in DIRECTIONS],
                            default="inbound")
    from_party = StringField(_l("From"), default="*", description=_l("a party or *"))
    to_party = StringField(_l("To"), default="*", description=_l("a party or *"))
    source = StringField(_l("Source instance"), description=_l("optional"))
    target = StringField(_l("Target instance"), description=_l("optional"))
    filename = StringField(_l("File name"), default="*",
                           description=_l("a glob: INV-*.csv; * for any"))
    document_type = StringField(_l("Document type"), default="*",
                                description=_l("850, ORDERS...; * for any"))
    schedule = StringField(_l("Schedule (cron)"), description=_l(
        "each time ends a window: 0 6 * * 1-5 is by 06:00 Monday to Friday"))
    timezone = StringField(_l("Time zone"), default="UTC",
                           description=_l("of the schedule: Europe/Berlin"))
    opens_minutes = IntegerField(_l("Window opens (minutes before its end)"),
                                 validators=[Optional()], description=_l(
                                     "empty: at the schedule's previous time"))
    after_direction = SelectField(_l("Or: after each message of direction"),
                                  choices=[("", "—")] + [(d, d) for d in DIRECTIONS],
                                  default="")
    after_document_type = StringField(_l("of document type"), default="*")
    after_filename = StringField(_l("with file name"), default="*")
    within_minutes = IntegerField(_l("within (minutes)"), validators=[Optional()])


def rule_data(form: RuleForm) -> dict:
    """The form as the service takes a rule: a schedule, or a relation when a
    direction is chosen under "after"."""
    data = {"name": form.name.data, "description": form.description.data,
            "direction": form.direction.data, "from": form.from_party.data or "*",
            "to": form.to_party.data or "*", "source": form.source.data,
            "target": form.target.data, "filename": form.filename.data,
            "document_type": form.document_type.data}
    if form.after_direction.data:
        data["after"] = {"direction": form.after_direction.data,
                         "document_type": form.after_document_type.data or "*",
                         "filename": form.after_filename.data or "*"}
        data["within_minutes"] = form.within_minutes.data
    else:
        data.update(schedule=form.schedule.data or None, timezone=form.timezone.data,
                    opens_minutes=form.opens_minutes.data)
    return data


def rules_with_windows(party: str | None = None) -> list[tuple]:
    """(rule, its text, its last windows) of every rule, or of those naming ``party``."""
    found = svc.list_rules(db.session, party)
    windows = svc.last_windows(db.session, [r.id for r in found])
    return [(rule, svc.describe(rule), windows[rule.id]) for rule in found]


def create_rule(form: RuleForm) -> bool:
    """Save the posted rule; False (the errors on the form) when refused."""
    if not form.validate_on_submit():
        return False
    try:
        rule = svc.create_rule(db.session, rule_data(form), g.actor, utcnow())
    except ServiceError as exc:
        db.session.rollback()
        show_service_error(form, exc, ALIASES)
        return False
    db.session.commit()
    flash(_("Created expected-message rule %(name)s", name=rule.name))
    return True


@bp.route("/alerts/expected/<name>/delete", methods=["GET", "POST"])
@requires("admin")
def delete_expected_rule(name: str):
    """Asks for confirmation first."""
    try:
        svc.get_rule(db.session, name)
    except ServiceError as exc:
        abort(404, exc.message)
    ask_first(_("Delete expected-message rule %(name)s?", name=name),
              _("Its windows go with it and its open alerts are resolved."),
              url_for("ui.alerts"), active="ui.alerts")
    if not ActionForm().validate_on_submit():
        abort(400, expired())
    svc.delete_rule(db.session, name, g.actor, utcnow())
    db.session.commit()
    flash(_("Deleted expected-message rule %(name)s", name=name))
    return redirect(url_for("ui.alerts"))
