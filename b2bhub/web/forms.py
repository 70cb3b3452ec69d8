"""The UI's forms. Every form that changes something is a FlaskForm and carries a CSRF
token; filters and the route tester change nothing and are plain GET forms.

Fields take text as typed and the services validate it, so a refused form comes back
with every value as the user left it and each error beside its field
(:func:`show_service_error`).
"""

from __future__ import annotations

import json
from typing import Any

from flask_wtf import FlaskForm
from flask_wtf.file import FileField, FileRequired
from wtforms import (
    BooleanField,
    Form,
    FormField,
    HiddenField,
    PasswordField,
    SelectField,
    StringField,
    TextAreaField,
)
from wtforms.validators import DataRequired, Length
from wtforms.widgets import PasswordInput

from b2bhub.config_schema import Field
from b2bhub.services.config import SECRET_MASK
from b2bhub.services.errors import ServiceError
from plugins.as2.certs import CertificateError, upload_from_files
from plugins.as2.profiles import CIPHERS, DIGESTS, MDN_MODES


class LoginForm(FlaskForm):
    name = StringField("User name", validators=[DataRequired(), Length(max=64)])
    password = PasswordField("Password", validators=[DataRequired()])
    next = HiddenField()


class ActionForm(FlaskForm):
    """A button that acts (redeliver, cancel, acknowledge...): only the CSRF token."""


class PartyForm(FlaskForm):
    name = StringField("Name", description="a-z, 0-9, _ and -; routes and messages use it")
    display_name = StringField("Display name")


class RouteForm(FlaskForm):
    source = SelectField("Source", validate_choice=False)
    from_party = SelectField("From", validate_choice=False)
    to_party = SelectField("To", validate_choice=False)
    target = SelectField("Target", validate_choice=False)


class SendForm(FlaskForm):
    file = FileField("File", validators=[FileRequired("choose a file to send")])
    from_party = SelectField("From", validate_choice=False)
    to_party = SelectField("To", validate_choice=False)
    target = SelectField("Target", validate_choice=False,
                         description="empty: the one target the routes name")


class SettingsForm(FlaskForm):
    stall_after = StringField("Wake-ups before stalled")
    wake_delays = StringField("Wake-up delays (seconds, comma-separated)")
    lease_seconds = StringField("Lease length (seconds)")
    scan_lease_seconds = StringField("Scan lease (seconds)")
    claim_batch_max = StringField("Largest claim batch")
    probe_interval = StringField("Probe interval (seconds)")
    cleanup_time = StringField("Cleanup time (HH:MM)")
    retention_days = StringField("Retention (days)")


class BulkRedeliverForm(FlaskForm):
    """Selected deliveries, or every one the filter matches."""

    all_matching = BooleanField("all matching")


# --- AS2 profiles ----------------------------------------------------------------------

#: the profile's choices by the kind of field that edits them (the form's names are the API's)
_AS2_TEXT = ("as2_id", "url", "mdn_url", "content_type", "subject")
_AS2_BOOL = ("sign", "encrypt", "compress", "mdn_signed", "canonicalize_as_binary", "chunked")
_AS2_SELECT = ("digest_alg", "encryption_alg", "mdn_mode", "mdn_digest_alg")


def as2_profile_form(kind: str, data: dict) -> FlaskForm:
    """The AS2 profile form of an organization (our certificate with its key, ``mdn_url``)
    or a partner (its certificate, ``url``); ``data`` is the API shape with defaults."""
    own = kind == "organization"

    class As2ProfileForm(FlaskForm):
        as2_id = StringField("AS2 ID", description="unique among all AS2 profiles")
        sign = BooleanField("Sign")
        digest_alg = SelectField("Signing digest", choices=DIGESTS)
        encrypt = BooleanField("Encrypt")
        encryption_alg = SelectField("Encryption", choices=CIPHERS)
        compress = BooleanField("Compress")
        mdn_mode = SelectField("MDN mode", choices=MDN_MODES)
        mdn_signed = BooleanField("Signed MDN")
        mdn_digest_alg = SelectField("MDN digest", choices=DIGESTS)
        receipt_timeout = StringField("Receipt timeout (seconds)",
                                      description="how long to wait for an asynchronous MDN")
        canonicalize_as_binary = BooleanField("Canonicalize as binary")
        chunked = BooleanField("Chunked transfer encoding",
                               description="off: send with Content-Length")
        content_type = StringField("Content type")
        subject = StringField("Subject")
        certificate_file = FileField(
            "Our certificate and private key" if own else "Partner certificate",
            description=("PEM (certificate with its key, or the key in the next field) or "
                         "PKCS#12 (.p12, .pfx) with its password" if own else
                         "PEM or DER certificate, or PKCS#12") +
            "; leave empty to keep the stored one")
        password = PasswordField("Password of the key or PKCS#12",
                                 description="used once to open it, never kept or shown")

    if own:
        As2ProfileForm.mdn_url = StringField(
            "MDN URL", description="where partners post asynchronous MDNs to us (optional)")
        As2ProfileForm.key_file = FileField(
            "Private key (PEM)", description="only when the certificate file has no key")
    else:
        As2ProfileForm.url = StringField("URL", description="the partner's AS2 endpoint")
    values = {k: v for k, v in data.items() if k in (*_AS2_TEXT, *_AS2_BOOL, *_AS2_SELECT)}
    values = {k: ("" if v is None else v) for k, v in values.items()}
    if data.get("receipt_timeout") is not None:
        values["receipt_timeout"] = str(data["receipt_timeout"])
    return As2ProfileForm(data=values)


def as2_profile_data(form: FlaskForm) -> dict:
    """The API shape of a submitted AS2 profile form, with the uploaded certificate read
    from its files; a field that is not the right kind of value gets its error and
    ServiceError is raised."""
    data: dict[str, Any] = {}
    for name in _AS2_TEXT:
        if name in form:
            text = (form[name].data or "").strip()
            data[name] = (text or None) if name in ("url", "mdn_url") else text
    data.update({name: bool(form[name].data) for name in _AS2_BOOL})
    data.update({name: form[name].data for name in _AS2_SELECT})
    errors: dict[str, str] = {}
    data["receipt_timeout"] = _whole(form.receipt_timeout.data, "receipt_timeout", errors)
    upload = form.certificate_file.data
    if upload:
        key = form.key_file.data if "key_file" in form else None
        try:
            data["certificate"] = upload_from_files(
                upload.read(), key.read() if key else None, form.password.data or None)
        except CertificateError as exc:
            errors["certificate_file"] = str(exc)
    if errors:
        raise ServiceError("; ".join(errors.values()), errors)
    return data


# --- plugin instances: a form drawn from the plugin type's config schema ---------------

def _config_field(field: Field):
    label, help_ = field.name, field.help + (" (required)" if field.required else "")
    if field.type == "boolean":
        return BooleanField(label, description=help_)
    if field.type == "choice":
        return SelectField(label, description=help_, validate_choice=False,
                           choices=[(str(c), str(c)) for c in field.choices])
    if field.type == "json":
        return TextAreaField(label, description=help_)
    if field.type == "secret":
        return PasswordField(label, description=help_, widget=PasswordInput(hide_value=False))
    return StringField(label, description=help_)


def instance_form(plugin_cls: type, data: dict | None = None) -> FlaskForm:
    """The form of a plugin instance of ``plugin_cls``; ``data`` is the API shape."""

    class ConfigForm(Form):
        pass

    for field in plugin_cls.config_schema:
        setattr(ConfigForm, field.name, _config_field(field))

    class InstanceForm(FlaskForm):
        name = StringField("Name", description="a-z, 0-9, _ and -")
        enabled = BooleanField("Enabled", default=True)
        config = FormField(ConfigForm, label="Configuration")

    roles = plugin_cls.roles
    if "target" in roles:
        InstanceForm.max_concurrent_deliveries = StringField(
            "Max concurrent deliveries", default="4")
        InstanceForm.retry_policy = TextAreaField(
            "Retry policy (JSON)", description='e.g. {"strategy": "exponential", '
            '"base_delay": 30, "max_attempts": 5}; empty: the plugin type\'s default')
    if "source" in roles:
        InstanceForm.retention_days = StringField(
            "Retention (days)", description="empty: the setting's default")
    return InstanceForm(data=_form_data(plugin_cls, data or {}))


def _form_data(plugin_cls: type, data: dict) -> dict:
    config = dict(data.get("config") or {})
    for field in plugin_cls.config_schema:
        value = config.get(field.name, field.default)
        if field.type == "json":
            config[field.name] = "" if value is None else json.dumps(value)
        elif field.type == "secret":
            config[field.name] = SECRET_MASK if value else ""
        elif field.type != "boolean":
            config[field.name] = "" if value is None else str(value)
        else:
            config[field.name] = bool(value)
    out = {**data, "config": config}
    if data.get("retry_policy") is not None:
        out["retry_policy"] = json.dumps(data["retry_policy"])
    for key in ("max_concurrent_deliveries", "retention_days"):
        if data.get(key) is not None:
            out[key] = str(data[key])
    return out


def instance_data(form: FlaskForm, plugin_cls: type) -> dict:
    """The API shape of a submitted instance form; a field that is not even the right
    kind of value (a number, JSON) gets its error and ServiceError is raised."""
    config = {field.name: form.config[field.name].data for field in plugin_cls.config_schema}
    data: dict[str, Any] = {"name": form.name.data.strip(), "type": plugin_cls.type_name,
                            "enabled": form.enabled.data, "config": config}
    errors: dict[str, str] = {}
    if hasattr(form, "max_concurrent_deliveries"):
        data["max_concurrent_deliveries"] = _whole(form.max_concurrent_deliveries.data,
                                                   "max_concurrent_deliveries", errors)
        text = (form.retry_policy.data or "").strip()
        try:
            data["retry_policy"] = json.loads(text) if text else None
        except json.JSONDecodeError as exc:
            errors["retry_policy"] = f"invalid JSON: {exc.msg}"
    if hasattr(form, "retention_days"):
        text = (form.retention_days.data or "").strip()
        data["retention_days"] = _whole(text, "retention_days", errors) if text else None
    if errors:
        raise ServiceError("some fields are not valid", errors)
    return data


def _whole(text: str | None, key: str, errors: dict) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        errors[key] = "must be a whole number"
        return None


# --- showing a service's refusal on the form -------------------------------------------

def show_service_error(form: FlaskForm, exc: ServiceError, aliases: dict | None = None
                       ) -> None:
    """Put each field the service named beside that field; the rest above the form.

    ``aliases`` maps a service field name to the form's (``from`` -> ``from_party``);
    ``config`` details land on the generated configuration fields.
    """
    aliases = aliases or {}
    details = dict(exc.details or {})
    if not details:  # "source: no plugin instance named 'x'" names its field first
        prefix = exc.message.split(":", 1)[0]
        if aliases.get(prefix, prefix) in form:
            details = {prefix: exc.message}
    placed = False
    for key, text in details.items():
        if key == "config" and isinstance(text, dict) and "config" in form:
            for name, problem in text.items():
                if name in form.config.form:
                    _add_error(form.config.form[name], problem)
                    placed = True
            continue
        name = aliases.get(key, key)
        if name in form and isinstance(text, str):
            _add_error(form[name], exc.message if len(details) == 1 else text)
            placed = True
    if not placed:
        form.form_errors.append(exc.message)


def _add_error(field, text: str) -> None:
    field.errors = [*field.errors, text]
