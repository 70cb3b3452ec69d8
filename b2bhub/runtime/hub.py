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

from b2bhub.config.extensions import db
from b2bhub.domain.callbacks import CallbackTokens
from b2bhub.engine import presence, wakeups
from b2bhub.models import Delivery, PluginInstance, utcnow
from b2bhub.payloads.backends import PayloadBackend, open_payload_store
from b2bhub.plugin.registry import get_registry

log = logging.getLogger(__name__)
DELIVER_TASK = "b2bhub.deliver"  # b2bhub.runtime.tasks.deliver


def hub_init_app(app: Flask) -> None:
    app.extensions["b2bhub.store"] = open_payload_store(
        app.config.get("PAYLOAD_URL"), app.config["PAYLOAD_DIR"],
        endpoint_url=app.config.get("S3_ENDPOINT_URL"))
    registry = app.extensions["b2bhub.plugin.registry"] = (app.config.get("PLUGIN_REGISTRY")
                                                    or get_registry())
    wakeups.set_claim_batch(lambda type_name: getattr(
        registry.get(type_name), "claim_batch", 1) if type_name in registry else 1)
    if "WAKEUP_PUBLISHER" in app.config:
        wakeups.set_publisher(app.config["WAKEUP_PUBLISHER"])
    else:
        wakeups.set_publisher(CeleryPublisher(app).publish)


def prepare_publisher(app: Flask) -> None:
    """Load the broker's transport now (kombu's module for it and its client library,
    a few hundred milliseconds of imports), not in the first request that publishes a
    wake-up: the web process calls this at start. Nothing connects; a broker that is
    down or unknown is left to the first publish to report."""
    if "WAKEUP_PUBLISHER" in app.config or "celery" not in app.extensions:
        return
    try:
        app.extensions["celery"].connection_for_write().release()
    except Exception:  # noqa: BLE001 - the first publish says what is wrong
        log.debug("the broker's transport did not load", exc_info=True)


def store() -> PayloadBackend:
    return current_app.extensions["b2bhub.store"]


def registry():
    return current_app.extensions["b2bhub.plugin.registry"]


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
    signals and options come with each; this is about 0.1 ms, most of it the message made
    by Celery, so the message is filled in from a template of Celery's own making (a
    fraction of that again). Wake-ups of one call go in one round trip."""

    def __init__(self, celery, connection, channel):
        import base64

        from kombu import serialization
        from kombu.utils.json import dumps
        from kombu.utils.uuid import uuid
        self.celery, self.connection, self.channel = celery, connection, channel
        self.client = channel.Client(connection_pool=channel.pool)
        self._serialize = functools.partial(serialization.dumps,
                                            serializer=celery.conf.task_serializer)
        self._dumps = dumps
        self._templates: dict[tuple[str, str], tuple[str, str, tuple, tuple] | bool] = {}
        self._uuid, self._b64 = uuid, base64.b64encode

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
        """The queue's list key and the message of one wake-up, as ``send_task`` makes it:
        from a template per (queue, target) that Celery and kombu made once, so only its
        ids, its args and its body are new per wake-up (the whole of ``as_task_v2``, its
        configuration lookups and ``saferepr`` cost about 0.7 ms a message on a slow
        two-core machine, a tenth of an intake's CPU there). A target whose name holds the
        template's mark is made the slow way."""
        made = self._templates.get((queue, target))
        if made is None:
            made = self._templates[(queue, target)] = self._template(queue, target)
        if made is False:
            return self._made(queue, target, delivery_id, self._uuid(),
                              self.celery.thread_oid, self._uuid())
        return self._fill(made, delivery_id, self._uuid(), self.celery.thread_oid,
                          self._uuid())

    def _made(self, queue: str, target: str, delivery_id: int, task_id: str, reply_to: str,
              tag: str, body: str | None = None) -> tuple[str, str]:
        """One wake-up made by Celery (``as_task_v2``) and kombu's channel, with the ids
        given; ``body``, when given, in place of the encoded body."""
        headers, properties, message_body, _sent_event = self.celery.amqp.as_task_v2(
            task_id, DELIVER_TASK, args=[target, delivery_id], kwargs={},
            reply_to=reply_to, ignore_result=None)
        content_type, content_encoding, message_body = self._serialize(message_body)
        properties["delivery_mode"] = PERSISTENT
        channel = self.channel
        message = channel.prepare_message(message_body, 0, content_type, content_encoding,
                                          headers, properties)
        channel._inplace_augment_message(message, "", queue)
        message["properties"]["delivery_tag"] = tag
        if body is not None:
            message["body"] = body
        key = channel._q_for_pri(queue, channel._get_message_priority(message))
        return key, self._dumps(message)

    def _template(self, queue: str, target: str) -> tuple[str, str, tuple, tuple] | bool:
        """A wake-up made by :meth:`_made` with marks where a wake-up's own values go, as a
        format string, with the args' repr (JSON-escaped) and the body's JSON split at the
        delivery id; False when a mark is not where it belongs."""
        number = 918273645546372819
        body = self._serialize(((target, number), {}, {"callbacks": None, "errbacks": None,
                                                       "chain": None, "chord": None}))[2]
        body = body.decode() if isinstance(body, bytes) else body
        args = self._dumps(repr([target, number]))[1:-1]
        key, text = self._made(queue, target, number, "b2bhub0id0mark", "b2bhub0reply0mark",
                               "b2bhub0tag0mark", body="b2bhub0body0mark")
        check_key, check = self._made(queue, target, 7, "b2bhub0id0mark", "b2bhub0reply0mark",
                                      "b2bhub0tag0mark")
        parts = text.replace("{", "{{").replace("}", "}}")
        for mark, slot in (('"b2bhub0id0mark"', '"{id}"'), (f'"{args}"', '"{args}"'),
                           ('"b2bhub0body0mark"', '"{body}"'),
                           ('"b2bhub0reply0mark"', '"{reply_to}"'),
                           ('"b2bhub0tag0mark"', '"{tag}"')):
            parts = parts.replace(mark, slot)
        made = (key, parts, tuple(args.split(str(number))), tuple(body.split(str(number))))
        if (str(number) in parts or len(made[2]) != 2 or len(made[3]) != 2
                or self._fill(made, 7, "b2bhub0id0mark", "b2bhub0reply0mark",
                              "b2bhub0tag0mark") != (check_key, check)):
            return False
        return made

    def _fill(self, made: tuple, delivery_id: int, task_id: str, reply_to: str, tag: str
              ) -> tuple[str, str]:
        key, parts, args, body = made
        number = str(delivery_id)
        return key, parts.format(
            id=task_id, args=f"{args[0]}{number}{args[1]}",
            body=self._b64(f"{body[0]}{number}{body[1]}".encode()).decode(),
            reply_to=reply_to, tag=tag)

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
