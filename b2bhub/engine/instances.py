"""The state of a plugin instance as its processes start it (SPEC 3).

An instance that cannot start ends in state Error with the reason and raises
``plugin_failed``; one that starts is Running and its ``plugin_failed`` is resolved.
Both are written in the caller's transaction.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from b2bhub.domain.i18n import N_
from b2bhub.engine.history import add_line, raise_alert, resolve_alert
from b2bhub.engine.machine.wake import wake_target
from b2bhub.engine.operator import ActionRefused, UnknownObject
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
    """Record that the instance started (unless an operator stopped it meanwhile); a
    ``plugin_failed`` alert for it is resolved."""
    session.execute(update(PluginInstance).where(
        PluginInstance.name == name,
        PluginInstance.state.not_in([InstanceState.RUNNING, InstanceState.STOPPED]),
    ).values(state=InstanceState.RUNNING, state_reason="", updated_at=now))
    resolve_alert(session, PLUGIN_FAILED, alert_subject(name), now=now)


# --- start and stop by an operator ---------------------------------------------------

def stop_instance(session: Session, name: str, actor: str, now: datetime) -> str:
    """Stop an instance in every process: a stopped target's deliveries are no longer
    claimed (attempts already running finish) and wait without wake-ups; a stopped
    source is no longer scanned, and a scan under way stops at its next batch. Writes a
    history line naming the operator; returns its text."""
    row = _instance_for_action(session, name)
    if row.state == InstanceState.STOPPED:
        text = f"{actor}: {name} was stopped already"
    else:
        row.state, row.state_reason, row.updated_at = (
            InstanceState.STOPPED, f"stopped by {actor}", now)
        text = f"{actor} stopped {name}"
    add_line(session, None, "instance_stopped", text, actor=actor,
             data={"instance": name}, now=now)
    return text


def start_instance(session: Session, name: str, actor: str, now: datetime) -> str:
    """Start a stopped (or failed) instance again: it is Enabled until a process starts
    it (a source at its next scan, a target at the next heartbeat of a worker); the due
    deliveries of a target are woken after the commit."""
    row = _instance_for_action(session, name)
    if row.state in (InstanceState.STOPPED, InstanceState.ERROR):
        row.state, row.state_reason, row.updated_at = InstanceState.ENABLED, "", now
        text = f"{actor} started {name}"
    else:
        text = f"{actor}: {name} was not stopped ({row.state})"
    add_line(session, None, "instance_started", text, actor=actor,
             data={"instance": name}, now=now)
    wake_target(session, name, now)
    return text


def _instance_for_action(session: Session, name: str) -> PluginInstance:
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == name))
    if row is None:
        raise UnknownObject(N_("no plugin instance named '%(name)s'", name=name))
    if not row.enabled:
        raise ActionRefused(N_('%(name)s is disabled; enable it first (PUT with "enabled": '
                               'true)', name=name))
    return row


def mark_targets_running(session: Session, registry, now: datetime) -> None:
    """A worker's heartbeat: enabled targets not yet started are Running (a worker runs
    every target it has the plugin type of)."""
    names = [name for name, type_name in session.execute(
        select(PluginInstance.name, PluginInstance.type).where(
            PluginInstance.enabled.is_(True), PluginInstance.state == InstanceState.ENABLED))
        if type_name in registry and "target" in getattr(registry.get(type_name), "roles", ())]
    for name in names:
        mark_running(session, name, now)
