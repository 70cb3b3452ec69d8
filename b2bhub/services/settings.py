"""System > Settings: delivery settings from a form's text, every bad field named."""

from __future__ import annotations

import re
from dataclasses import fields

from b2bhub.domain.i18n import N_
from b2bhub.engine.settings import DeliverySettings
from b2bhub.services.errors import ServiceError

WHOLE = {"stall_after": 1, "lease_seconds": 10, "scan_lease_seconds": 5,
         "claim_batch_max": 1, "probe_interval": 5, "retention_days": 1}
TIME_RE = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")


def settings_from_text(values: dict[str, str], current: DeliverySettings
                       ) -> DeliverySettings:
    """New settings from ``values`` (field -> text); fields not given keep ``current``."""
    errors: dict[str, str] = {}
    out = current.to_dict()
    for name, least in WHOLE.items():
        if name in values:
            text = (values[name] or "").strip()
            if not text.isdigit() or int(text) < least:
                errors[name] = N_("a whole number of at least %(least)s", least=least)
            else:
                out[name] = int(text)
    if "wake_delays" in values:
        parts = [p.strip() for p in (values["wake_delays"] or "").split(",")]
        if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
            errors["wake_delays"] = N_("whole numbers of seconds, each at least 1, "
                                       "separated by commas")
        else:
            out["wake_delays"] = [int(p) for p in parts]
    if "cleanup_time" in values:
        text = (values["cleanup_time"] or "").strip()
        if not TIME_RE.match(text):
            errors["cleanup_time"] = N_("a time of day as HH:MM (00:00 to 23:59)")
        else:
            out["cleanup_time"] = text
    if errors:
        raise ServiceError(N_("some settings are not valid"), errors)
    return DeliverySettings.from_dict(out)


def settings_as_text(settings: DeliverySettings) -> dict[str, str]:
    values = settings.to_dict()
    values["wake_delays"] = ", ".join(str(v) for v in settings.wake_delays)
    return {f.name: str(values[f.name]) for f in fields(DeliverySettings)}
