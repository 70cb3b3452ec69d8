"""The storage report (SPEC 13): what the messages kept hold, by organization or partner,
source instance and target instance, with each source's retention and its oldest
message; and the payload store on disk against what the rows reference.

``party``: the partner a message was exchanged with (its sender when inbound, its
addressee when outbound; the sender of an internal one). ``bytes``: the messages' sizes
as received. A message with deliveries to two targets counts under each target, so a
source's figures are its own, not the sum of its targets'; a message not routed has no
target line.

The figures come from two aggregate queries over ``messages`` and ``deliveries`` (exact
at the moment they run; about 1.2 to 1.6 s with 1M messages on PostgreSQL, see
``bench/cleanup.py``). So that the report answers at once, the periodic housekeeping
computes it every :data:`REFRESH_SECONDS` and after each cleanup run, and keeps it in
the settings table (``storage_report``); a read serves that copy, with the moment it was
computed, unless it is missing or older than twice the period (then it is computed for
the read), or ``fresh`` asks for the figures of this moment. The store's figures need a
walk of every file, so they are those of the last cleanup run, which walks the store
anyway; they are read at every request.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import case, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from b2bhub.domain.retention import describe, effective_days
from b2bhub.engine.settings import load_settings
from b2bhub.models import CleanupRun, Delivery, Message, PluginInstance, Setting

CACHE_KEY = "storage_report"
#: seconds between two computations of the kept report
REFRESH_SECONDS = 300

PARTY = case((Message.direction == "outbound", Message.to_party),
             else_=Message.from_party).label("party")


def storage_report(session: Session, now: datetime, fresh: bool = False) -> dict:
    """The report as the API shows it (moments as ISO text): the kept copy if it is
    recent enough and ``fresh`` is off, else computed now; with the store's figures."""
    kept = None if fresh else session.scalar(select(Setting.value).where(
        Setting.key == CACHE_KEY))
    if not kept or _age(kept, now) > 2 * REFRESH_SECONDS:
        kept = compute(session, now)
    return {**kept, "store": _iso_store(_store(session))}


def refresh(session: Session, now: datetime, force: bool = False) -> bool:
    """Compute and keep the report when the kept one is older than the period (or
    always, with ``force``), in the caller's transaction; whether it did."""
    row = session.get(Setting, CACHE_KEY)
    if not force and row is not None and row.value and _age(
            row.value, now) < REFRESH_SECONDS:
        return False
    value = compute(session, now)
    if row is not None:
        row.value = value
        return True
    try:
        with session.begin_nested():  # another process may keep its first one meanwhile
            session.add(Setting(key=CACHE_KEY, value=value))
    except IntegrityError:
        return False
    return True


def _age(report: dict, now: datetime) -> float:
    try:
        computed = datetime.fromisoformat(report["computed_at"].rstrip("Z"))
    except (KeyError, TypeError, ValueError):
        return float("inf")
    return (now - computed) / timedelta(seconds=1)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() + "Z" if moment is not None else None


def compute(session: Session, now: datetime) -> dict:
    """The report's figures as of now, moments as ISO text (without the store's)."""
    settings = load_settings(session)
    retention = dict(session.execute(select(PluginInstance.name,
                                            PluginInstance.retention_days)).all())
    sources = session.execute(
        select(PARTY, Message.source, func.count(), func.coalesce(func.sum(Message.size), 0),
               func.min(Message.created_at))
        .group_by(PARTY, Message.source)).all()
    targets = session.execute(
        select(PARTY, Message.source, Delivery.target, func.count(),
               func.coalesce(func.sum(Message.size), 0))
        .join(Delivery, Delivery.message_id == Message.id)
        .group_by(PARTY, Message.source, Delivery.target)).all()
    by_target: dict[tuple[str, str], list[dict]] = {}
    for party, source, target, count, size in targets:
        by_target.setdefault((party, source), []).append(
            {"target": target, "messages": count, "bytes": int(size)})
    parties: dict[str, dict] = {}
    for party, source, count, size, oldest in sources:
        entry = parties.setdefault(party, {"party": party, "messages": 0, "bytes": 0,
                                           "sources": []})
        entry["messages"] += count
        entry["bytes"] += int(size)
        days = retention.get(source)
        entry["sources"].append({
            "source": source, "messages": count, "bytes": int(size),
            "retention_days": effective_days(days, settings.retention_days),
            "retention": describe(days, settings.retention_days),
            "oldest_message_at": _iso(oldest),
            "targets": sorted(by_target.get((party, source), []),
                              key=lambda t: t["target"])})
    for entry in parties.values():
        entry["sources"].sort(key=lambda s: s["source"])
    return {"parties": sorted(parties.values(), key=lambda p: p["party"]),
            "messages": sum(p["messages"] for p in parties.values()),
            "bytes": sum(p["bytes"] for p in parties.values()),
            "default_retention_days": settings.retention_days,
            "computed_at": _iso(now)}


def _store(session: Session) -> dict | None:
    """The payload store as the last run that walked it found it."""
    run = session.scalar(select(CleanupRun).where(CleanupRun.store_files.is_not(None))
                         .order_by(CleanupRun.id.desc()).limit(1))
    if run is None:
        return None
    return {"measured_at": run.finished_at or run.started_at, "files": run.store_files,
            "bytes": run.store_bytes, "referenced_files": run.referenced_files,
            "referenced_bytes": run.referenced_bytes,
            "unreferenced_files": run.store_files - run.referenced_files,
            "unreferenced_bytes": run.store_bytes - run.referenced_bytes}


def _iso_store(store: dict | None) -> dict | None:
    if store is not None:
        store["measured_at"] = _iso(store["measured_at"])
    return store
