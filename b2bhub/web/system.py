"""System > Services, System > Settings, Logs and the storage report."""

from __future__ import annotations

from datetime import timedelta

from flask import abort, g, redirect, render_template, request, url_for
from flask_babel import gettext as _
from flask_babel import lazy_gettext as _l

from b2bhub.config.extensions import db
from b2bhub.engine import blocking, instances, presence
from b2bhub.engine.cleanup import latest_runs
from b2bhub.engine.settings import DeliverySettings, load_settings, save_settings
from b2bhub.models import utcnow
from b2bhub.services import config as config_svc
from b2bhub.services.settings import settings_as_text, settings_from_text
from b2bhub.services.storage import storage_report
from b2bhub.web.forms import ActionForm, SettingsForm
from b2bhub.web.kit import bp, button, form_status, submit


@bp.get("/system/services")
def services():
    now = utcnow()
    rows = presence.list_processes(db.session, now,
                                   include_stopped=request.args.get("all") == "true")
    return render_template("ui/services.html", form=ActionForm(),
                           processes=[(p, presence.process_state(p, now)) for p in rows],
                           instances=config_svc.list_instances(db.session, 1000).items,
                           blocked=blocking.blocked_instances(db.session),
                           cleanup_runs=latest_runs(db.session),
                           cleanup_time=load_settings(db.session).cleanup_time)


@bp.post("/system/instances/<name>/<any(start, stop):action>")
def start_stop_instance(name: str, action: str):
    act = instances.start_instance if action == "start" else instances.stop_instance
    button(lambda: act(db.session, name, g.actor, utcnow()), str, record=False)
    return redirect(url_for("ui.services"))


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
    if not changed:
        return _l("changed delivery settings: nothing")
    return _l("changed delivery settings: %(names)s", names=", ".join(changed))


LEVELS = ("debug", "info", "warning", "error", "critical")


@bp.get("/logs")
def logs():
    """Newest first; the page then tails ``/api/v1/logs/stream`` with the same filters."""
    level = request.args.get("level") or "info"
    if level not in LEVELS:
        abort(400, _("level must be one of %(levels)s", levels=", ".join(LEVELS)))
    process = request.args.get("process") or None
    filters = presence.LogFilter(min_level=presence.level_number(level), process=process)
    records = presence.list_log_records(db.session, filters, 200).items
    since = (utcnow() - timedelta(days=30)).strftime("%Y-%m-%dT%H:%M")
    return render_template("ui/logs.html", records=records, levels=LEVELS, level=level,
                           process=process or "", audit_since=since)


@bp.get("/storage")
def storage():
    """The storage report (SPEC 13); the same figures as ``GET /api/v1/storage``."""
    report = storage_report(db.session, utcnow(), fresh=request.args.get("fresh") == "true")
    return render_template("ui/storage.html", report=report)
