"""Beat keeps publishing after a publish left its producer on a closed channel.

Seen in a fault run on the embedded broker: beat's first publish failed, kombu's
recovery left beat's one producer on a closed channel, and beat never published again
("channel disconnected" every tick): no scans, no sweeps. Runs on the test broker of
each backend (SQLite or Redis), on a queue of its own.
"""

from __future__ import annotations

import uuid

from celery.apps.beat import Beat
from celery.utils.imports import symbol_by_name

from b2bhub.runtime.beat import Scheduler


def _queued(celery_app, queue: str) -> int:
    with celery_app.connection_for_read() as conn:
        return conn.default_channel.queue_declare(queue, passive=True).message_count


def _purge(celery_app, queue: str) -> None:
    with celery_app.connection_for_read() as conn:
        conn.default_channel.queue_delete(queue)


def test_celery_beat_runs_the_scheduler_that_recovers(app):
    """What ``celery -A b2bhub.runtime.worker beat`` (Procfile, ``b2bhub run``) starts."""
    beat = Beat(app=app.extensions["celery"], quiet=True)
    assert symbol_by_name(beat.scheduler_cls) is Scheduler


def test_a_closed_producer_channel_stops_no_later_publish(app, tmp_path):
    celery_app = app.extensions["celery"]
    queue = f"beat-test-{uuid.uuid4().hex[:8]}"
    celery_app.conf.beat_schedule = {
        "probe": {"task": "b2bhub.sweep", "schedule": 60.0, "options": {"queue": queue}}}
    scheduler = Scheduler(celery_app, lazy=False, schedule_filename=str(tmp_path / "sched"))
    try:
        entry = scheduler.schedule["probe"]
        scheduler.apply_entry(entry, producer=scheduler.producer)
        assert _queued(celery_app, queue) == 1
        scheduler.producer.channel.close()  # the state the failed publish left it in
        scheduler.apply_entry(entry, producer=scheduler.producer)
        assert _queued(celery_app, queue) == 2  # published again on a new connection
        scheduler.apply_entry(entry, producer=scheduler.producer)
        assert _queued(celery_app, queue) == 3
    finally:
        scheduler.close()
        _purge(celery_app, queue)
