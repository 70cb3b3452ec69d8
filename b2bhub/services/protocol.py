"""The core's rows as a plugin may read and write them, offered through
:mod:`b2bhub.plugin`: a plugin asks these functions, never queries the core's tables.

Each function does its reads and writes on the session it is given and leaves the commit
to its caller.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.models import PluginInstance


def instance_type(session: Session, name: str) -> str | None:
    """The plugin type of the instance named ``name``; None when there is none."""
    return session.scalar(select(PluginInstance.type).where(PluginInstance.name == name))
