"""The AS2 profile page of a party (``ProfileKind.ui_page``): the profile as the API
shows it, and for admins its form, the certificate uploaded as files (PEM, DER or PKCS#12
with its password; the password is used once to open it, never kept or shown)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import abort, redirect, url_for
from flask_babel import lazy_gettext as _l
from flask_wtf import FlaskForm
from flask_wtf.file import FileField
from wtforms import BooleanField, PasswordField, SelectField, StringField, TextAreaField

from b2bhub.plugin import (
    ServiceError,
    joined,
    render_plugin_template,
    ui_form_status,
    ui_saved_line,
    ui_session,
    ui_submit,
    ui_whole_number,
)
from plugins.as2 import presets, profiles, tls
from plugins.as2.certs import CertificateError, upload_from_files
from plugins.as2.profiles import CIPHERS, DIGESTS, KEY_ENCRYPTIONS, MDN_MODES

TEMPLATE = str(Path(__file__).with_name("templates") / "as2_profile.html")


#: the profile's choices by the kind of field that edits them (the form's names are the API's)
_AS2_TEXT = ("as2_id", "url", "mdn_url", "content_type", "subject", *profiles.IDENTITY)
_AS2_BOOL = ("sign", "encrypt", "compress", "mdn_signed", "canonicalize_as_binary", "chunked",
             "accept_expired_certificates", "accept_mdn_without_mic", "cem_auto_accept")
_AS2_SELECT = ("digest_alg", "encryption_alg", "key_encryption", "mdn_mode", "mdn_digest_alg")
#: a partner's outbound TLS choices (plugins.as2.tls)
_TLS = ("tls_ca_bundle", "tls_system_trust")


def as2_profile_form(kind: str, data: dict) -> FlaskForm:
    """The AS2 profile form of an organization (our certificate with its key, ``mdn_url``)
    or a partner (its certificate, ``url``); ``data`` is the API shape with defaults."""
    own = kind == "organization"

    class As2ProfileForm(FlaskForm):
        as2_id = StringField(_l("AS2 ID"), description=_l("unique among all AS2 profiles"))
        sign = BooleanField(_l("Sign"))
        digest_alg = SelectField(_l("Signing digest"), choices=DIGESTS)
        encrypt = BooleanField(_l("Encrypt"))
        encryption_alg = SelectField(_l("Encryption"), choices=CIPHERS)
        key_encryption = SelectField(
            _l("Key encryption"), choices=KEY_ENCRYPTIONS,
            description=_l("how the content key is wrapped for the partner (we accept all)"))
        compress = BooleanField(_l("Compress"))
        accept_expired_certificates = BooleanField(
            _l("Accept expired certificates"),
            description=_l("use a certificate outside its validity window (a warning line "
                        "each time) instead of refusing"))
        mdn_mode = SelectField(_l("MDN mode"), choices=MDN_MODES)
        mdn_signed = BooleanField(_l("Signed MDN"))
        mdn_digest_alg = SelectField(_l("MDN digest"), choices=DIGESTS)
        receipt_timeout = StringField(_l("Receipt timeout (seconds)"),
                                      description=_l("how long to wait for an asynchronous MDN"))
        canonicalize_as_binary = BooleanField(_l("Canonicalize as binary"))
        chunked = BooleanField(_l("Chunked transfer encoding"),
                               description=_l("off: send with Content-Length (a 411 answer to "
                               "chunked is sent again with Content-Length)"))
        accept_mdn_without_mic = BooleanField(
            _l("Accept a signed MDN without MIC"),
            description=_l("delivered with a warning instead of failed (RFC 4130 requires "
            "the MIC on signed receipts)"))
        content_type = StringField(_l("Content type"))
        subject = StringField(_l("Subject"))
        cem_auto_accept = BooleanField(
            _l("Accept CEM requests automatically"),
            description=_l("the partner's new certificates sent by CEM are taken without "
                           "an operator's approval"))
        certificate_file = FileField(
            _l("Our certificate and private key") if own else _l("Partner certificate"),
            description=(_l("PEM (certificate with its key, or the key in the next field) or "
                         "PKCS#12 (.p12, .pfx) with its password") if own else
                         _l("PEM or DER certificate, or PKCS#12")) +
            _l("; leave empty to keep the stored one"))
        password = PasswordField(_l("Password of the key or PKCS#12"),
                                 description=_l("used once to open it, never kept or shown"))

    if not own:  # vendor presets are a partner's (plugins.as2.presets)
        As2ProfileForm.preset = SelectField(
            _l("Start from a preset"),
            choices=[("", _l("(none: keep the choices below)"))]
            + [(p.name, p.label) for p in presets.PRESETS.values()], default="",
            description=_l("its switches replace the choices below when saved; change "
                           "them afterwards if needed"))

    if own:
        As2ProfileForm.mdn_url = StringField(
            _l("MDN URL"), description=_l("where partners post asynchronous MDNs to us (optional)"))
        As2ProfileForm.message_id_domain = StringField(
            _l("Message-ID domain"), description=_l("empty: the host's name"))
        As2ProfileForm.disposition_notification_to = StringField(
            _l("Disposition-Notification-To"), description=_l("empty: as2@<Message-ID domain>"))
        As2ProfileForm.mdn_text = TextAreaField(
            _l("MDN text"),
            description=_l("the human-readable part of our receipts; empty: b2bhub's"))
        As2ProfileForm.mdn_failed_text = TextAreaField(
            _l("Negative MDN text"), description=_l("empty: b2bhub's"))
        As2ProfileForm.key_file = FileField(
            _l("Private key (PEM)"), description=_l("only when the certificate file has no key"))
    else:
        As2ProfileForm.url = StringField(_l("URL"), description=_l("the partner's AS2 endpoint"))
        _tls_fields(As2ProfileForm)
    values = {k: v for k, v in data.items()
              if k in (*_AS2_TEXT, *_AS2_BOOL, *_AS2_SELECT, *(() if own else _TLS))}
    values = {k: ("" if v is None else v) for k, v in values.items()}
    if data.get("receipt_timeout") is not None:
        values["receipt_timeout"] = str(data["receipt_timeout"])
    return As2ProfileForm(data=values)


def _tls_fields(form_class) -> None:
    """A partner's outbound TLS: the CAs of its server, our client certificate."""
    form_class.tls_ca_bundle = TextAreaField(
        _l("TLS CA bundle (PEM)"), description=_l("the CA certificates that verify the partner's "
        "HTTPS server certificate; empty: none of the partner's own"))
    form_class.tls_system_trust = BooleanField(
        _l("Also trust the system's CA store"),
        description=_l("off: only the CA bundle above is trusted"))
    form_class.tls_client_file = FileField(
        _l("TLS client certificate (mutual TLS)"),
        description=_l("ours, with its private key: PEM (certificate and key, or the key in "
        "the next field) or PKCS#12; leave empty to keep the stored one"))
    form_class.tls_client_key_file = FileField(_l("TLS client private key (PEM)"),
                                               description=_l("only when the file above has none"))
    form_class.tls_client_password = PasswordField(
        _l("Password of the TLS client key or PKCS#12"),
        description=_l("used once to open it, never kept or shown"))
    form_class.tls_client_remove = BooleanField(_l("Remove the TLS client certificate"))


def _tls_data(form: FlaskForm, data: dict, errors: dict) -> None:
    """The TLS choices of a partner's form into ``data`` (the API's shape)."""
    data["tls_ca_bundle"] = (form.tls_ca_bundle.data or "").strip() or None
    data["tls_system_trust"] = bool(form.tls_system_trust.data)
    upload, key = form.tls_client_file.data, form.tls_client_key_file.data
    if upload:
        try:
            data["tls_client_certificate"] = upload_from_files(
                upload.read(), key.read() if key else None,
                form.tls_client_password.data or None)
        except CertificateError as exc:
            errors["tls_client_file"] = exc.args[0]  # a Text: the reader's language
    elif form.tls_client_remove.data:
        data["tls_client_certificate"] = None


def as2_profile_data(form: FlaskForm) -> dict:
    """The API shape of a submitted AS2 profile form, with the uploaded certificate read
    from its files; a field that is not the right kind of value gets its error and
    ServiceError is raised."""
    data: dict[str, Any] = {}
    for name in _AS2_TEXT:
        if name in form:
            text = (form[name].data or "").strip()
            optional = name in ("url", "mdn_url", *profiles.IDENTITY)
            data[name] = (text or None) if optional else text
    data.update({name: bool(form[name].data) for name in _AS2_BOOL})
    data.update({name: form[name].data for name in _AS2_SELECT})
    errors: dict[str, str] = {}
    data["receipt_timeout"] = ui_whole_number(form.receipt_timeout.data, "receipt_timeout", errors)
    upload = form.certificate_file.data
    if upload:
        key = form.key_file.data if "key_file" in form else None
        try:
            data["certificate"] = upload_from_files(
                upload.read(), key.read() if key else None, form.password.data or None)
        except CertificateError as exc:
            errors["certificate_file"] = exc.args[0]
    if "tls_ca_bundle" in form:
        _tls_data(form, data, errors)
    if "preset" in form and form.preset.data:  # the preset's switches win over the form's
        data["preset"] = form.preset.data
        for switch in presets.PRESETS[form.preset.data].switches:  # a choice of the select
            data.pop(switch, None)
    if errors:
        raise ServiceError(joined(errors.values()), errors)
    return data


def _save(kind: str, name: str, form) -> tuple:
    data = as2_profile_data(form)
    return profiles.save_profile(ui_session(), kind, name, data), data


def _saved(found, kind: str, name: str, created: bool, profile, data: dict) -> str:
    """The history line of a saved profile; it names a newly uploaded certificate (and
    a TLS client certificate set or removed)."""
    extra = ""
    if "certificate" in data:
        cert = profiles.as2_certs(profile)[0]
        extra = f" with the certificate {cert.subject} valid until {cert.not_after:%Y-%m-%d}"
    if "tls_client_certificate" in data:
        client = next((c for c in profile.certificates if c.usage == tls.TLS_CLIENT), None)
        extra += (f"; TLS client certificate {client.subject} valid until "
                  f"{client.not_after:%Y-%m-%d}" if client else
                  "; TLS client certificate removed")
    if data.get("preset"):
        extra += "; " + presets.applied_text(data["preset"])
    return ui_saved_line(found, kind, name, created, {"as2_id": profile.address}, extra)


def profile_page(found, party, shown: dict | None):
    """The profile as the API shows it; admins edit it on the same page. A POST saves
    the whole form (choices as shown, the certificate only when a file is chosen)."""
    if party is None:
        abort(404)
    kind, name = party.kind, party.name
    from plugins.as2 import cem_ui  # certificate exchange: its forms and its section
    answered = cem_ui.posted(found, party) if shown is not None else None
    if answered is not None:
        return answered
    defaults = {choice: default for choice, (default, _check) in profiles.CHOICES.items()}
    form = as2_profile_form(kind, shown or defaults)
    if form.validate_on_submit() and ui_submit(
            form, lambda: _save(kind, name, form),
            lambda saved: _saved(found, kind, name, shown is None, *saved),
            aliases={"certificate": "certificate_file",
                     "tls_client_certificate": "tls_client_file"}):
        return redirect(url_for("ui.profile", kind=kind, name=name, protocol=found.kind))
    return render_plugin_template(TEMPLATE, party=party, profile=shown, form=form,
                                  warning_days=profiles.EXPIRY_WARNING.days,
                                  ca_subjects=tls.bundle_subjects(
                                      (shown or {}).get("tls_ca_bundle")),
                                  cem_section=cem_ui.section(party),
                                  presets=presets.PRESETS,
                                  active="ui.parties"), ui_form_status(form)
