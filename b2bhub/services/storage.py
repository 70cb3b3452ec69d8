"""The storage report (SPEC 13): what the messages kept hold, by organization or partner,
source instance and target instance, with each source's retention and its oldest
message; and the payload store on disk against what the rows reference.

``party``: the partner a message was exchanged with (its sender when inbound, its
addressee when outbound; the sender of an internal one). ``bytes``: the messages' sizes
as received. A message with deliveries to two targets counts under each target, so a
source's figures are its own, not the sum of its targets'; a message not routed has no
target line.

The figures come from two aggregate queries over ``messages`` and ``deliveries`` at the
moment of the request (exact, never stale). The store's figures need a walk of every
file, so they are those of the last cleanup run, which walks the store anyway.
"""

from __future__ import annotations

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from b2bhub.domain.retention import describe, effective_days
from b2bhub.engine.settings import load_settings
from b2bhub.models import CleanupRun, Delivery, Message, PluginInstance

PARTY = case((Message.direction == "outbound", Message.to_party),
             else_=Message.from_party).label("party")


def storage_report(session: Session) -> dict:
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
            "oldest_message_at": oldest,
            "targets": sorted(by_target.get((party, source), []),
                              key=lambda t: t["target"])})
    for entry in parties.values():
        entry["sources"].sort(key=lambda s: s["source"])
    return {"parties": sorted(parties.values(), key=lambda p: p["party"]),
            "messages": sum(p["messages"] for p in parties.values()),
            "bytes": sum(p["bytes"] for p in parties.values()),
            "default_retention_days": settings.retention_days,
            "store": _store(session)}


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


def iso_moments(report: dict, iso) -> dict:
    """The report with its moments as ISO text (the API's shape)."""
    for party in report["parties"]:
        for source in party["sources"]:
            source["oldest_message_at"] = iso(source["oldest_message_at"])
    if report["store"]:
        report["store"]["measured_at"] = iso(report["store"]["measured_at"])
    return report

