"""Thin Celery tasks: they take ids, open a session and call the engine."""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import beat_init, worker_ready, worker_shutdown, worker_shutting_down
from flask import current_app
from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub import hub
from b2bhub.agent import start_agent, stop_agent
from b2bhub.engine import presence, wakeups
from b2bhub.engine.instances import mark_targets_running
from b2bhub.engine.runner import TargetRunner
from b2bhub.engine.scans import SourceRunner, due_scans
from b2bhub.engine.stats import sample_minutes
from b2bhub.engine.stopping import stop_control
from b2bhub.engine.sweep import run_sweep
from b2bhub.models import InstanceState, PluginInstance, utcnow

log = logging.getLogger(__name__)
_runner: TargetRunner | None = None
_sources: SourceRunner | None = None


def runner() -> TargetRunner:
    global _runner
    if _runner is None:
        _runner = TargetRunner(hub.new_session, hub.registry(), hub.store(),
                               hub.process_owner())
    return _runner


def sources() -> SourceRunner:
    global _sources
    if _sources is None:
        _sources = SourceRunner(hub.new_session, hub.registry(), hub.store(),
                                hub.process_owner(), should_stop=stop_control.requested.is_set)
    return _sources


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


@shared_task(name="b2bhub.scan_source", ignore_result=True)
def scan_source(instance: str) -> dict:
    """One scan of a scheduled source, unless another process is scanning it."""
    report = sources().scan(instance)
    return {"ran": report.ran, "reason": report.reason, "messages": len(report.messages)}


@shared_task(name="b2bhub.schedule_sources", ignore_result=True)
def schedule_sources() -> int:
    """Publish a scan of each scheduled source whose polling interval has elapsed."""
    with hub.new_session() as session:
        due = due_scans(session, hub.registry(), utcnow())
    for instance, interval in due:
        scan_source.apply_async(args=[instance], expires=max(interval, 5.0), retry=False)
    return len(due)


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


@shared_task(name="b2bhub.housekeeping", ignore_result=True)
def housekeeping() -> dict:
    """Every minute: the dashboard's per-minute samples, and the trim of log records
    and of processes long gone."""
    with hub.new_session() as session:
        sampled = sample_minutes(session, utcnow())
        session.commit()
        trimmed = presence.trim(session, utcnow())
        session.commit()
    return {"sampled": sampled, "log_records_trimmed": trimmed}


def worker_heartbeat(session: Session) -> list[str]:
    """At each heartbeat of a worker: forget the plugins of stopped instances, mark
    started targets Running; the instances this worker runs."""
    stopped = set(session.scalars(select(PluginInstance.name).where(
        PluginInstance.state == InstanceState.STOPPED)))
    mark_targets_running(session, hub.registry(), utcnow())
    names: set[str] = set()
    for each in (_runner, _sources):
        if each is not None:
            each.forget(stopped)
            names.update(each.running())
    return sorted(names)


@worker_ready.connect
def _start_worker_agent(sender=None, **kwargs) -> None:
    from b2bhub.worker import flask_app
    start_agent(flask_app, "worker", worker_heartbeat)


@worker_shutdown.connect
def _stop_worker_agent(sender=None, **kwargs) -> None:
    stop_agent()


@beat_init.connect
def _start_beat_agent(sender=None, **kwargs) -> None:
    from b2bhub.worker import flask_app
    start_agent(flask_app, "beat")


@worker_ready.connect
def _take_up_due_work(sender=None, **kwargs) -> None:
    """A worker that starts takes up at once the deliveries that are due."""
    from b2bhub.worker import flask_app
    with flask_app.app_context(), hub.new_session() as session:
        wakeups.publish_now(hub.due_targets(session))


@worker_ready.connect
def _start_sources(sender=None, **kwargs) -> None:
    """A worker that starts starts the scheduled sources (a poller's base_directory)."""
    from b2bhub.worker import flask_app
    with flask_app.app_context():
        sources().start_all()


@worker_shutting_down.connect
def _stop_claiming(sig=None, how=None, **kwargs) -> None:
    from b2bhub.worker import flask_app
    grace = float(flask_app.config["STOP_GRACE"])
    log.info("stopping (%s): no new claims, running attempt has %.0f s", sig, grace)
    stop_control.request(grace)


@shared_task(name="b2bhub.plugin_job", ignore_result=True)
def plugin_job(name: str):
    """A periodic job a plugin type declares (b2bhub/jobs.py), run on beat's schedule or
    when asked for by ``run_job_soon``."""
    from b2bhub.jobs import run_job
    return run_job(hub.registry(), name)
