"""The operator's web pages under ``/ui/`` (SPEC 14-16): server-rendered Jinja from the
top-level ``templates/`` folder, Flask-WTF forms (CSRF on every one), updated live from
``/api/v1/events`` by a small script.

Views are thin: they read a form and call the same services and engine functions as the
API. Login keeps the user's id in Flask's signed session cookie through Flask-Login; every
request reloads the user, so a changed role or a disabled user applies at once.

Roles, as in the API: a page (GET) needs ``viewer``; anything else needs ``admin`` unless
the view names a role with the API's :func:`~b2bhub.api.auth.requires`. Templates ask
:func:`can` before offering an action, and the view refuses it (403) when forced.
"""

from __future__ import annotations

import logging
from datetime import datetime

from flask import Flask, redirect, url_for

from b2bhub.config.extensions import login_manager
from b2bhub.domain.states import LABELS
from b2bhub.observability import tracing
from b2bhub.web.kit import (  # noqa: F401  (the views' helpers, for plugins' own pages)
    bp,
    button,
    can,
    form_status,
    render_plugin_template,
    submit,
)


def web_init_app(app: Flask) -> None:
    login_manager.init_app(app)
    login_manager.login_view = "ui.login"
    app.register_blueprint(bp)
    app.add_url_rule("/", "root", lambda: redirect(url_for("ui.dashboard")))
    app.jinja_env.globals.update(can=can, LABELS=LABELS, trouble=messages.trouble)
    app.jinja_env.filters.update(label=lambda value: LABELS.get(value, value or ""),
                                 short=messages.short,
                                 when=_when, size=_size, trace_id=tracing.trace_id,
                                 levelname=lambda n: logging.getLevelName(n).lower())


def _when(moment) -> str:
    """A time (or the API's ISO text of one) as the pages show it."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment.rstrip("Z"))
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def _size(count: int | None) -> str:
    if count is None:
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return ""


from b2bhub.web import (  # noqa: E402,F401
    alerts,
    auth,
    dashboard,
    delivery_errors,
    messages,
    notifications,
    parties,
    plugins,
    routes,
    system,
)
