"""The hub's per-process services: payload store, plugin registry, wake-up publisher."""

from __future__ import annotations

import functools
import logging
import os
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
    that is down costs an intake nothing (the sweep re-wakes on its schedule).

    On a Redis broker the messages go through :class:`RedisWakeups` (the same message,
    a fraction of the CPU); on any other broker through Celery's ``send_task``."""

    quiet_seconds = 5.0

    def __init__(self, app: Flask):
        self.app = app
        self._quiet_until = 0.0
        self._queues: dict[str, str] = {}
        self._lock = threading.Lock()
        self._redis: tuple[int, RedisWakeups | None] | None = None  # (pid, it)

    def publish(self, items: list[tuple[int, str]]) -> None:
        if time.monotonic() < self._quiet_until:
            return
        try:
            # To the queue straight (the nameless exchange): the topic exchange would
            # cost a lookup of its bindings in the broker on every publish, and it
            # binds every delivery key to the queue anyway.
            wakeups = [(self._queue_name(target), target, delivery_id)
                       for delivery_id, target in items]
            redis = self._redis_wakeups()
            if redis is not None:
                redis.send(wakeups)
                return
            from celeryconfig import delivery_queue
            celery = self.app.extensions["celery"]
            for name, target, delivery_id in wakeups:
                # By the task's name: the tasks module builds on this one, not back.
                queue = delivery_queue(name)
                celery.send_task(DELIVER_TASK, args=[target, delivery_id], retry=False,
                                 exchange="", routing_key=name, queue=queue)
        except Exception:
            self._quiet_until = time.monotonic() + self.quiet_seconds
            raise

    def _redis_wakeups(self) -> RedisWakeups | None:
        """This process's :class:`RedisWakeups`, None on another broker. Made once per
        process (a forked child makes its own); a broker that is down raises, and the
        next publish tries again."""
        made = self._redis
        if made is not None and made[0] == os.getpid():
            return made[1]
        with self._lock:
            if self._redis is None or self._redis[0] != os.getpid():
                celery = self.app.extensions["celery"]
                self._redis = (os.getpid(), RedisWakeups.for_app(celery))
            return self._redis[1]

    def _queue_name(self, target: str) -> str:
        """The queue of the target's wake-ups (read once per process)."""
        name = self._queues.get(target)
        if name is None:
            with self._lock:
                if target not in self._queues:
                    with self.app.app_context(), new_session() as s:
                        self._queues[target] = s.scalar(select(PluginInstance.queue).where(
                            PluginInstance.name == target)) or "deliveries"
                name = self._queues[target]
        return name


class RedisWakeups:
    """Wake-up messages pushed onto a Redis broker's queue lists by one client kept per
    process, on the connection pool of kombu's own channel (its URL, timeouts and no
    retries). The message is the one ``send_task`` publishes: Celery's ``as_task_v2``
    makes the task message, kombu's channel its envelope (body encoding, delivery tag,
    priority list). ``send_task`` spent about 0.5 ms of CPU per wake-up, over a fifth of
    an intake request: kombu makes a new Redis client per publish, and Celery's routing,
    signals and options come with each; this is about 0.1 ms. Wake-ups of one call go in
    one round trip."""

    def __init__(self, celery, connection, channel):
        from kombu import serialization
        from kombu.utils.json import dumps
        self.celery, self.connection, self.channel = celery, connection, channel
        self.client = channel.Client(connection_pool=channel.pool)
        self._serialize = functools.partial(serialization.dumps,
                                            serializer=celery.conf.task_serializer)
        self._dumps = dumps

    @classmethod
    def for_app(cls, celery) -> RedisWakeups | None:
        """None unless the broker is plain Redis with kombu's usual key names (no key
        prefix): the other transports publish through ``send_task``. Connects (raises
        when the broker is down)."""
        connection = celery.connection_for_write()
        if (connection.transport_cls not in ("redis", "rediss")
                or celery.conf.broker_transport_options.get("global_keyprefix")):
            connection.release()
            return None
        try:
            channel = connection.default_channel
            if not all(hasattr(channel, name) for name in _KOMBU_CHANNEL_API):
                connection.release()
                return None
            return cls(celery, connection, channel)
        except BaseException:
            connection.release()
            raise

    def message(self, queue: str, target: str, delivery_id: int) -> tuple[str, str]:
        """The queue's list key and the message of one wake-up, as ``send_task`` makes it."""
        from kombu.utils.uuid import uuid
        headers, properties, body, _sent_event = self.celery.amqp.as_task_v2(
            uuid(), DELIVER_TASK, args=[target, delivery_id], kwargs={},
            reply_to=self.celery.thread_oid, ignore_result=None)
        content_type, content_encoding, body = self._serialize(body)
        properties["delivery_mode"] = PERSISTENT
        channel = self.channel
        message = channel.prepare_message(body, 0, content_type, content_encoding, headers,
                                          properties)
        channel._inplace_augment_message(message, "", queue)
        key = channel._q_for_pri(queue, channel._get_message_priority(message))
        return key, self._dumps(message)

    def send(self, wakeups: list[tuple[object, str, int]]) -> None:
        """Push (queue or its name, target, delivery id) wake-ups: one LPUSH, or one
        pipeline."""
        by_key: dict[str, list[str]] = {}
        for queue, target, delivery_id in wakeups:
            key, message = self.message(getattr(queue, "name", queue), target, delivery_id)
            by_key.setdefault(key, []).append(message)
        if len(by_key) == 1:
            [(key, messages)] = by_key.items()
            self.client.lpush(key, *messages)
        elif by_key:
            with self.client.pipeline(transaction=False) as pipe:
                for key, messages in by_key.items():
                    pipe.lpush(key, *messages)
                pipe.execute()


#: kombu's delivery mode of a message kept across a broker restart (``send_task``'s)
PERSISTENT = 2
#: what :class:`RedisWakeups` uses of kombu's virtual channel
_KOMBU_CHANNEL_API = ("prepare_message", "_inplace_augment_message", "_q_for_pri",
                      "_get_message_priority", "Client", "pool")


def due_targets(session: Session) -> list[tuple[int, str]]:
    """One wake-up per target that has claimable deliveries due now (worker start)."""
    rows = session.execute(
        select(Delivery.target, func.min(Delivery.id))
        .where(Delivery.state.in_(["queued", "retrying", "stalled"]),
               Delivery.due_at <= utcnow() + timedelta(seconds=1))
        .group_by(Delivery.target))
    return [(delivery_id, target) for target, delivery_id in rows]
