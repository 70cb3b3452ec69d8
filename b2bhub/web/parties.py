"""Parties: organizations and partners, and each party's AS2 profile with its
certificate (uploaded as files: PEM, DER or PKCS#12 with its password)."""

from __future__ import annotations

from flask import abort, redirect, render_template, url_for
from sqlalchemy import select

from b2bhub.extensions import db
from b2bhub.models import ORGANIZATION, PARTNER, ProtocolProfile, utcnow
from b2bhub.services import config as svc
from b2bhub.services.errors import NotFound, ServiceError
from b2bhub.web import bp, button, form_status, submit
from b2bhub.web.forms import ActionForm, PartyForm, as2_profile_data, as2_profile_form
from plugins.as2 import profiles

KINDS = {"organization": ORGANIZATION, "partner": PARTNER}


def _forms(posted: str | None = None) -> dict[str, PartyForm]:
    """One create form per kind; only the one posted reads the request."""
    return {kind: PartyForm(prefix=kind) if kind == posted else
            PartyForm(prefix=kind, formdata=None) for kind in KINDS}


def _page(forms: dict, status: int = 200):
    lists = {kind: svc.list_parties(db.session, kind, 1000).items for kind in KINDS}
    as2_ids = dict(db.session.execute(select(ProtocolProfile.party_id, ProtocolProfile.address)
                                      .where(ProtocolProfile.protocol == profiles.PROTOCOL)).all())
    return render_template("ui/parties.html", lists=lists, forms=forms, as2_ids=as2_ids,
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


# --- AS2 profile ------------------------------------------------------------------------

def _save_as2(kind: str, name: str, form) -> tuple:
    data = as2_profile_data(form)
    return profiles.save_profile(db.session, kind, name, data), "certificate" in data


def _saved(kind: str, name: str, created: bool, profile, new_cert: bool) -> str:
    """The history line of a saved profile; it names a newly uploaded certificate."""
    text = (f"{'created' if created else 'changed'} the AS2 profile of {kind} {name} "
            f"(AS2 ID {profile.address})")
    if new_cert:
        cert = profile.certificates[0]
        text += f" with the certificate {cert.subject} valid until {cert.not_after:%Y-%m-%d}"
    return text


@bp.route("/parties/<any(organization, partner):kind>/<name>/as2", methods=["GET", "POST"])
def as2_profile(kind: str, name: str):
    """The profile as the API shows it; admins edit it on the same page. A POST saves
    the whole form (choices as shown, the certificate only when a file is chosen)."""
    try:
        party = svc.get_party(db.session, kind, name)
    except ServiceError as exc:
        abort(404, exc.message)
    try:
        shown = profiles.profile_json(profiles.get_profile(db.session, kind, name), utcnow())
    except NotFound:
        shown = None
    defaults = {choice: default for choice, (default, _check) in profiles.CHOICES.items()}
    form = as2_profile_form(kind, shown or defaults)
    if form.validate_on_submit() and submit(
            form, lambda: _save_as2(kind, name, form),
            lambda saved: _saved(kind, name, shown is None, *saved),
            aliases={"certificate": "certificate_file"}):
        return redirect(url_for("ui.as2_profile", kind=kind, name=name))
    return render_template("ui/as2_profile.html", party=party, profile=shown, form=form,
                           warning_days=profiles.EXPIRY_WARNING.days,
                           active="ui.parties"), form_status(form)


@bp.post("/parties/<any(organization, partner):kind>/<name>/as2/delete")
def delete_as2_profile(kind: str, name: str):
    button(lambda: profiles.delete_profile(db.session, kind, name),
           lambda _none: f"deleted the AS2 profile of {kind} {name}")
    return redirect(url_for("ui.as2_profile", kind=kind, name=name))
