"""The UI's forms. Every form that changes something is a FlaskForm and carries a CSRF
token; filters and the route tester change nothing and are plain GET forms.

Fields take text as typed and the services validate it, so a refused form comes back
with every value as the user left it and each error beside its field
(:func:`show_service_error`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from flask_babel import gettext as _
from flask_babel import lazy_gettext as _l
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

from b2bhub.domain import i18n
from b2bhub.plugin import Plugin
from b2bhub.plugin.schema import Field
from b2bhub.services.config import SECRET_MASK, together
from b2bhub.services.errors import ServiceError

#: the rule of a party's or an instance's name (b2bhub.domain.routing.NAME_RULE) as the
#: forms say it, in the user's language
NAME_RULE = _l("1-64 characters of a-z, 0-9, '_' and '-'")


class LoginForm(FlaskForm):
    name = StringField(_l("User name"), validators=[DataRequired(), Length(max=64)])
    password = PasswordField(_l("Password"), validators=[DataRequired()])
    next = HiddenField()


class ActionForm(FlaskForm):
    """A button that acts (redeliver, cancel, acknowledge...): only the CSRF token."""


class PartyForm(FlaskForm):
    name = StringField(_l("Name"), description=NAME_RULE)
    display_name = StringField(_l("Display name"))
    edi_identities = TextAreaField(
        _l("EDI identities"), description=_l("one qualifier:id per line, as an interchange's "
        "envelope names the party (ZZ:ACME, 01:123456789); each one party's at most"))
    functional_acks = SelectField(
        _l("Functional acknowledgments we send"), default="none", choices=[
            ("none", _l("none")), ("997", "997 (X12), CONTRL (EDIFACT)"),
            ("999", "999 (X12), CONTRL (EDIFACT)")],
        description=_l("what the partner gets back for each interchange it sends us"))
    ack_hours = StringField(
        _l("Acknowledgment expected within (hours)"),
        description=_l("empty: we expect no acknowledgment of what we send; else 1-720, "
        "after which ack_overdue is raised"))


class RouteForm(FlaskForm):
    source = SelectField(_l("Source"), validate_choice=False)
    from_party = SelectField(_l("From"), validate_choice=False)
    to_party = SelectField(_l("To"), validate_choice=False)
    document_type = StringField(
        _l("Document type"), default="*",
        description=_l("* for any message; else a type the envelope must hold: 850, ORDERS"))
    target = SelectField(_l("Target"), validate_choice=False)


class SendForm(FlaskForm):
    file = FileField(_l("File"), validators=[FileRequired(_l("choose a file to send"))])
    from_party = SelectField(_l("From"), validate_choice=False)
    to_party = SelectField(_l("To"), validate_choice=False)
    target = SelectField(_l("Target"), validate_choice=False,
                         description=_l("empty: the one target the routes name"))


class SettingsForm(FlaskForm):
    stall_after = StringField(_l("Wake-ups before stalled"))
    wake_delays = StringField(_l("Wake-up delays (seconds, comma-separated)"))
    lease_seconds = StringField(_l("Lease length (seconds)"))
    scan_lease_seconds = StringField(_l("Scan lease (seconds)"))
    claim_batch_max = StringField(_l("Largest claim batch"))
    probe_interval = StringField(_l("Probe interval (seconds)"))
    cleanup_time = StringField(_l("Cleanup time (HH:MM)"))
    retention_days = StringField(_l("Retention (days)"))


class BulkRedeliverForm(FlaskForm):
    """Selected deliveries, or every one the filter matches."""

    all_matching = BooleanField(_l("all matching"))


# --- plugin instances: a form drawn from the plugin type's config schema ---------------

def _config_field(field: Field):
    """A form field of a plugin schema's field: its label and help in the user's
    language where the catalog has them (the core's and our plugins' schemas, collected
    by ``make i18n``), else as the plugin wrote them."""
    label = _("%(label)s (required)", label=_(field.title)) if field.required \
        else _(field.title)
    help_ = _(field.help) if field.help else ""
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


def _collects(plugin_cls: type) -> bool:
    """A source type that records failed fetches as collection errors says how it
    retries them (its own ``collection_retry_policy``): its form has the field."""
    return any("collection_retry_policy" in vars(k) for k in plugin_cls.__mro__
               if k is not Plugin)


def instance_form(plugin_cls: type, data: dict | None = None) -> FlaskForm:
    """The form of a plugin instance of ``plugin_cls``; ``data`` is the API shape."""

    class ConfigForm(Form):
        pass

    for field in plugin_cls.config_schema:
        setattr(ConfigForm, field.name, _config_field(field))

    class InstanceForm(FlaskForm):
        name = StringField(_l("Name"), description=NAME_RULE)
        enabled = BooleanField(_l("Enabled"), default=True)
        config = FormField(ConfigForm, label=_l("Configuration"))

    roles = plugin_cls.roles
    if "target" in roles:
        InstanceForm.max_concurrent_deliveries = StringField(
            _l("Max concurrent deliveries"), default="4")
        InstanceForm.retry_policy = TextAreaField(
            _l("Retry policy (JSON)"), description=_l('e.g. {"strategy": "exponential", '
            '"base_delay": 30, "max_attempts": 5}; empty: the plugin type\'s default'))
        InstanceForm.probe_interval = StringField(
            _l("Probe interval (seconds)"), description=_l("how often the destination is "
            "probed, for types that can probe; empty: the System > Settings interval"))
        InstanceForm.business_rules = TextAreaField(
            _l("Business-error rules (JSON)"), render_kw={"rows": 6},
            description=_l('a list, checked in order on every answer, e.g. [{"name": '
            '"rejected", "status": "2xx", "json_path": "$.status", "json_value": "ERR", '
            '"block": "instance"}]; also body_regex; block: none, sequence or instance; '
            'empty: no rules'))
    elif _collects(plugin_cls):
        InstanceForm.retry_policy = TextAreaField(
            _l("Retry policy (JSON)"), description=_l('failed fetches tried again before '
            'a Collection error is recorded, e.g. {"max_attempts": 3, "base_delay": 30}; '
            'empty: the plugin type\'s default'))
    if "source" in roles:
        InstanceForm.retention_days = StringField(
            _l("Retention (days)"),
            description=_l("empty or 0: the setting's default; -1: keep forever"))
        InstanceForm.parties_from = SelectField(
            _l("Parties from"), validate_choice=False,
            choices=[("source", _("the source (its path or configuration)")),
                     ("envelope", _("the envelope (the parties' EDI identities)"))],
            description=_l("envelope: from and to are the parties whose EDI identities the "
            "interchange's sender and receiver are; an unknown one makes it Not routed"))
        InstanceForm.edi_errors = SelectField(
            _l("Envelope errors"), validate_choice=False,
            choices=[("accept", _("accept: deliver, the errors in its history")),
                     ("refuse", _("refuse: store it Refused, the errors the reason"))],
            description=_l("an interchange whose envelope has errors (control numbers, "
            "counts, a missing trailer)"))
        InstanceForm.duplicates = SelectField(
            _l("Duplicate interchanges"), validate_choice=False,
            choices=[("alert", _("alert: deliver, with a line and an alert")),
                     ("refuse", _("refuse: store it Refused, naming the earlier message"))],
            description=_l("an interchange whose sender and control number came before"))
        InstanceForm.duplicate_days = StringField(
            _l("Duplicate window (days)"), default="30",
            description=_l("how far back an interchange counts as a duplicate; 0: no check"))
    return InstanceForm(data=_form_data(plugin_cls, data or {}))


def plugin_config_form(schema: list, values: dict) -> FlaskForm:
    """A form of the fields of ``schema`` (a profile kind's), filled with ``values``
    (secrets are never filled in)."""

    class SchemaForm(FlaskForm):
        pass

    for field in schema:
        setattr(SchemaForm, field.name, _config_field(field))
    data = {}
    for field in schema:
        value = values.get(field.name)
        if field.type == "json":
            data[field.name] = "" if value is None else json.dumps(value)
        elif field.type == "boolean":
            data[field.name] = bool(value)
        elif field.type != "secret":
            data[field.name] = "" if value is None else str(value)
    return SchemaForm(data=data)


def form_config(schema: list, form: FlaskForm) -> dict:
    """The values of a submitted :func:`plugin_config_form`; a secret left empty is left
    out (the stored one is kept)."""
    values = {}
    for field in schema:
        value = form[field.name].data
        if field.type == "secret" and not value:
            continue
        values[field.name] = value
    return values


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
    if data.get("business_rules"):
        out["business_rules"] = json.dumps(data["business_rules"], indent=2)
    else:
        out.pop("business_rules", None)
    for key in ("max_concurrent_deliveries", "retention_days", "duplicate_days"):
        if data.get(key) is not None:
            out[key] = str(data[key])
    out["probe_interval"] = str(data["probe_interval"]) if data.get("probe_interval") else ""
    return out


def save_instance_form(form: FlaskForm, plugin_cls: type, save: Callable[[dict], Any]):
    """Save a submitted instance form with ``save(data)`` (the service), refusing it
    with every mistake at once: the fields that are not even the right kind of value
    (a number, JSON) are left out of ``data`` and their errors joined to the service's
    refusal of the rest (or raised alone, the service's change rolled back by the
    caller)."""
    try:
        instance_data(form, plugin_cls)
    except ServiceError as local:
        data = instance_data(form, plugin_cls, leave_out=set(local.details))
        try:
            save(data)
        except ServiceError as refused:
            raise together([refused, local]) from refused
        raise local from None
    return save(instance_data(form, plugin_cls))


def instance_data(form: FlaskForm, plugin_cls: type, leave_out: set | None = None) -> dict:
    """The API shape of a submitted instance form; a field that is not even the right
    kind of value (a number, JSON) gets its error and ServiceError is raised, unless
    it is in ``leave_out`` (then it is left out of the shape)."""
    config = {field.name: form.config[field.name].data for field in plugin_cls.config_schema}
    data: dict[str, Any] = {"name": form.name.data.strip(), "type": plugin_cls.type_name,
                            "enabled": form.enabled.data, "config": config}
    errors: dict[str, str] = {}
    if hasattr(form, "retry_policy"):
        text = (form.retry_policy.data or "").strip()
        try:
            data["retry_policy"] = json.loads(text) if text else None
        except json.JSONDecodeError as exc:
            errors["retry_policy"] = _("invalid JSON: %(why)s", why=exc.msg)
    if hasattr(form, "max_concurrent_deliveries"):
        data["max_concurrent_deliveries"] = _whole(form.max_concurrent_deliveries.data,
                                                   "max_concurrent_deliveries", errors)
        text = (form.probe_interval.data or "").strip()
        data["probe_interval"] = _whole(text, "probe_interval", errors) if text else 0
        text = (form.business_rules.data or "").strip()
        try:
            data["business_rules"] = json.loads(text) if text else None
        except json.JSONDecodeError as exc:
            errors["business_rules"] = _("invalid JSON: %(why)s (line %(line)s, column "
                                         "%(column)s)", why=exc.msg, line=exc.lineno,
                                         column=exc.colno)
    if hasattr(form, "retention_days"):
        text = (form.retention_days.data or "").strip()
        data["retention_days"] = _whole(text, "retention_days", errors) if text else None
    if hasattr(form, "parties_from"):
        data["parties_from"] = form.parties_from.data or "source"
    if hasattr(form, "edi_errors"):
        data["edi_errors"] = form.edi_errors.data or "accept"
        data["duplicates"] = form.duplicates.data or "alert"
        text = (form.duplicate_days.data or "").strip()
        data["duplicate_days"] = _whole(text, "duplicate_days", errors) if text else 30
    for key in leave_out or ():
        data.pop(key, None)
        errors.pop(key, None)
    if errors:
        raise ServiceError("; ".join(errors.values()), errors)  # one: shown as it is
    return data


def _whole(text: str | None, key: str, errors: dict) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        errors[key] = _("must be a whole number")
        return None


# --- showing a service's refusal on the form -------------------------------------------

def show_service_error(form: FlaskForm, exc: ServiceError, aliases: dict | None = None
                       ) -> None:
    """Put each field the service named beside that field; the rest above the form.

    ``aliases`` maps a service field name to the form's (``from`` -> ``from_party``);
    ``config`` details land on the generated configuration fields. The service's texts
    are shown in the reader's language (docs/i18n.md, "A service's refusal").
    """
    aliases = aliases or {}
    details = dict(exc.details or {})
    if not details:  # "source: no plugin instance named 'x'" names its field first
        prefix = exc.message.split(":", 1)[0]
        if aliases.get(prefix, prefix) in form:
            details = {prefix: exc.message}
    if not details:
        form.form_errors.append(said(exc.message))
        return
    if len(details) == 1:
        [(key, text)] = details.items()
        if aliases.get(key, key) in form and isinstance(text, str):
            # the reason once: "instance name 'X': must be ..." beside Name says the rule;
            # a bare code ("renamed", "disabled") gives way to the message that explains it
            said_here = exc.message.endswith(text) and " " in text.strip()
            _add_error(form[aliases.get(key, key)], text if said_here else exc.message)
            return
    elsewhere = []
    for key, text in details.items():
        if key == "config" and isinstance(text, dict):  # a profile's fields are on top
            fields = form.config.form if "config" in form else form
            for name, problem in text.items():
                if name in fields:
                    _add_error(fields[name], problem)
                else:
                    elsewhere.append(f"{name}: {said(problem)}")
            continue
        name = aliases.get(key, key)
        if name in form and isinstance(text, dict):  # one reason per item (rule 2: ...)
            for where, problem in text.items():
                _add_error(form[name], f"{said(where)}: {said(problem)}")
        elif name in form:
            _add_error(form[name], text if isinstance(text, str) else str(text))
        else:
            elsewhere.append(f"{key}: {said(text)}")
    if len(elsewhere) == len(details):  # none beside a field ({"route": 3}): the message
        form.form_errors.append(said(exc.message))
    elif elsewhere:
        form.form_errors.append("; ".join(elsewhere))


def refusal(exc: Exception) -> str:
    """Why a service or an operator action refused, in the reader's language."""
    text = getattr(exc, "message", None) or (exc.args[0] if exc.args else "")
    return said(text) if isinstance(text, str) and text else str(exc)


def said(text) -> str:
    """A service's text in the reader's language: one of ours (marked with ``N_``)
    through the catalog, any other (a partner's words) as it is."""
    return i18n.shown(text, _)


def _add_error(field, text: str) -> None:
    field.errors = [*field.errors, said(text)]
