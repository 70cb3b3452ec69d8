"""Choices the forms offer: party and instance names."""

from __future__ import annotations

from flask_babel import gettext as _
from sqlalchemy import select

from b2bhub.config.extensions import db
from b2bhub.domain.routing import ANY
from b2bhub.models import Party, PluginInstance
from b2bhub.runtime import hub


def party_choices(any_party: bool = True) -> list[tuple[str, str]]:
    """(name, label) of every party, organizations first; ``*`` first for routes."""
    rows = db.session.execute(select(Party.name, Party.kind, Party.display_name)
                              .order_by(Party.kind, Party.name)).all()
    choices = [(ANY, _("* (any party)"))] if any_party else []
    kinds = {"organization": _("organization"), "partner": _("partner")}
    return choices + [(name, f"{name} ({kinds.get(kind, kind)}"
                             f"{', ' + shown if shown != name else ''})")
                      for name, kind, shown in rows]


def instance_names(role: str) -> list[str]:
    """Names of the instances whose plugin type can play ``role`` (source or target)."""
    registry = hub.registry()
    rows = db.session.execute(select(PluginInstance.name, PluginInstance.type)
                              .order_by(PluginInstance.name)).all()
    return [name for name, type_ in rows
            if type_ in registry and role in registry.get(type_).roles]
