"""The hub's per-process services: payload store, plugin registry, wake-up publisher."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from flask import Flask, current_app
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.domain.callbacks import CallbackTokens
from b2bhub.engine import presence, wakeups
from b2bhub.extensions import db
from b2bhub.models import Delivery, PluginInstance, utcnow
from b2bhub.payload_backends import PayloadBackend, open_payload_store
from b2bhub.registry import get_registry

log = logging.getLogger(__name__)
DELIVER_TASK = "b2bhub.deliver"  # b2bhub.tasks.deliver


def hub_init_app(app: Flask) -> None:
    app.extensions["b2bhub.store"] = open_payload_store(
        app.config.get("PAYLOAD_URL"), app.config["PAYLOAD_DIR"],
        endpoint_url=app.config.get("S3_ENDPOINT_URL"))
    registry = app.extensions["b2bhub.registry"] = (app.config.get("PLUGIN_REGISTRY")
                                                    or get_registry())
    wakeups.set_claim_batch(lambda type_name: getattr(
        registry.get(type_name), "claim_batch", 1) if type_name in registry else 1)
    if "WAKEUP_PUBLISHER" in app.config:
        wakeups.set_publisher(app.config["WAKEUP_PUBLISHER"])
    else:
        wakeups.set_publisher(CeleryPublisher(app).publish)


def store() -> PayloadBackend:
    return current_app.extensions["b2bhub.store"]


def registry():
    return current_app.extensions["b2bhub.registry"]


def callback_tokens() -> CallbackTokens:
    """This hub's callback URLs and idempotency keys (its secret key and public URL)."""
    return CallbackTokens(current_app.config["SECRET_KEY"], current_app.config["PUBLIC_URL"])


def new_session() -> Session:
    """A plain session on the app's engine (runner threads, sweep)."""
    return Session(db.engine, expire_on_commit=False)


def process_owner() -> str:
    """The lease owner name of this process."""
    return presence.PROCESS_ID


class CeleryPublisher:
    """Publishes wake-ups; after a failure it stays quiet for a few seconds, so a broker
    that is down costs an intake nothing (the sweep re-wakes on its schedule)."""

    quiet_seconds = 5.0

    def __init__(self, app: Flask):
        self.app = app
        self._quiet_until = 0.0
        self._queues: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def publish(self, items: list[tuple[int, str]]) -> None:
        if time.monotonic() < self._quiet_until:
            return
        celery = self.app.extensions["celery"]
        try:
            for delivery_id, target in items:
                # By the task's name: the tasks module builds on this one, not back. To
                # the queue straight (the nameless exchange): the topic exchange would
                # cost a lookup of its bindings in the broker on every publish, and it
                # binds every delivery key to the queue anyway.
                queue = self._queue(target)
                celery.send_task(DELIVER_TASK, args=[target, delivery_id], retry=False,
                                 exchange="", routing_key=queue.name, queue=queue)
        except Exception:
            self._quiet_until = time.monotonic() + self.quiet_seconds
            raise

    def _queue(self, target: str):
        from celeryconfig import delivery_queue
        with self._lock:
            if target not in self._queues:
                with self.app.app_context(), new_session() as s:
                    self._queues[target] = s.scalar(select(PluginInstance.queue).where(
                        PluginInstance.name == target))
        return delivery_queue(self._queues[target] or "deliveries")


def due_targets(session: Session) -> list[tuple[int, str]]:
    """One wake-up per target that has claimable deliveries due now (worker start)."""
    rows = session.execute(
        select(Delivery.target, func.min(Delivery.id))
        .where(Delivery.state.in_(["queued", "retrying", "stalled"]),
               Delivery.due_at <= utcnow() + timedelta(seconds=1))
        .group_by(Delivery.target))
    return [(delivery_id, target) for target, delivery_id in rows]
