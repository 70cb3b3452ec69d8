"""System > Settings > Notifications: the alert notification channels, adding one,
deleting one (after a confirmation), sending a test, and the latest notifications."""

from __future__ import annotations

from flask import abort, flash, g, redirect, render_template, request, url_for
from flask_babel import gettext as _
from flask_babel import lazy_gettext as _l
from flask_wtf import FlaskForm
from wtforms import BooleanField, SelectMultipleField, StringField
from wtforms.widgets import CheckboxInput, ListWidget

from b2bhub.config.extensions import db
from b2bhub.models import utcnow
from b2bhub.services import notifications as svc
from b2bhub.services.errors import ServiceError
from b2bhub.web.forms import ActionForm, refusal, show_service_error
from b2bhub.web.kit import ask_first, bp, expired, form_status, requires


class ChannelForm(FlaskForm):
    name = StringField(_l("Name"), description=_l("1-64 of a-z 0-9 _ -"))
    url = StringField(_l("Apprise URL"), description=(
        _l("mailto://user:password@smtp.example.com?to=ops@example.com, "
        "json://hooks.example.com/b2bhub, slack://..., msteams://...")))
    kinds = SelectMultipleField(
        _l("Alert kinds"), choices=[(k, k.replace("_", " ")) for k in svc.ALERT_KINDS],
        option_widget=CheckboxInput(), widget=ListWidget(prefix_label=False),
        description=_l("none ticked: every kind"))
    on_resolve = BooleanField(_l("Also when an alert resolves"))


@bp.route("/system/notifications", methods=["GET", "POST"])
def notifications():
    form = ChannelForm()
    if request.method == "POST":
        if form.validate_on_submit():
            try:
                channel = svc.create_channel(db.session, {
                    "name": form.name.data, "url": form.url.data, "kinds": form.kinds.data,
                    "on_resolve": form.on_resolve.data}, g.actor, utcnow())
            except ServiceError as exc:
                db.session.rollback()
                show_service_error(form, exc)
            else:
                db.session.commit()
                flash(_("Created notification channel %(name)s", name=channel.name))
                return redirect(url_for("ui.notifications"))
    return render_template("ui/notifications.html", form=form, action=ActionForm(),
                           channels=[svc.channel_shape(c) for c in svc.list_channels(
                               db.session)],
                           recent=svc.recent(db.session), active="ui.settings"), \
        form_status(form)


@bp.route("/system/notifications/<name>/delete", methods=["GET", "POST"])
@requires("admin")
def delete_channel(name: str):
    """Asks for confirmation first (:func:`~b2bhub.web.confirmation`)."""
    channel = svc.channel_shape(_channel_or_404(name))
    ask_first(_("Delete notification channel %(name)s (%(url)s)?", name=name,
                url=channel["url"]),
              _("Its pending notifications are dropped; alerts then reach only "
                "the other channels."), url_for("ui.notifications"),
              active="ui.settings")
    _check_form()
    svc.delete_channel(db.session, name, g.actor, utcnow())
    db.session.commit()
    flash(_("Deleted notification channel %(name)s", name=name))
    return redirect(url_for("ui.notifications"))


@bp.post("/system/notifications/<name>/test")
def test_channel(name: str):
    _check_form()
    _channel_or_404(name)
    error = svc.test_channel(db.session, name, g.actor, utcnow())
    db.session.commit()
    if error is None:
        flash(_("Sent a test notification to %(name)s", name=name))
    else:
        flash(_("The test notification to %(name)s failed: %(error)s", name=name,
                error=error), "error")
    return redirect(url_for("ui.notifications"))


def _channel_or_404(name: str):
    try:
        return svc.get_channel(db.session, name)
    except ServiceError as exc:
        abort(404, refusal(exc))


def _check_form() -> None:
    if not ActionForm().validate_on_submit():
        abort(400, expired())
