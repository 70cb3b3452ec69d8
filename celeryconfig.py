"""Celery settings; the core's periodic work declared as data in ``beat_schedule``
(plugin types' jobs are added to it from the registry: b2bhub/runtime/jobs.py).

Wake-ups go straight to the ``deliveries`` queue (b2bhub/runtime/hub.py publishes to the queue by
name, which spares the broker a lookup of the exchange's bindings per publish); each
delivery queue is also bound to a topic exchange of its name with ``delivery.#``, for a
publisher that sends routing key ``delivery.<target instance>``. An instance given a
queue of its own is served by workers started with that queue in
``B2BHUB_WORKER_QUEUES``.
"""

import os

from kombu import Exchange, Queue


def delivery_queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="topic"), routing_key="delivery.#")


_names = [q.strip() for q in os.environ.get("B2BHUB_WORKER_QUEUES",
                                            "deliveries,default").split(",") if q.strip()]
task_queues = [Queue("default", Exchange("default", type="direct"), routing_key="default")]
task_queues += [delivery_queue(n) for n in _names if n != "default"]
task_default_queue = "default"
task_default_exchange = "default"
task_default_routing_key = "default"
task_ignore_result = True
task_acks_late = False  # a wake-up is a hint; the database holds the work
worker_prefetch_multiplier = 1
worker_hijack_root_logger = False
worker_send_task_events = False
broker_connection_retry_on_startup = True
broker_connection_timeout = 3
# Redis only (b2bhub/runtime/celery_app.py); kombu's SQLAlchemy transport hands its options to
# create_engine, which refuses these. max_retries 0: a publish to a broker that is down
# fails at once instead of retrying the connection for seconds inside the intake that
# published (the sweep re-wakes later).
redis_transport_options = {"socket_connect_timeout": 3, "socket_timeout": 10,
                           "visibility_timeout": 3600, "max_retries": 0}
timezone = "UTC"
enable_utc = True

beat_schedule = {
    "sweep": {"task": "b2bhub.sweep", "schedule": 5.0,
              "options": {"expires": 5.0}},
    # the due probes of targets (b2bhub.engine.probes), each instance at its interval
    "probes": {"task": "b2bhub.probe_targets", "schedule": 5.0,
               "options": {"expires": 5.0}},
    "source-scheduler": {"task": "b2bhub.schedule_sources", "schedule": 1.0,
                         "options": {"expires": 2.0}},
    # acknowledgments received matched to what we sent, overdue ones raised (docs/edi.md)
    "edi-acks": {"task": "b2bhub.edi_acks", "schedule": 5.0,
                 "options": {"expires": 5.0}},
    # expected-message rules: windows planned, messages matched, missed ones raised
    # (docs/expected-messages.md)
    "expected": {"task": "b2bhub.expected", "schedule": 5.0,
                 "options": {"expires": 5.0}},
    # the functional acknowledgments due to partners (b2bhub.engine.acks)
    "acks": {"task": "b2bhub.make_acks", "schedule": 5.0, "options": {"expires": 5.0}},
    "notify": {"task": "b2bhub.notify", "schedule": 5.0,
               "options": {"expires": 5.0}},
    "housekeeping": {"task": "b2bhub.housekeeping", "schedule": 60.0,
                     "options": {"expires": 60.0}},
    # the nightly cleanup: each tick checks whether its time (System > Settings) has come
    "cleanup": {"task": "b2bhub.cleanup",
                "schedule": float(os.environ.get("B2BHUB_CLEANUP_TICK", "60")),
                "options": {"expires": 60.0}},
    "broker-cleanup": {"task": "b2bhub.broker_cleanup", "schedule": 300.0,
                       "options": {"expires": 60.0}},
    # certificates and OpenPGP keys of every profile kind that end within 30 days
    "certificates": {"task": "b2bhub.check_certificates", "schedule": 3600.0,
                     "options": {"expires": 600.0}},
}
# Celery's persistent scheduler, recovering from a publish that leaves its producer on a
# closed channel (it would otherwise never publish again): b2bhub/runtime/beat.py
beat_scheduler = "b2bhub.runtime.beat:Scheduler"
