"""System > Services, System > Settings and Logs."""

from __future__ import annotations

from flask import redirect, render_template, url_for

from b2bhub.engine.settings import DeliverySettings, load_settings, save_settings
from b2bhub.extensions import db
from b2bhub.services import config as config_svc
from b2bhub.services.settings import settings_as_text, settings_from_text
from b2bhub.web import bp, form_status, submit
from b2bhub.web.forms import ActionForm, SettingsForm


@bp.get("/system/services")
def services():
    return render_template("ui/services.html", form=ActionForm(),
                           instances=config_svc.list_instances(db.session, 1000).items)


@bp.route("/system/settings", methods=["GET", "POST"])
def settings():
    current = load_settings(db.session)
    form = SettingsForm(data=settings_as_text(current))
    if form.validate_on_submit() and submit(form, lambda: _save(form, current), _changed):
        return redirect(url_for("ui.settings"))
    return render_template("ui/settings.html", form=form), form_status(form)


def _save(form: SettingsForm, current: DeliverySettings) -> tuple[dict, dict]:
    new = settings_from_text({f.name: f.data for f in form}, current)
    save_settings(db.session, new)
    return current.to_dict(), new.to_dict()


def _changed(old_new: tuple[dict, dict]) -> str:
    old, new = old_new
    changed = sorted(key for key, value in new.items() if old[key] != value)
    return "changed delivery settings: " + (", ".join(changed) or "nothing")


@bp.get("/logs")
def logs():
    return render_template("ui/logs.html")
