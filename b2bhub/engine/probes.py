"""Probes (SPEC 6 and 8; the keep-alive of seed 003, the heartbeat of seed 000): is a
target's destination up, and what the hub does while it is not.

A target type may implement ``probe() -> bool | None`` (``b2bhub.plugin``): True
online, False offline, None "this instance has no probe" (an ``http_poster`` without a
``probe_url``). A probe that raises counts as offline, and the exception's text is the
reason shown; it should be cheap and bound its own network time.

Schedule. Beat publishes ``b2bhub.probe_targets`` every :data:`TICK_SECONDS`; the worker
that gets it runs :meth:`ProbeRunner.tick`. Under the ``probes`` guard (the sweep's kind
of guard, ``b2bhub.engine.sweep.SweepGuard``: with two beats, one tick at a time decides)
it picks the due instances: enabled, Running targets whose type has a probe, whose
``locks`` row ``probe:<instance>`` says their interval has elapsed. That row moves one
interval on in the same conditional UPDATE, so each instance is picked once per
interval, whatever else runs at once. The interval is the instance's
``probe_interval`` in seconds, or, when that is 0 (the default), the System > Settings
``probe_interval`` (default 60 s); the tick rounds it up to its next 5 s. A shortened
interval applies at the next tick, not only after the longer one ran out.

Run. The workers run the probes (SPEC 1): each due probe runs on a thread of its own in
the worker that ticked, so the tick returns at once, the worker goes on with its
deliveries and the sweep, and a slow probe holds up no other instance's. A probe that
has not answered within :data:`TIMEOUT_SECONDS` (at most its interval) counts as offline
(``no answer within 10 s``); its thread is left to end on its own, and that instance is
not probed again by this process while it hangs (another worker may).

Record. The result goes on the instance row: ``online``, ``probe_checked_at`` (when
the probe began) and ``probe_text``, unless a probe that began later was recorded
already (a slow answer never overwrites a newer one). Going offline raises
``target_offline`` once (it stays open while offline). Meanwhile the target's
deliveries are not claimed, so no attempt goes out and none is used up, and the sweep
neither wakes nor stalls them (``b2bhub.engine.machine.wake``). Online again (or no probe any
more) resolves the alert and wakes the due deliveries once the transaction commits.
Probe results never enter history: the changes go to the log, the alerts and the
instance's own fields (Services, Plugins, dashboard, API, ``/stats``, ``/metrics``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from b2bhub.engine.history import raise_alert, resolve_alert
from b2bhub.engine.instances import alert_subject, wake_target
from b2bhub.engine.scans import ensure_lease_rows, publish_due
from b2bhub.engine.settings import DeliverySettings, load_settings
from b2bhub.engine.sweep import SweepGuard
from b2bhub.models import InstanceState, PluginInstance, utcnow
from b2bhub.plugin import Plugin

log = logging.getLogger(__name__)
TARGET_OFFLINE = "target_offline"
TICK_SECONDS = 5.0
TIMEOUT_SECONDS = 10.0
TEXT_LENGTH = 500


@dataclass(frozen=True)
class ProbeResult:
    online: bool | None  # None: the instance has no probe
    text: str


def lock_name(instance: str) -> str:
    return f"probe:{instance}"


def has_probe(cls: type) -> bool:
    """A target type that implements ``probe`` (an instance may still answer None)."""
    probe = getattr(cls, "probe", None)
    return "target" in getattr(cls, "roles", ()) and callable(probe) \
        and probe is not Plugin.probe


def probe_interval(instance_value: int | None, settings: DeliverySettings) -> int:
    """Seconds between probes: the instance's own, or the setting's when that is 0."""
    return instance_value if instance_value and instance_value > 0 \
        else settings.probe_interval


# --- the schedule -------------------------------------------------------------------

def due_probes(session: Session, registry, now: datetime,
               settings: DeliverySettings | None = None) -> list[tuple[str, int]]:
    """The instances to probe now, each with its interval; each is marked as published
    (due again one interval later) before the commit. Instances whose type has no probe
    but that still show a probe result (the type changed) are cleared on the way."""
    settings = settings or load_settings(session)
    rows = session.execute(select(
        PluginInstance.name, PluginInstance.type, PluginInstance.probe_interval,
        PluginInstance.online).where(PluginInstance.enabled.is_(True),
                                     PluginInstance.state == InstanceState.RUNNING)
        .order_by(PluginInstance.name)).all()
    known = [r for r in rows if r.type in registry]
    probed = {r.name: probe_interval(r.probe_interval, settings) for r in known
              if has_probe(registry.get(r.type))}
    for r in known:
        if r.name not in probed and r.online is not None:
            record(session, r.name, ProbeResult(None, f"type {r.type} has no probe"), now,
                   now)
    ensure_lease_rows(session, [lock_name(name) for name in probed])
    due = [(name, interval) for name, interval in probed.items()
           if publish_due(session, lock_name(name), interval, now, slack=TICK_SECONDS)]
    session.commit()
    return due


# --- the record ---------------------------------------------------------------------

def record(session: Session, name: str, result: ProbeResult, started: datetime,
           now: datetime) -> str:
    """Write a probe's result on the instance in the caller's transaction. Returns
    ``offline`` or ``online`` when the instance went offline or came back (alert raised
    or resolved, due deliveries woken after the commit), ``same`` when nothing changed
    but the time and text, ``stale`` when a probe begun later was recorded already."""
    fresh = and_(PluginInstance.name == name, or_(PluginInstance.probe_checked_at.is_(None),
                                                  PluginInstance.probe_checked_at < started))
    values = {"online": result.online, "probe_checked_at": started,
              "probe_text": result.text[:TEXT_LENGTH],
              # not a change of configuration: the runners' plugins stay as built
              "updated_at": PluginInstance.updated_at}
    crossing = PluginInstance.online.is_not(False) if result.online is False \
        else PluginInstance.online.is_(False)
    if _update(session, and_(fresh, crossing), values):
        if result.online is False:
            raise_alert(session, TARGET_OFFLINE, alert_subject(name),
                        f"{name} is offline: {result.text}", now=now)
            log.warning("%s is offline: %s; its deliveries wait", name, result.text)
            return "offline"
        resolve_alert(session, TARGET_OFFLINE, alert_subject(name), now=now)
        wake_target(session, name, now)
        log.info("%s is online again (%s); its due deliveries are woken", name,
                 result.text)
        return "online"
    return "same" if _update(session, fresh, values) else "stale"


def _update(session: Session, where, values: dict) -> bool:
    return session.execute(update(PluginInstance).where(where).values(values)
                           .execution_options(synchronize_session=False)).rowcount == 1


# --- the runner ---------------------------------------------------------------------

class ProbeRunner:
    """Ticks and runs the probes of one process (see the module docstring)."""

    def __init__(self, registry, owner: str, timeout: float = TIMEOUT_SECONDS,
                 clock: Callable[[], datetime] = utcnow):
        self.registry, self.owner, self.timeout, self.clock = registry, owner, timeout, clock
        self._plugins: dict[str, tuple[datetime, Any]] = {}
        self._busy: dict[str, threading.Thread] = {}  # probes (or hung calls) running
        self._lock = threading.Lock()

    def tick(self, session: Session) -> list[threading.Thread]:
        """Start the due probes, each on a thread of its own (returned, for tests);
        nothing when another process holds the guard."""
        now = self.clock()
        with SweepGuard(session, self.owner, now, name="probes") as held:
            if not held:
                return []
            due = due_probes(session, self.registry, now)
        bind = session.get_bind()
        started = []
        for name, interval in due:
            thread = threading.Thread(target=self.probe, args=(bind, name, interval),
                                      name=f"probe-{name}", daemon=True)
            with self._lock:
                if self._running(name):
                    log.info("%s: the last probe has not ended yet; not probed again",
                             name)
                    continue
                self._busy[name] = thread
            thread.start()
            started.append(thread)
        return started

    def _running(self, name: str) -> bool:
        thread = self._busy.get(name)
        return thread is not None and thread.is_alive()

    def probe(self, bind, name: str, interval: float) -> str:
        """Probe one instance and record the result; what :func:`record` returned, or
        ``gone`` when the instance can no longer be probed."""
        try:
            with Session(bind, expire_on_commit=False) as session:
                row = session.scalar(select(PluginInstance).where(
                    PluginInstance.name == name))
                session.commit()
                if row is None or not row.enabled or row.type not in self.registry:
                    return "gone"
                started = self.clock()
                result = self.call(name, self._plugin(row), min(self.timeout, interval))
                outcome = record(session, name, result, started, self.clock())
                session.commit()
                return outcome
        except Exception:
            log.exception("%s: the probe could not be recorded", name)
            return "error"

    def call(self, name: str, plugin, timeout: float) -> ProbeResult:
        """Run ``plugin.probe()`` on a thread of its own for at most ``timeout``
        seconds; a call still running then stays this instance's busy thread."""
        answer: dict[str, Any] = {}

        def run() -> None:
            try:
                answer["value"] = plugin.probe()
            except Exception as exc:
                answer["error"] = exc

        thread = threading.Thread(target=run, name=f"probe-call-{name}", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            with self._lock:
                self._busy[name] = thread
            return ProbeResult(False, f"no answer within {timeout:g} s")
        if "error" in answer:
            exc = answer["error"]
            return ProbeResult(False, f"probe failed: {type(exc).__name__}: {exc}")
        value = answer.get("value")
        if value is None:
            return ProbeResult(None, "this instance has no probe")
        if value is True:
            return ProbeResult(True, "the probe answered online")
        if value is False:
            return ProbeResult(False, "the probe answered offline")
        return ProbeResult(False, f"probe returned {value!r} instead of True, False or None")

    def _plugin(self, row: PluginInstance):
        """The instance's plugin object for probes, rebuilt when its configuration
        changed (its own object: a probe runs beside the deliveries' attempts)."""
        cached = self._plugins.get(row.name)
        if cached is None or cached[0] != row.updated_at:
            cached = (row.updated_at, self.registry.get(row.type)(row.name,
                                                                  dict(row.config or {})))
            self._plugins[row.name] = cached
        return cached[1]
