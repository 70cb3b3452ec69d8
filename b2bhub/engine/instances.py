"""The state of a plugin instance as its processes start it (SPEC 3).

An instance that cannot start ends in state Error with the reason and raises
``plugin_failed``; one that starts is Running and its ``plugin_failed`` is resolved.
Both are written in the caller's transaction.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import update
from sqlalchemy.orm import Session

from b2bhub.engine.history import raise_alert, resolve_alert
from b2bhub.models import InstanceState, PluginInstance

PLUGIN_FAILED = "plugin_failed"


def alert_subject(name: str) -> str:
    return f"instance:{name}"


def mark_instance_error(session: Session, name: str, reason: str, now: datetime) -> None:
    """Put the instance in state Error with ``reason`` and raise ``plugin_failed``."""
    session.execute(update(PluginInstance).where(PluginInstance.name == name).values(
        state=InstanceState.ERROR, state_reason=reason, updated_at=now))
    raise_alert(session, PLUGIN_FAILED, alert_subject(name), f"{name}: {reason}", now=now)


def mark_running(session: Session, name: str, now: datetime) -> None:
    """Record that the instance started; a ``plugin_failed`` alert for it is resolved."""
    session.execute(update(PluginInstance).where(
        PluginInstance.name == name, PluginInstance.state != InstanceState.RUNNING,
    ).values(state=InstanceState.RUNNING, state_reason="", updated_at=now))
    resolve_alert(session, PLUGIN_FAILED, alert_subject(name), now=now)
