"""Thin Celery tasks: they take ids, open a session and call the engine."""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_ready, worker_shutting_down
from flask import current_app

from b2bhub import hub
from b2bhub.engine import wakeups
from b2bhub.engine.runner import TargetRunner
from b2bhub.engine.stopping import stop_control
from b2bhub.engine.sweep import run_sweep
from b2bhub.models import utcnow

log = logging.getLogger(__name__)
_runner: TargetRunner | None = None


def runner() -> TargetRunner:
    global _runner
    if _runner is None:
        _runner = TargetRunner(hub.new_session, hub.registry(), hub.store(),
                               hub.process_owner())
    return _runner


@shared_task(name="b2bhub.deliver", ignore_result=True)
def deliver(target: str, delivery_id: int | None = None) -> dict:
    """A wake-up for ``target``: drain its due deliveries (the id is only a hint)."""
    report = runner().drain(target)
    if report.more_due and not stop_control.requested.is_set():
        wakeups.publish_now([(delivery_id or 0, target)])
    return report.__dict__


@shared_task(name="b2bhub.sweep", ignore_result=True)
def sweep() -> dict:
    with hub.new_session() as session:
        report = run_sweep(session, utcnow(), hub.process_owner())
    return report.__dict__


@shared_task(name="b2bhub.broker_cleanup", ignore_result=True)
def broker_cleanup() -> int:
    """kombu's SQLAlchemy transport never deletes consumed rows; remove them."""
    url = current_app.config["BROKER_URL"]
    if not url.startswith("sqla+"):
        return 0
    from sqlalchemy import create_engine, text
    engine = create_engine(url[len("sqla+"):])
    try:
        with engine.begin() as conn:
            return conn.execute(text("DELETE FROM kombu_message WHERE visible = 0")).rowcount
    except Exception:
        log.warning("broker cleanup failed", exc_info=True)
        return 0
    finally:
        engine.dispose()


@worker_ready.connect
def _take_up_due_work(sender=None, **kwargs) -> None:
    """A worker that starts takes up at once the deliveries that are due."""
    from b2bhub.worker import flask_app
    with flask_app.app_context(), hub.new_session() as session:
        wakeups.publish_now(hub.due_targets(session))


@worker_shutting_down.connect
def _stop_claiming(sig=None, how=None, **kwargs) -> None:
    from b2bhub.worker import flask_app
    grace = float(flask_app.config["STOP_GRACE"])
    log.info("stopping (%s): no new claims, running attempt has %.0f s", sig, grace)
    stop_control.request(grace)
