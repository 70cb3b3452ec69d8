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

from flask import Flask, redirect, request, url_for
from flask_babel import format_datetime, format_decimal, get_locale, gettext
from flask_login import current_user

from b2bhub.config.extensions import babel, login_manager
from b2bhub.domain import i18n
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
    login_manager.login_message = i18n.N_("Please log in to access this page.")
    app.config.setdefault("BABEL_DEFAULT_LOCALE", i18n.hub_language(app.config.get("LANGUAGE")))
    app.config.setdefault("BABEL_DEFAULT_TIMEZONE", "UTC")  # the pages say UTC
    app.config.setdefault("BABEL_TRANSLATION_DIRECTORIES", str(i18n.TRANSLATIONS_DIR))
    babel.init_app(app, locale_selector=select_language)
    app.register_blueprint(bp)
    app.add_url_rule("/", "root", lambda: redirect(url_for("ui.dashboard")))
    app.jinja_env.globals.update(can=can, LABELS=LABELS, trouble=messages.trouble,
                                 html_lang=lambda: str(get_locale()).replace("_", "-"),
                                 LANGUAGES=i18n.LANGUAGES)
    app.jinja_env.filters.update(label=lambda value: i18n.status_label(value, gettext),
                                 stored_text=lambda text: i18n.show_history_text(
                                     text, gettext),
                                 state=lambda value: i18n.state_word(value, gettext),
                                 # a text of ours made with N_ (a test step's detail)
                                 said=lambda text: i18n.shown(text, gettext),
                                 short=messages.short, number=_number,
                                 percent=_percent, decimal1=_decimal1,
                                 when=_when, size=_size, trace_id=tracing.trace_id,
                                 levelname=lambda n: logging.getLevelName(n).lower())


def select_language() -> str:
    """The user's own setting, else the browser's Accept-Language (``pt-BR`` and ``pt``
    are pt_BR), else the hub's default (B2BHUB_LANGUAGE, English unless set)."""
    from flask import current_app
    if getattr(current_user, "is_authenticated", False) and \
            i18n.supported(getattr(current_user, "language", None)):
        return i18n.supported(current_user.language)
    return (i18n.from_accept_language(request.accept_languages)
            or current_app.config["BABEL_DEFAULT_LOCALE"])


#: how a page writes a moment, by language: English keeps the ISO order operators
#: compare logs with; pt_BR writes the day first, as Brazilian systems do
DATETIME_FORMATS = {"en": "yyyy-MM-dd HH:mm:ss", "pt_BR": "dd/MM/yyyy HH:mm:ss"}


def _when(moment) -> str:
    """A time (or the API's ISO text of one) as the pages show it, in UTC."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment.rstrip("Z"))
    if not moment:
        return ""
    return format_datetime(moment, DATETIME_FORMATS.get(str(get_locale()),
                                                        DATETIME_FORMATS["en"]))


def _number(value) -> str:
    """A count or figure with the language's digit grouping and decimal mark."""
    return "" if value is None else format_decimal(value)


def _percent(share: float) -> str:
    """A share (0.67) as the pages write it: ``67 %``, digits in the language's way."""
    return f"{format_decimal(round(share * 100), '#,##0')} %"


def _decimal1(value: float) -> str:
    """A figure with one decimal, in the language's decimal mark (``1.5``, ``1,5``)."""
    return format_decimal(value, "#,##0.0")


def _size(count: int | None) -> str:
    if count is None:
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return (f"{format_decimal(count, '#,##0')} {unit}" if unit == "B"
                    else f"{format_decimal(count, '#,##0.0')} {unit}")
        count /= 1024
    return ""


from b2bhub.web import (  # noqa: E402,F401
    account,
    alerts,
    auth,
    dashboard,
    delivery_errors,
    expected,
    messages,
    notifications,
    parties,
    plugins,
    routes,
    system,
)
