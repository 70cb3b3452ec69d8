"""The SFTP profile page of a party (``ProfileKind.ui_page``): the connection as the
API shows it (secrets as ``********``), its form, and the host-key confirmation flow:
"Fetch host key" shows the key the server offers with its ``SHA256:`` fingerprint,
"Confirm and pin" pins it only if the server still offers the key of that fingerprint;
a key may be pasted instead. Each step is the profile kind's action
(:meth:`.profiles.SftpProfiles.run_action`), with its history line naming the operator."""

from __future__ import annotations

from pathlib import Path

from flask import abort, g, redirect, request, url_for
from flask_babel import lazy_gettext as _l
from flask_wtf import FlaskForm
from wtforms import IntegerField, PasswordField, StringField, TextAreaField
from wtforms.validators import Optional

from b2bhub.plugin import (
    ServiceError,
    render_plugin_template,
    ui_button,
    ui_form_status,
    ui_saved_line,
    ui_session,
    ui_submit,
)
from plugins.sftp import profiles

TEMPLATE = str(Path(__file__).with_name("templates") / "sftp_profile.html")
_TEXT = ("host", "username")
_NUMBERS = ("port", "connect_timeout", "operation_timeout", "keepalive", "idle_close")
_SECRETS = ("password", "private_key", "passphrase")


class SftpProfileForm(FlaskForm):
    host = StringField(_l("Host"),
                       description=_l("the partner's SFTP server, a name or address"))
    port = IntegerField(_l("Port"), validators=[Optional()])
    username = StringField(_l("User"))
    password = PasswordField(_l("Password"),
                             description=_l("leave empty to keep the stored one"))
    private_key = TextAreaField(
        _l("Private key"), description=_l("OpenSSH or PEM (ed25519, RSA, ECDSA); leave "
                                          "empty to keep the stored one"))
    passphrase = PasswordField(_l("Private key passphrase"),
                               description=_l("leave empty to keep the stored one"))
    connect_timeout = IntegerField(_l("Connect timeout (seconds)"), validators=[Optional()])
    operation_timeout = IntegerField(_l("Operation timeout (seconds)"),
                                     validators=[Optional()])
    keepalive = IntegerField(_l("Keep-alive (seconds)"), validators=[Optional()])
    idle_close = IntegerField(_l("Close when idle (seconds)"), validators=[Optional()])


class HostKeyForm(FlaskForm):
    """The host-key steps: a fingerprint to confirm, or a pasted key."""

    fingerprint = StringField(_l("Fingerprint"))
    key = TextAreaField(_l("Paste the host key"),
                        description=_l("'ssh-ed25519 AAAA...' or a line of known_hosts "
                                       "(ssh-keyscan prints them)"))


def _data(form: SftpProfileForm) -> dict:
    data = {name: (form[name].data or "").strip() for name in _TEXT}
    data.update({name: form[name].data for name in _NUMBERS if form[name].data is not None})
    data.update({name: form[name].data for name in _SECRETS if form[name].data})
    return data


def _action(kind: str, name: str, action: str, body: dict):
    return profiles.PROFILE_KIND.run_action(ui_session(), kind, name, action, body, g.actor)


def profile_page(found, party, shown: dict | None):
    if party is None:
        abort(404)
    kind, name = party.kind, party.name
    here = url_for("ui.profile", kind=kind, name=name, protocol=found.kind)
    step = request.form.get("step") if request.method == "POST" else None
    offered = None
    key_form = HostKeyForm(prefix="hk")
    if step == "fetch":
        result = {}

        def fetch():
            result.update(_action(kind, name, "fetch_host_key", {}))
            return result
        ui_button(fetch, lambda got: _l(
            "fetched the host key of %(host)s:%(port)s: %(fingerprint)s; compare it with "
            "the one your partner gave", host=got["host"], port=got["port"],
            fingerprint=got["fingerprint"]), record=False)
        offered = result or None
        if offered:
            key_form = HostKeyForm(prefix="hk", data={"fingerprint": offered["fingerprint"]})
    elif step in ("pin", "paste", "unpin"):
        body = ({} if step == "unpin" else
                {"fingerprint": request.form.get("hk-fingerprint") or None} if step == "pin"
                else {"key": request.form.get("hk-key") or ""})
        body = {k: v for k, v in body.items() if v is not None}
        action = "unpin_host_key" if step == "unpin" else "pin_host_key"
        ui_button(lambda: _action(kind, name, action, body),
                  lambda got: (_l("pinned the host key %(fingerprint)s",
                                  fingerprint=got["host_key_fingerprint"])
                               if got.get("host_key") else _l("removed the pinned host key")),
                  record=False)
        return redirect(here)
    values = dict(shown or {f.name: f.default for f in profiles.SCHEMA})
    form = SftpProfileForm(data={k: v for k, v in values.items()
                                 if k in (*_TEXT, *_NUMBERS)})
    if step is None and form.validate_on_submit() and ui_submit(
            form, lambda: found.save(ui_session(), kind, name, _data(form)),
            lambda saved: ui_saved_line(found, kind, name, shown is None, saved)):
        return redirect(here)
    return render_plugin_template(TEMPLATE, party=party, profile=shown, form=form,
                                  key_form=key_form, offered=offered, here=here,
                                  active="ui.parties"), ui_form_status(form)


__all__ = ["ServiceError", "profile_page"]
