"""Routes: the list, create, edit, delete (the API's validations) and the route tester."""

from __future__ import annotations

from flask import abort, g, redirect, render_template, request, url_for
from flask_babel import LazyString
from flask_babel import gettext as _
from flask_babel import lazy_gettext as _l

from b2bhub.config.extensions import db
from b2bhub.domain import routing
from b2bhub.domain.routing import ANY
from b2bhub.models import Route
from b2bhub.runtime import hub
from b2bhub.services import config as svc
from b2bhub.services.errors import ServiceError
from b2bhub.web.choices import instance_names, party_choices
from b2bhub.web.forms import ActionForm, RouteForm, refusal, said
from b2bhub.web.kit import ask_first, bp, button, form_status, requires, submit

ALIASES = {"from": "from_party", "to": "to_party"}


@bp.get("/routes")
def routes():
    rows = svc.list_routes(db.session, 1000).items
    tested = None
    source = request.args.get("test_source")
    if source:
        types = request.args.get("test_types", "").replace(",", " ").split()
        try:
            tested = svc.test_route(db.session, source, request.args.get("test_from") or ANY,
                                    request.args.get("test_to") or ANY, types)
        except ServiceError as exc:
            tested = {"error": refusal(exc)}
    return render_template("ui/routes.html", routes=rows, tested=tested, form=ActionForm(),
                           sources=instance_names("source"), parties=party_choices())


def _route_form(route: Route | None = None) -> RouteForm:
    data = {}
    if route is not None:
        data = {"source": route.source, "from_party": route.from_party,
                "to_party": route.to_party, "target": route.target,
                "document_type": route.document_type}
    form = RouteForm(data=data)
    form.source.choices = [("", _("choose…"))] + [(n, n) for n in instance_names("source")]
    form.target.choices = [("", _("choose…"))] + [(n, n) for n in instance_names("target")]
    form.from_party.choices = form.to_party.choices = party_choices()
    return form


@bp.route("/routes/new", methods=["GET", "POST"])
@bp.route("/routes/<int:route_id>/edit", methods=["GET", "POST"])
def edit_route(route_id: int | None = None):
    route = db.session.get(Route, route_id) if route_id is not None else None
    if route_id is not None and route is None:
        abort(404, _("no route %(id)s", id=route_id))
    form = _route_form(route)
    if form.validate_on_submit():
        values = (form.source.data, form.from_party.data or ANY, form.to_party.data or ANY,
                  form.target.data)
        kind = (form.document_type.data or "").strip() or ANY
        if route is None:
            saved = submit(form, lambda: svc.create_route(
                db.session, hub.registry(), *values, actor=g.actor, document_type=kind),
                lambda new: _l("saved %(route)s", route=_describe(new)), ALIASES)
        else:
            saved = submit(form, lambda: svc.replace_route(
                db.session, hub.registry(), route.id, *values, actor=g.actor,
                document_type=kind),
                lambda new: _l("replaced route %(id)s by %(route)s", id=route_id,
                               route=_describe(new)), ALIASES)
        if saved:
            return redirect(url_for("ui.routes"))
    return render_template("ui/route_form.html", form=form, route=route,
                           active="ui.routes"), form_status(form)


def _describe(route: Route) -> LazyString:
    """The route's description in the language of where it is put: the reader's on the
    page, English in the history line (b2bhub.web.kit.record_change)."""
    text = routing.Route(route.id, route.source, route.from_party, route.to_party,
                         route.target, route.document_type).describe()
    return LazyString(said, text)


@bp.route("/routes/<int:route_id>/delete", methods=["GET", "POST"])
@requires("admin")
def delete_route(route_id: int):
    route = db.session.get(Route, route_id)
    if route is None:
        abort(404, _("no route %(id)s", id=route_id))
    ask_first(_("Delete %(route)s?", route=_describe(route)),
              _("Messages it would route afterwards are Not routed unless "
                "another route matches them."), url_for("ui.routes"),
              active="ui.routes")
    button(lambda: svc.delete_route(db.session, route_id),
           lambda _none: _l("deleted route %(id)s", id=route_id))
    return redirect(url_for("ui.routes"))
