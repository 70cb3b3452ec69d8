"""Thin Celery tasks: they take ids, open a session and call the engine."""

from __future__ import annotations

import gc
import logging

from celery import shared_task
from celery.signals import beat_init, worker_ready, worker_shutdown, worker_shutting_down
from flask import current_app
from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.engine import presence, wakeups
from b2bhub.engine.instances import mark_targets_running
from b2bhub.engine.probes import ProbeRunner
from b2bhub.engine.runner import TargetRunner
from b2bhub.engine.scans import SourceRunner, due_scans
from b2bhub.engine.stats import sample_minutes
from b2bhub.engine.stopping import stop_control
from b2bhub.engine.sweep import run_sweep
from b2bhub.models import InstanceState, PluginInstance, utcnow
from b2bhub.runtime import hub
from b2bhub.runtime.agent import start_agent, stop_agent

log = logging.getLogger(__name__)
_runner: TargetRunner | None = None
_sources: SourceRunner | None = None
_probes: ProbeRunner | None = None


def runner() -> TargetRunner:
    global _runner
    if _runner is None:
        _runner = TargetRunner(hub.new_session, hub.registry(), hub.store(),
                               hub.process_owner(), callbacks=hub.callback_tokens())
    return _runner


def sources() -> SourceRunner:
    global _sources
    if _sources is None:
        _sources = SourceRunner(hub.new_session, hub.registry(), hub.store(),
                                hub.process_owner(), should_stop=stop_control.requested.is_set)
    return _sources


def probes() -> ProbeRunner:
    global _probes
    if _probes is None:
        _probes = ProbeRunner(hub.registry(), hub.process_owner())
    return _probes


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


@shared_task(name="b2bhub.edi_acks", ignore_result=True)
def edi_acks() -> dict:
    """Beat's tick: match the acknowledgments received, raise the overdue waits
    (:mod:`b2bhub.engine.ack_waits`)."""
    from b2bhub.engine import ack_waits
    with hub.new_session() as session:
        return ack_waits.run(session, utcnow())
@shared_task(name="b2bhub.expected", ignore_result=True)
def expected() -> dict:
    """Beat's tick: plan, match and judge the expected-message rules' windows
    (:mod:`b2bhub.engine.expected`), in one process at a time."""
    from b2bhub.engine import expected as engine
    with hub.new_session() as session:
        return engine.run(session, utcnow(), hub.process_owner()).__dict__


@shared_task(name="b2bhub.make_acks", ignore_result=True)
def make_acks() -> dict:
    """Beat's tick (and its own follow-up while more are due): make the functional
    acknowledgments that are due (b2bhub/engine/acks.py)."""
    from b2bhub.engine.acks import run_due_acks
    with hub.new_session() as session:
        report = run_due_acks(session, hub.store(), utcnow(), hub.process_owner())
    if report.made or report.failed:
        log.info("functional acknowledgments: %d made, %d failed", report.made,
                 report.failed)
    if report.more_due and not stop_control.requested.is_set():
        make_acks.apply_async(expires=60, retry=False)
    return report.__dict__


@shared_task(name="b2bhub.probe_targets", ignore_result=True)
def probe_targets() -> int:
    """Beat's probe tick: start the due probes on threads of this worker (each bounded
    by a timeout, so the task returns at once); how many were started."""
    with hub.new_session() as session:
        return len(probes().tick(session))


@shared_task(name="b2bhub.cleanup", ignore_result=True)
def cleanup() -> dict:
    """Beat ticks this every minute; it runs the nightly cleanup once its time has come
    (``b2bhub.engine.cleanup.cleanup_due``), in one process at a time."""
    from b2bhub.engine.cleanup import cleanup_due, plugin_references, run_cleanup
    from b2bhub.engine.settings import load_settings
    with hub.new_session() as session:
        now = utcnow()
        settings = load_settings(session)
        due = cleanup_due(session, now, settings)
        session.rollback()
        if not due:
            return {"ran": False}
        report = run_cleanup(session, hub.store(), now, hub.process_owner(),
                             settings=settings, references=plugin_references(hub.registry()))
        if report.ran:
            from b2bhub.services import storage
            storage.refresh(session, utcnow(), force=True)
            session.commit()
    log.info("%s", report.summary())
    return report.__dict__


@shared_task(name="b2bhub.scan_source", ignore_result=True)
def scan_source(instance: str, shard: int | None = None) -> dict:
    """One scan of a scheduled source (of its shard ``shard`` when it has more than
    one), unless another process is scanning it."""
    report = sources().scan(instance, shard)
    return {"ran": report.ran, "reason": report.reason, "messages": len(report.messages)}


@shared_task(name="b2bhub.schedule_sources", ignore_result=True)
def schedule_sources() -> int:
    """Publish a scan of each scheduled source whose polling interval has elapsed (one
    per due shard of a source of more than one)."""
    with hub.new_session() as session:
        due = due_scans(session, hub.registry(), utcnow())
    for instance, interval, *shard in due:
        scan_source.apply_async(args=[instance, *shard], expires=max(interval, 5.0),
                                retry=False)
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
    """Every minute: the dashboard's per-minute samples, the partners' daily scorecard
    figures once a day has settled, the trim of log records and of processes long gone,
    and the storage report when it is due again."""
    from b2bhub.services import scorecard, storage
    with hub.new_session() as session:
        sampled = sample_minutes(session, utcnow())
        session.commit()
        rolled = scorecard.roll_up(session, utcnow())
        session.commit()
        trimmed = presence.trim(session, utcnow())
        session.commit()
        refreshed = storage.refresh(session, utcnow())
        session.commit()
    return {"sampled": sampled, "scorecard_days": rolled, "log_records_trimmed": trimmed,
            "storage_report": refreshed}


@shared_task(name="b2bhub.check_certificates", ignore_result=True)
def check_certificates() -> int:
    """Every hour: ``certificate_expiring`` for the certificates and OpenPGP keys of
    every profile kind that end within 30 days (:mod:`b2bhub.services.profiles`)."""
    from b2bhub.services.profiles import check_certificates as check
    with hub.new_session() as session:
        ending = check(session, hub.registry(), utcnow())
        session.commit()
    return ending


@shared_task(name="b2bhub.notify", ignore_result=True)
def notify() -> dict:
    """Every few seconds: hand new and resolved alerts to the notification channels,
    then send what is due (:mod:`b2bhub.engine.notifications`)."""
    from b2bhub.engine import notifications
    with hub.new_session() as session:
        planned = notifications.plan(session, utcnow())
        sent, failed = notifications.send_due(session, utcnow())
    return {"planned": planned, "sent": sent, "failed": failed}


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


def _flask_app():
    """The Flask app of this worker or beat (the one ``b2bhub.runtime.worker`` made), reached
    through the Celery app it set up, so this module need not import ``b2bhub.runtime.worker``
    (which imports the whole app, and with it this module)."""
    from celery import current_app
    return current_app.flask_app


@worker_ready.connect
def _start_worker_agent(sender=None, **kwargs) -> None:
    flask_app = _flask_app()
    start_agent(flask_app, "worker", worker_heartbeat)


@worker_shutdown.connect
def _stop_worker_agent(sender=None, **kwargs) -> None:
    stop_agent()


@beat_init.connect
def _start_beat_agent(sender=None, **kwargs) -> None:
    flask_app = _flask_app()
    start_agent(flask_app, "beat")
    gc.freeze()  # as a worker's (above)
    # Celery's own "beat: Starting..." comes before beat opens its schedule file, and its
    # SIGTERM handler (save the schedule) reaches for that scheduler: a SIGTERM in between
    # was seen to end beat with status 1, not 0. This line says beat is up, schedule and
    # agent.
    log.info("beat: schedule open, agent running")


@worker_ready.connect
def _freeze_startup_objects(sender=None, **kwargs) -> None:
    """What the worker made while starting lives as long as it does: out of the garbage
    collector's sight (``gc.freeze``), neither the collections while it runs nor the
    ones of its exit walk it again (an idle worker's stop took 2.5 s, 1.5 s of them in
    the collections of the interpreter's exit)."""
    gc.freeze()


@worker_ready.connect
def _take_up_due_work(sender=None, **kwargs) -> None:
    """A worker that starts takes up at once the deliveries that are due."""
    flask_app = _flask_app()
    with flask_app.app_context(), hub.new_session() as session:
        wakeups.publish_now(hub.due_targets(session))


@worker_ready.connect
def _start_sources(sender=None, **kwargs) -> None:
    """A worker that starts starts the scheduled sources (a poller's base_directory)."""
    flask_app = _flask_app()
    with flask_app.app_context():
        sources().start_all()


@worker_shutting_down.connect
def _stop_claiming(sig=None, how=None, **kwargs) -> None:
    flask_app = _flask_app()
    grace = float(flask_app.config["STOP_GRACE"])
    log.info("stopping (%s): no new claims, running attempt has %.0f s", sig, grace)
    stop_control.request(grace)


@shared_task(name="b2bhub.plugin_job", ignore_result=True)
def plugin_job(name: str):
    """A periodic job a plugin type declares (b2bhub/runtime/jobs.py), run on beat's schedule or
    when asked for by ``run_job_soon``."""
    from b2bhub.runtime.jobs import run_job
    return run_job(hub.registry(), name)
