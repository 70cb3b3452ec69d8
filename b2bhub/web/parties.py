"""Parties: organizations and partners, and each party's profiles of the kinds plugins
add (a protocol's page of its own, or one drawn from the kind's schema)."""

from __future__ import annotations

from flask import abort, flash, g, redirect, render_template, request, url_for
from flask_babel import gettext as _
from flask_babel import lazy_gettext as _l
from sqlalchemy import select

from b2bhub.config.extensions import db
from b2bhub.domain.scorecard import PERIODS
from b2bhub.models import ORGANIZATION, PARTNER, Party, utcnow
from b2bhub.runtime import hub
from b2bhub.services import config as svc
from b2bhub.services import partner
from b2bhub.services import scorecard as scorecards
from b2bhub.services.errors import NotFound, ServiceError
from b2bhub.services.profiles import (
    addresses,
    ending_certificates,
    profile_kind,
    profile_kinds,
    run_connection_test,
)
from b2bhub.web import expected
from b2bhub.web.forms import ActionForm, PartyForm, form_config, plugin_config_form, refusal
from b2bhub.web.kit import ask_first, bp, button, expired, form_status, requires, submit

KINDS = {"organization": ORGANIZATION, "partner": PARTNER}
#: a party's change as its history line and flash say it, by kind (each its own
#: msgid: the words around a kind agree with it in other languages)
CREATED = {ORGANIZATION: lambda **v: _l("created organization %(name)s", **v),
           PARTNER: lambda **v: _l("created partner %(name)s", **v)}
CHANGED = {ORGANIZATION: lambda **v: _l("changed organization %(name)s", **v),
           PARTNER: lambda **v: _l("changed partner %(name)s", **v)}
DELETED = {ORGANIZATION: lambda **v: _l("deleted organization %(name)s", **v),
           PARTNER: lambda **v: _l("deleted partner %(name)s", **v)}


def _forms(posted: str | None = None) -> dict[str, PartyForm]:
    """One create form per kind; only the one posted reads the request."""
    return {kind: PartyForm(prefix=kind) if kind == posted else
            PartyForm(prefix=kind, formdata=None) for kind in KINDS}


def _page(forms: dict, status: int = 200):
    lists = {kind: svc.list_parties(db.session, kind, 1000).items for kind in KINDS}
    kinds = profile_kinds(hub.registry())
    ending: dict = {}
    for cert in ending_certificates(db.session, utcnow()):
        ending.setdefault((cert.party_id, cert.protocol), []).append(cert)
    return render_template("ui/parties.html", lists=lists, forms=forms, kinds=kinds,
                           shown=addresses(db.session, kinds), action=ActionForm(),
                           ending=ending), status


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
            lambda party: CREATED[kind](name=party.name)):
        return redirect(url_for("ui.parties"))
    return _page(forms, 400)


@bp.route("/parties/<any(organization, partner):kind>/<name>", methods=["GET", "POST"])
def edit_party(kind: str, name: str):
    try:
        party = svc.get_party(db.session, kind, name)
    except ServiceError as exc:
        abort(404, refusal(exc))
    form = PartyForm(data={"name": party.name, "display_name": party.display_name,
                           "edi_identities": "\n".join(party.edi_identities),
                           "functional_acks": party.functional_acks,
                           "ack_hours": "" if party.ack_hours is None else party.ack_hours})
    form.name.render_kw = {"readonly": True}
    if form.validate_on_submit() and submit(
            form, lambda: svc.update_party(
                db.session, kind, name, form.display_name.data or "",
                _lines(form.edi_identities.data), actor=g.actor,
                acks={"functional_acks": form.functional_acks.data,
                      "ack_hours": _hours(form.ack_hours.data)}),
            lambda _party: CHANGED[kind](name=name)):
        return redirect(url_for("ui.parties"))
    return render_template("ui/party_form.html", form=form, party=party,
                           active="ui.parties"), form_status(form)


def _hours(text: str | None) -> int | str | None:
    """The hours a field holds: None when blank, the text itself (refused by the
    service, beside the field) when not a whole number."""
    text = (text or "").strip()
    return None if not text else int(text) if text.isdigit() else text


def _lines(text: str | None) -> list[str]:
    """The identities a text area holds, one per line, blank lines left out."""
    return [line.strip() for line in (text or "").splitlines() if line.strip()]


@bp.route("/parties/<any(organization, partner):kind>/<name>/delete",
          methods=["GET", "POST"])
@requires("admin")
def delete_party(kind: str, name: str):
    try:
        svc.get_party(db.session, kind, name)
    except ServiceError as exc:
        abort(404, refusal(exc))
    ask_first(_("Delete organization %(name)s?", name=name) if kind == ORGANIZATION
              else _("Delete partner %(name)s?", name=name),
              _("Its profiles go with it; routes that name it must go first, and "
                "its messages and their history stay."), url_for("ui.parties"),
              active="ui.parties")
    button(lambda: svc.delete_party(db.session, kind, name),
           lambda _none: DELETED[kind](name=name))
    return redirect(url_for("ui.parties"))


# --- party profiles of the kinds plugins add --------------------------------------------

def _kind_or_404(protocol: str):
    try:
        return profile_kind(hub.registry(), protocol)
    except NotFound as exc:
        abort(404, refusal(exc))


@bp.route("/parties/<any(organization, partner):kind>/<name>/<protocol>",
          methods=["GET", "POST"])
def profile(kind: str, name: str, protocol: str):
    """A party's profile of a plugin's kind: the kind draws its page (``ui_page``) or
    the core shows the stored profile and a form from the kind's schema."""
    found = _kind_or_404(protocol)
    try:
        party = svc.get_party(db.session, kind, name)
    except ServiceError as exc:
        abort(404, refusal(exc))
    try:
        shown = found.get(db.session, kind, name)
    except NotFound:
        shown = None
    page = getattr(found, "ui_page", None)
    if page is not None:
        return page(party, shown)
    return _schema_page(found, party, shown)


def _schema_page(found, party, shown):
    """The page of a kind without its own: its fields, secrets blank, from its schema."""
    kind, name = party.kind, party.name
    values = {f.name: (shown or {}).get(f.name, f.default) for f in found.schema
              if f.type != "secret"}
    form = plugin_config_form(found.schema, values)
    if form.validate_on_submit() and submit(
            form, lambda: found.save(db.session, kind, name, form_config(found.schema, form)),
            lambda saved: saved_line(found, kind, name, shown is None, saved)):
        return redirect(url_for("ui.profile", kind=kind, name=name, protocol=found.kind))
    return render_template("ui/profile.html", party=party, profile=shown, form=form,
                           kind=found, active="ui.parties"), form_status(form)


def saved_line(found, kind: str, name: str, created: bool, saved: dict, extra: str = ""):
    """The history line of a saved profile (a lazy text: stored in English, flashed in
    the user's language; what the plugin describes is as it wrote it)."""
    described = found.describe(saved)
    more = (f" ({described})" if described else "") + extra
    values = {"protocol": found.label, "name": name, "more": more}
    if kind == ORGANIZATION:
        return (_l("created the %(protocol)s profile of organization %(name)s%(more)s",
                   **values) if created else
                _l("changed the %(protocol)s profile of organization %(name)s%(more)s",
                   **values))
    return (_l("created the %(protocol)s profile of partner %(name)s%(more)s", **values)
            if created else
            _l("changed the %(protocol)s profile of partner %(name)s%(more)s", **values))


@bp.route("/parties/<any(organization, partner):kind>/<name>/<protocol>/delete",
          methods=["GET", "POST"])
@requires("admin")
def delete_profile(kind: str, name: str, protocol: str):
    found = _kind_or_404(protocol)
    back = url_for("ui.profile", kind=kind, name=name, protocol=protocol)
    ask_first(_("Delete the %(protocol)s profile of %(kind)s %(name)s?",
                protocol=found.label, kind=_("organization") if kind == ORGANIZATION
                else _("partner"), name=name),
              _("Its settings and certificates are removed for good; %(name)s has no "
                "%(protocol)s profile until a new one is saved.", name=name,
                protocol=found.label), back,
              active="ui.parties")
    button(lambda: found.delete(db.session, kind, name),
           lambda _none: (_l("deleted the %(protocol)s profile of organization %(name)s",
                             protocol=found.label, name=name) if kind == ORGANIZATION else
                          _l("deleted the %(protocol)s profile of partner %(name)s",
                             protocol=found.label, name=name)))
    return redirect(url_for("ui.profile", kind=kind, name=name, protocol=protocol))


@bp.post("/parties/partner/<name>/<protocol>/test")
def test_profile(name: str, protocol: str):
    """"Test connection" on a partner's profile: the steps on a page of their own, with
    a link to the test message (whose history names the operator)."""
    found = _kind_or_404(protocol)
    if not ActionForm().validate_on_submit():
        abort(400, expired())
    options = {"organization": request.form.get("organization") or None,
               "wait": _wait(request.form.get("wait"))}
    try:
        result = run_connection_test(db.session, found, name, g.actor, options)
    except ServiceError as exc:
        db.session.rollback()
        flash(refusal(exc), "error")
        return redirect(url_for("ui.profile", kind=PARTNER, name=name, protocol=protocol))
    return render_template("ui/connection_test.html", kind=found, name=name, result=result,
                           active="ui.parties")


def _wait(text: str | None) -> int:
    """Seconds to wait for a later receipt, as the form gives them (0 to 120)."""
    try:
        return min(max(int(text or 20), 0), 120)
    except ValueError:
        return 20


# --- a party's page: what an operator opens when a partner calls ---------------------

@bp.get("/parties/<name>")
def party_page(name: str):
    party = db.session.scalar(select(Party).where(Party.name == name))
    if party is None:
        abort(404, _("no party named %(name)r", name=name))
    now = utcnow()
    ids = partner.newest_ids(db.session, name)
    kinds = profile_kinds(hub.registry())
    shown = addresses(db.session, kinds)
    days = request.args.get("days", type=int, default=30)
    if days not in PERIODS:
        abort(400, _("days must be one of %(periods)s",
                     periods=", ".join(map(str, PERIODS))))
    card = (scorecards.scorecard(db.session, name, days, now)
            if party.kind == PARTNER else None)
    return render_template(
        "ui/party.html", party=party, now=now, card=card, periods=PERIODS,
        messages=partner.recent_messages(db.session, name),
        day=partner.day_figures(db.session, name, now),
        receipt=partner.last_receipt(db.session, ids),
        certificates=partner.certificates(db.session, party.id, now),
        alerts=partner.open_alerts(db.session, name, ids),
        expected=expected.rules_with_windows(name), window_states=expected.STATES,
        profiles=[(k, shown[k.kind].get(party.id)) for k in kinds.values()],
        day_limit=partner.DAY_LIMIT, active="ui.parties")
