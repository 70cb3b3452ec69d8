"""System > Services: connected processes, and Start/Stop of an instance (SPEC 14, 16)."""

from __future__ import annotations

from flask import g, jsonify, request

from b2bhub.api import bp
from b2bhub.api.auth import requires
from b2bhub.api.inputs import bad_request
from b2bhub.api.shapes import iso
from b2bhub.engine import instances, presence
from b2bhub.extensions import db
from b2bhub.models import PluginInstance, Process, utcnow


@bp.get("/processes")
def list_processes():
    """Connected processes; ``?all=true`` adds those stopped or gone (kept a day)."""
    flag = request.args.get("all", "false")
    if flag not in ("true", "false"):
        raise bad_request("all must be true or false", "all")
    now = utcnow()
    rows = presence.list_processes(db.session, now, include_stopped=flag == "true")
    return jsonify({"items": [process_json(row, now) for row in rows], "next_cursor": None})


@bp.post("/plugins/configs/<name>/<any(start, stop):action>")
@requires("admin")
def instance_action(name: str, action: str):
    act = instances.start_instance if action == "start" else instances.stop_instance
    text = act(db.session, name, g.actor, utcnow())
    db.session.commit()
    row = db.session.scalar(db.select(PluginInstance).where(PluginInstance.name == name))
    return jsonify({"name": name, "state": row.state, "state_reason": row.state_reason,
                    "message": text})


def process_json(row: Process, now) -> dict:
    return {"id": row.id, "kind": row.kind, "host": row.host, "pid": row.pid,
            "started_at": iso(row.started_at), "last_seen": iso(row.last_seen),
            "stopped_at": iso(row.stopped_at), "instances": row.instances or [],
            "state": presence.process_state(row, now)}
