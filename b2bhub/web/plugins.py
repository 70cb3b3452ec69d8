"""Plugins: instances by type, forms drawn from each type's config schema, enable and
disable."""

from __future__ import annotations

import json

from flask import abort, flash, g, redirect, render_template, request, url_for
from flask_babel import gettext as _
from flask_babel import lazy_gettext as _l

from b2bhub.api.shapes import instance_json
from b2bhub.config.extensions import db
from b2bhub.engine import blocking
from b2bhub.runtime import hub
from b2bhub.services import config as svc
from b2bhub.services.config import SECRET_MASK
from b2bhub.services.errors import ServiceError
from b2bhub.web.forms import ActionForm, instance_form, refusal, save_instance_form
from b2bhub.web.kit import ask_first, bp, button, form_status, requires, submit


@bp.get("/plugins")
def plugins():
    rows = svc.list_instances(db.session, 1000).items
    types = hub.registry().types()
    by_type = {name: [r for r in rows if r.type == name] for name in types}
    unknown = [r for r in rows if r.type not in types]
    shown = {r.name: shown_config(types[r.type].config_schema, r.config or {})
             for r in rows if r.type in types}
    return render_template("ui/plugins.html", types=types, by_type=by_type, unknown=unknown,
                           form=ActionForm(), blocked=blocking.blocked_instances(db.session),
                           shown=shown)


def shown_config(schema: list, config: dict) -> list[tuple[str, str]]:
    """An instance's configuration as people read it: each field by its label, yes/no
    for a box, a secret masked; a box left off by default and empty values are left
    out."""
    shown = []
    for field in schema:
        value = config.get(field.name)
        if value in (None, "", {}, []) or (field.type == "boolean" and not value
                                            and not field.default):
            continue
        if field.type == "boolean":
            text = _("yes") if value else _("no")
        elif field.type == "secret":
            text = SECRET_MASK
        elif field.type == "json":
            text = json.dumps(value, separators=(", ", ": "))
        else:
            text = str(value)
        shown.append((_(field.title), text))
    return shown


def _plugin_class(type_name: str) -> type:
    if type_name not in hub.registry():
        abort(404, _("no plugin type %(type)r is installed", type=type_name))
    return hub.registry().get(type_name)


@bp.route("/plugins/new/<type_name>", methods=["GET", "POST"])
@bp.route("/plugins/<name>/edit", methods=["GET", "POST"])
def edit_instance(type_name: str | None = None, name: str | None = None):
    row = None
    if name is not None:
        try:
            row = svc.get_instance(db.session, name)
        except ServiceError as exc:
            abort(404, refusal(exc))
        type_name = row.type
    plugin_cls = _plugin_class(type_name)
    form = instance_form(plugin_cls, instance_json(row, hub.registry()) if row else None)
    if row is not None:
        form.name.render_kw = {"readonly": True}
    if form.validate_on_submit() and submit(
            form, lambda: save_instance_form(form, plugin_cls, lambda data: svc.save_instance(
                db.session, hub.registry(), data, row, actor=g.actor)),
            lambda saved: (_l("created %(type)s instance %(name)s", type=saved.type,
                              name=saved.name) if row is None else
                           _l("changed %(type)s instance %(name)s", type=saved.type,
                              name=saved.name))):
        return redirect(url_for("ui.plugins"))
    return render_template("ui/plugin_form.html", form=form, row=row, plugin_cls=plugin_cls,
                           active="ui.plugins"), form_status(form)


@bp.post("/plugins/<name>/<any(enable, disable):action>")
def instance_action(name: str, action: str):
    def change() -> None:
        row = svc.get_instance(db.session, name)
        svc.save_instance(db.session, hub.registry(), {
            "enabled": action == "enable", "config": dict(row.config or {})}, row)
    button(change, lambda _none: _l("enabled instance %(name)s", name=name)
           if action == "enable" else _l("disabled instance %(name)s", name=name))
    return redirect(url_for("ui.plugins"))


@bp.post("/plugins/<name>/actions/<action>")
@requires("admin")
def run_instance_action(name: str, action: str):
    """A button of a type's ``instance_actions`` on the instance's page: the form's
    fields (but the token) are its body. Its answer is shown on a page of its own with
    the follow-up it offers (pinning a host key just fetched) as a button."""
    if not ActionForm().validate_on_submit():
        abort(400, "the form expired or was not sent from this site; reload and try again")
    body = {key: value for key, value in request.form.items()
            if key != "csrf_token" and value != ""}
    back = url_for("ui.edit_instance", name=name)
    try:
        result = svc.run_instance_action(db.session, hub.registry(), name, action, body,
                                         g.actor)
    except ServiceError as exc:
        db.session.rollback()
        flash(refusal(exc), "error")
        return redirect(back)
    db.session.commit()
    flash(result.text[:1].upper() + result.text[1:])
    if result.confirm is None:
        return redirect(back)
    return render_template("ui/instance_action.html", name=name, action=action,
                           result=result, form=ActionForm(), back=back,
                           active="ui.plugins")


@bp.route("/plugins/<name>/delete", methods=["GET", "POST"])
@requires("admin")
def delete_instance(name: str):
    try:
        row = svc.get_instance(db.session, name)
    except ServiceError as exc:
        abort(404, refusal(exc))
    ask_first(_("Delete %(type)s instance %(name)s?", type=row.type, name=name),
              _("Its configuration is gone for good; routes that name it must go "
                "first, and its messages and their history stay."),
              url_for("ui.plugins"), active="ui.plugins")
    button(lambda: svc.delete_instance(db.session, name),
           lambda _none: _l("deleted instance %(name)s", name=name))
    return redirect(url_for("ui.plugins"))
