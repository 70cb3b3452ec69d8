"""Periodic jobs of plugin types (SPEC 3): declared as data, scheduled by beat.

The core's own periodic work is the static ``beat_schedule`` of ``celeryconfig.py``; each
registered type's ``periodic_jobs`` are added to it when Celery is set up (beat reads the
schedule at its start), under the job's name, all run by the one task
``b2bhub.plugin_job``. A job name is unique across types; two types of one protocol may
declare the same job (the same object), which is scheduled once.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
TASK = "b2bhub.plugin_job"


def declared_jobs(registry) -> dict:
    """Every job of the registered types, by name (the first type's on a clash)."""
    jobs: dict = {}
    for type_name, cls in registry.types().items():
        for job in getattr(cls, "periodic_jobs", ()) or ():
            if job.name in jobs and jobs[job.name] is not job:
                log.warning("periodic job %r of %s skipped: the name is taken", job.name,
                            type_name)
                continue
            jobs[job.name] = job
    return jobs


def beat_entries(registry) -> dict:
    """The ``beat_schedule`` entries of the registered types' jobs."""
    from celery.schedules import crontab
    entries = {}
    for name, job in declared_jobs(registry).items():
        if job.at is not None:
            hour, minute = (int(p) for p in job.at.split(":"))
            schedule = crontab(hour=hour, minute=minute)
        else:
            schedule = float(job.every)
        options = {"expires": float(job.expires)} if job.expires else {}
        entries[name] = {"task": TASK, "schedule": schedule, "args": [name],
                         "options": options}
    return entries


def run_job(registry, name: str):
    """Run the job ``name`` now in a session of its own, committed after it."""
    from b2bhub.models import utcnow
    from b2bhub.runtime import hub
    job = declared_jobs(registry).get(name)
    if job is None:
        log.warning("no periodic job named %r is registered; not run", name)
        return None
    with hub.new_session() as session:
        result = job.run(session, hub.store(), utcnow())
        session.commit()
    return result


def run_job_soon(name: str, expires: float = 60) -> None:
    """Ask a worker to run the job ``name`` now (beat runs it on schedule anyway); a
    broker that is down is logged, not raised."""
    try:
        from celery import current_app  # the hub's Celery app (set as the default)

        # by the task's name: the tasks module builds on this one, not back
        current_app.send_task(TASK, args=[name], retry=False, expires=expires)
    except Exception:
        log.info("could not publish a run of %s; beat runs it on schedule", name,
                 exc_info=True)
