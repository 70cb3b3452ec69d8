"""A delivery attempted inside the request that received its message (a source's
synchronous mode, the HTTP receiver's ``mode = sync``), offered to every source through
:mod:`b2bhub.plugin`.

It lives with the processes because it uses the web process's own services (its
runner, sessions, payload store and callback tokens, :mod:`b2bhub.runtime.hub`). The
attempts are the engine's own claim, attempt and settlement
(:meth:`b2bhub.engine.runner.TargetRunner.attempt_now`) on the web process's runner:
nothing of the delivery is read before the claim, the settings come from the request's
lookups (:mod:`b2bhub.engine.endpoint_lookup`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.engine import wakeups
from b2bhub.engine.settings import KEY, DeliverySettings
from b2bhub.models import Delivery, PluginInstance

_runner_lock = threading.Lock()
_runner = None


@dataclass(frozen=True)
class InRequest:
    """What :func:`deliver_in_request` did: ``result`` the last attempt's
    (``outcome``, ``state``, ``attempts_allowed``; None when none was made) and
    ``attempts`` how many were made."""

    result: Any
    attempts: int


def _sync_runner():
    """The web process's runner for in-request attempts (one per process and app)."""
    global _runner
    from b2bhub.engine.runner import TargetRunner
    from b2bhub.runtime.hub import callback_tokens, new_session, process_owner, registry, store
    made_for = (registry(), store())
    with _runner_lock:
        if _runner is None or (_runner.registry, _runner.store) != made_for:
            _runner = TargetRunner(new_session, *made_for, process_owner(),
                                   callbacks=callback_tokens())
        return _runner


def deliver_in_request(session: Session, delivery_id: int, target: str, settings_rows: dict,
                       interval: float = 1.0) -> InRequest:
    """Attempts ``interval`` seconds apart while the last one left the delivery Retrying,
    up to the attempts the target's policy allows (the first attempt tells them); a
    failure the policy would retry stays Retrying, so the asynchronous path still gets an
    attempt of its own. ``settings_rows``: the settings rows the request read
    (``INTAKE_KEYS``). Once the delivery was claimed here, the wake-up its intake queued
    is dropped: it was settled, or left Retrying with a wake-up time of its own (a worker
    woken now would find it not due); one never claimed keeps it, for a worker."""
    settings = DeliverySettings.from_dict(settings_rows.get(KEY))
    runner, result, made = _sync_runner(), None, 0
    while True:
        got = runner.attempt_now(delivery_id, target, keep_retrying=True, settings=settings)
        if got is None:
            break
        made, result = made + 1, got
        if got.state != "retrying" or made >= got.attempts_allowed:
            break
        time.sleep(interval)
    if made:
        wakeups.forget(session, [delivery_id])
    return InRequest(result, made)


def delivery_standing(session: Session, message_id: int, target: str
                      ) -> tuple[str, bool | None]:
    """The state of the message's delivery to ``target`` and whether the target is
    online (None: not probed), in one statement."""
    state, online = session.execute(
        select(Delivery.state, PluginInstance.online)
        .join(PluginInstance, PluginInstance.name == Delivery.target)
        .where(Delivery.message_id == message_id, Delivery.target == target)).one()
    return state, online
