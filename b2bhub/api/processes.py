"""System > Services: connected processes, and Start/Stop of an instance (SPEC 14, 16)."""

from __future__ import annotations

from flask import g

import b2bhub.api.schemas as s
from b2bhub.api.auth import requires
from b2bhub.api.blueprint import bp
from b2bhub.config.extensions import db
from b2bhub.engine import instances, presence
from b2bhub.models import PluginInstance, Process, utcnow


@bp.get("/processes", summary="List the connected processes")
@bp.arguments(s.ProcessArgs, location="query")
@bp.response(200, s.ProcessPage)
def list_processes(args: dict):
    """Connected processes; ``?all=true`` adds those stopped or gone (kept a day)."""
    now = utcnow()
    rows = presence.list_processes(db.session, now, include_stopped=args["all"] == "true")
    return {"items": [process_json(row, now) for row in rows], "next_cursor": None}


def _instance_view(action):
    def view(name: str):
        text = action(db.session, name, g.actor, utcnow())
        db.session.commit()
        row = db.session.scalar(db.select(PluginInstance).where(PluginInstance.name == name))
        return {"name": name, "state": row.state, "state_reason": row.state_reason,
                "message": text}
    view.__doc__ = action.__doc__
    return bp.response(200, s.InstanceState)(requires("admin")(view))


for _name, _action, _summary in (
        ("start", instances.start_instance, "Start a plugin instance"),
        ("stop", instances.stop_instance, "Stop a plugin instance")):
    bp.add_url_rule(f"/plugins/configs/<name>/{_name}", f"{_name}_instance",
                    _instance_view(_action), methods=["POST"], summary=_summary,
                    refusals=(409,))


def process_json(row: Process, now) -> dict:
    return {"id": row.id, "kind": row.kind, "host": row.host, "pid": row.pid,
            "started_at": row.started_at, "last_seen": row.last_seen,
            "stopped_at": row.stopped_at, "instances": row.instances or [],
            "state": presence.process_state(row, now)}
