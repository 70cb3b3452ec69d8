"""Celery through Flask's own pattern: tasks run inside an app context."""

from __future__ import annotations

from celery import Celery, Task
from flask import Flask


def celery_init_app(app: Flask) -> Celery:
    class FlaskTask(Task):
        def __call__(self, *args: object, **kwargs: object) -> object:
            with app.app_context():
                return self.run(*args, **kwargs)

    celery_app = Celery(app.name, task_cls=FlaskTask)
    celery_app.config_from_object("celeryconfig")
    celery_app.conf.broker_url = app.config["BROKER_URL"]
    from b2bhub.plugin.registry import get_registry
    from b2bhub.runtime.jobs import beat_entries
    celery_app.conf.beat_schedule = {
        **celery_app.conf.beat_schedule,
        **beat_entries(app.config.get("PLUGIN_REGISTRY") or get_registry())}
    celery_app.conf.beat_schedule_filename = app.config["DATA_DIR"] + "/celerybeat-schedule"
    if app.config["BROKER_URL"].startswith("sqla+"):
        # this transport hands its options to create_engine(), which refuses the Redis
        # socket options of celeryconfig: the worker would not start
        celery_app.conf.broker_transport_options = {}
        _tune_sqlalchemy_transport()
    elif app.config["BROKER_URL"].startswith(("redis://", "rediss://")):
        # Redis only: the SQLAlchemy transport hands its transport options to
        # create_engine(), which refuses these
        from celeryconfig import redis_transport_options
        celery_app.conf.broker_transport_options = dict(redis_transport_options)
    celery_app.set_default()
    app.extensions["celery"] = celery_app
    celery_app.flask_app = app  # for the worker's signal handlers (b2bhub.runtime.tasks)
    import b2bhub.runtime.tasks  # noqa: F401  (registers the shared tasks)
    return celery_app


#: longest wait for a message of a worker on the embedded broker between stop checks
STOP_CHECK_SECONDS = 0.4


def _tune_sqlalchemy_transport() -> None:
    """The embedded broker polls its table; the transport refuses ``polling_interval``
    as a transport option, but honours the class attribute."""
    from kombu.transport import sqlalchemy as sqla_transport
    sqla_transport.Channel.polling_interval = 0.2
    # A solo worker on a polling transport checks for a stop between two waits for a
    # message, and Celery waits 2 s at a time: a stop took 3.5 s of an idle worker.
    # Waiting at most STOP_CHECK_SECONDS at a time makes it notice within that (an
    # empty wait raises socket.timeout, which the worker's loop expects and ignores).
    if not getattr(sqla_transport.Transport, "_b2bhub_short_waits", False):
        drain = sqla_transport.Transport.drain_events

        def drain_events(self, connection, timeout=None):
            if timeout is None or timeout > STOP_CHECK_SECONDS:
                timeout = STOP_CHECK_SECONDS
            return drain(self, connection, timeout=timeout)

        sqla_transport.Transport.drain_events = drain_events
        sqla_transport.Transport._b2bhub_short_waits = True
