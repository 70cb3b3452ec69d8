"""The certificate exchange (CEM) part of a partner's AS2 profile page: its requests
both ways with their steps, a form that sends our new certificate, and Accept / Reject
for a request the partner sent. Each is the profile kind's action
(:meth:`.profile_kind.As2Profiles.run_action`), so the page and the API do the same
thing, with the history line naming the operator."""

from __future__ import annotations

from pathlib import Path

from flask import g, redirect, request, url_for
from flask_babel import gettext as _
from markupsafe import Markup

from b2bhub.plugin import (
    ServiceError,
    get_protocol_profile,
    render_plugin_template,
    ui_button,
    ui_session,
)
from plugins.as2 import cem, profiles
from plugins.as2.certs import CertificateError, upload_from_files

TEMPLATE = str(Path(__file__).with_name("templates") / "as2_cem.html")


def section(party) -> Markup:
    """The page's CEM section (a partner's profile only)."""
    if party.kind != "partner":
        return Markup("")
    return Markup(render_plugin_template(TEMPLATE, party=party,  # noqa: S704
                                         cem_requests=shown(party)))


def shown(party) -> list[dict]:
    """The partner's CEM requests, newest first, without keys."""
    found = get_protocol_profile(ui_session(), profiles.PROTOCOL, party.kind, party.name)
    if found is None or party.kind != "partner":
        return []
    return [cem.public(r) for r in reversed(cem.records(found.settings))]


def posted(found, party):
    """The answer to a CEM form's POST, or None when the POST is another form's."""
    step = request.form.get("step")
    if step not in cem.ACTIONS or party.kind != "partner":
        return None
    here = url_for("ui.profile", kind=party.kind, name=party.name, protocol=found.kind)

    def run():
        body = _request_body() if step == "cem_request" else {
            "request_id": request.form.get("request_id") or "",
            **({"reason": request.form["reason"]} if request.form.get("reason") else {})}
        return found.run_action(ui_session(), party.kind, party.name, step, body, g.actor)

    said = {"cem_request": _("CEM request sent to %(name)s; its answer shows here",
                             name=party.name),
            "cem_accept": _("CEM request accepted; the response to %(name)s: %(state)s",
                            name=party.name, state="%(response)s"),
            "cem_reject": _("CEM request rejected; the response to %(name)s: %(state)s",
                            name=party.name, state="%(response)s")}[step]
    ui_button(run, lambda got: said.replace("%(response)s", str(got.get("response"))),
              record=False)
    return redirect(here)


def _request_body() -> dict:
    cert = request.files.get("cem_certificate")
    key = request.files.get("cem_key")
    data = cert.read() if cert else b""
    if not data:
        raise ServiceError(_("choose the new certificate's file"),
                           {"certificate": "required"})
    try:
        upload = upload_from_files(data, (key.read() or None) if key else None,
                                   request.form.get("cem_password") or None)
    except CertificateError as exc:
        raise ServiceError(exc.args[0], {"certificate": exc.args[0]}) from None
    body = {"certificate": upload,
            "usages": request.form.getlist("cem_usage") or list(cem.DEFAULT_USAGES)}
    if request.form.get("cem_respond_by"):
        body["respond_by"] = request.form["cem_respond_by"] + "T23:59:59Z"
    return body
