"""Parties: organizations and partners (AS2 profiles come with the AS2 plugins)."""

from __future__ import annotations

from flask import abort, redirect, render_template, url_for

from b2bhub.extensions import db
from b2bhub.models import ORGANIZATION, PARTNER
from b2bhub.services import config as svc
from b2bhub.services.errors import ServiceError
from b2bhub.web import bp, button, form_status, submit
from b2bhub.web.forms import ActionForm, PartyForm

KINDS = {"organization": ORGANIZATION, "partner": PARTNER}


def _forms(posted: str | None = None) -> dict[str, PartyForm]:
    """One create form per kind; only the one posted reads the request."""
    return {kind: PartyForm(prefix=kind) if kind == posted else
            PartyForm(prefix=kind, formdata=None) for kind in KINDS}


def _page(forms: dict, status: int = 200):
    lists = {kind: svc.list_parties(db.session, kind, 1000).items for kind in KINDS}
    return render_template("ui/parties.html", lists=lists, forms=forms,
                           action=ActionForm()), status


@bp.get("/parties")
def parties():
    return _page(_forms())


@bp.post("/parties/<any(organization, partner):kind>")
def create_party(kind: str):
    forms = _forms(kind)
    form = forms[kind]
    if form.validate_on_submit() and submit(
            form, lambda: svc.create_party(db.session, kind, (form.name.data or "").strip(),
                                           form.display_name.data or ""),
            lambda party: f"created {kind} {party.name}"):
        return redirect(url_for("ui.parties"))
    return _page(forms, 400)


@bp.route("/parties/<any(organization, partner):kind>/<name>", methods=["GET", "POST"])
def edit_party(kind: str, name: str):
    try:
        party = svc.get_party(db.session, kind, name)
    except ServiceError as exc:
        abort(404, exc.message)
    form = PartyForm(data={"name": party.name, "display_name": party.display_name})
    form.name.render_kw = {"readonly": True}
    if form.validate_on_submit() and submit(
            form, lambda: svc.update_party(db.session, kind, name, form.display_name.data or ""),
            lambda _party: f"changed {kind} {name}"):
        return redirect(url_for("ui.parties"))
    return render_template("ui/party_form.html", form=form, party=party,
                           active="ui.parties"), form_status(form)


@bp.post("/parties/<any(organization, partner):kind>/<name>/delete")
def delete_party(kind: str, name: str):
    button(lambda: svc.delete_party(db.session, kind, name),
           lambda _none: f"deleted {kind} {name}")
    return redirect(url_for("ui.parties"))
