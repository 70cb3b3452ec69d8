"""``GET /stats``: the dashboard's figures now, and its per-minute series.

``series``: ``hour`` (default, the last 60 minutes), ``day`` (the last 1440) or
``none``. Each point is one ended minute (see ``b2bhub.engine.stats``). Each instance
item carries its last probe: ``online`` (true, false, or null when never probed or it
has no probe) and ``probe_checked_at``; ``instances.offline`` counts those offline.
"""

from __future__ import annotations

from datetime import timedelta

import b2bhub.api.schemas as s
from b2bhub.api.blueprint import bp
from b2bhub.config.extensions import db
from b2bhub.domain.status_codes import codes_counted
from b2bhub.engine import stats
from b2bhub.models import StatsMinute, utcnow

SPANS = {"hour": timedelta(hours=1), "day": timedelta(days=1), "none": None}


@bp.get("/stats", summary="The dashboard's figures and per-minute series")
@bp.arguments(s.StatsArgs, location="query")
@bp.response(200, s.Stats)
def get_stats(args: dict):
    """Figures now: messages by status, deliveries by state (and those due), instances
    (each with its last probe), attempts over the last hour, connected processes; and
    the per-minute series of the last hour or day."""
    span_name = args["series"]
    now = utcnow()
    now_figures = stats.current(db.session, now)
    span = SPANS[span_name]
    points = stats.series(db.session, now, span) if span else []
    last_hour = points if span_name == "hour" else stats.series(
        db.session, now, SPANS["hour"])
    return {
        "at": now,
        "messages": {"by_status": now_figures.messages,
                     "by_status_code": codes_counted(now_figures.messages),
                     "total": sum(now_figures.messages.values())},
        "deliveries": {"by_state": now_figures.deliveries,
                       "total": sum(now_figures.deliveries.values()),
                       "due": now_figures.due,
                       "oldest_due_seconds": now_figures.oldest_due_seconds},
        "instances": {"by_state": now_figures.instances,
                      "offline": sum(i.online is False for i in now_figures.instance_states),
                      "blocked": len(now_figures.blocked),
                      "items": [{"name": i.name, "state": i.state, "enabled": i.enabled,
                                 "online": i.online,
                                 "probe_checked_at": i.probe_checked_at,
                                 "blocked_by": now_figures.blocked.get(i.name)}
                                for i in now_figures.instance_states]},
        "attempts": _attempts(last_hour),
        "processes": now_figures.processes,
        "series": {"span": span_name, "points": [point_json(p) for p in points]},
    }


def _attempts(points: list[StatsMinute]) -> dict:
    durations = [(p.duration_avg, p.attempts) for p in points if p.duration_avg is not None]
    weight = sum(n for _, n in durations)
    return {
        "last_hour": sum(p.attempts for p in points),
        "delivered_last_hour": sum(p.delivered for p in points),
        "failures_last_hour": sum(p.failures for p in points),
        "duration_avg_seconds": (sum(d * n for d, n in durations) / weight
                                 if weight else None),
        "duration_max_seconds": max((p.duration_max for p in points
                                     if p.duration_max is not None), default=None),
    }


def point_json(point: StatsMinute) -> dict:
    return {"minute": point.minute, "messages_in": point.messages_in,
            "attempts": point.attempts, "delivered": point.delivered,
            "failures": point.failures, "duration_avg_seconds": point.duration_avg,
            "duration_max_seconds": point.duration_max, "due": point.due,
            "oldest_due_seconds": point.oldest_due_seconds}
