"""The UI's blueprint and what its views share: the login and role check of every page,
the error pages, and the helpers that carry out a form's change with its history line
(:func:`submit`, :func:`button`, :func:`ask_first`). The view modules build on this
module; the package (:mod:`b2bhub.web`) imports them and registers the blueprint."""

from __future__ import annotations

from collections.abc import Callable

from flask import (
    Blueprint,
    abort,
    current_app,
    flash,
    g,
    make_response,
    redirect,
    render_template,
    render_template_string,
    request,
    url_for,
)
from flask_babel import force_locale
from flask_babel import gettext as _
from flask_babel import lazy_gettext as _l
from flask_login import current_user
from werkzeug.exceptions import HTTPException

from b2bhub.api.auth import RANK, requires  # noqa: F401  (the API's roles)
from b2bhub.api.blueprint import role_for
from b2bhub.api.errors import http_error
from b2bhub.config.extensions import db
from b2bhub.domain import i18n
from b2bhub.engine.history import add_line
from b2bhub.engine.operator import ActionRefused, UnknownObject
from b2bhub.services.errors import ServiceError
from b2bhub.web.forms import ActionForm, refusal, show_service_error

bp = Blueprint("ui", __name__, url_prefix="/ui", static_folder="static")

OPEN_ENDPOINTS = frozenset({"ui.login", "ui.static"})
#: pages that update live (``b2bhub/web/static/live.js``): each is rendered with the
#: history id it shows the state of, and its stream resumes after that id
LIVE_PAGES = frozenset({"ui.dashboard", "ui.messages", "ui.message", "ui.services"})


def can(role: str) -> bool:
    """Whether the logged-in user has at least ``role`` (templates offer actions by it)."""
    return current_user.is_authenticated and RANK.get(current_user.role, -1) >= RANK[role]


@bp.before_request
def check_login_and_role():
    """Send a visitor to the login page; refuse (403) a role too low for the view."""
    if request.endpoint in OPEN_ENDPOINTS:
        return None
    if not current_user.is_authenticated:
        return redirect(url_for("ui.login", next=request.full_path.rstrip("?")))
    needed = role_for(current_app.view_functions.get(request.endpoint or ""),
                      request.method) or "viewer"
    if not can(needed):
        abort(403, _("this needs the %(needed)s role; '%(user)s' has the %(role)s role",
                     needed=needed, user=current_user.name, role=current_user.role))
    g.actor = current_user.name
    if request.method == "GET" and request.endpoint in LIVE_PAGES:
        g.live_after = _live_watermark()
    else:
        g.pop("live_after", None)
    return None


def _live_watermark() -> int:
    """The highest history id committed before the page reads what it shows.

    Read first, so that every change the page's own queries miss has a line above it
    and reaches the page through its stream (``?after=``): a message delivered between
    the page's render and the stream's start is no longer missed. A change the page
    already shows may come again; live.js takes that as one more refresh."""
    from b2bhub.config.extensions import db
    from b2bhub.engine.events import latest_id
    return latest_id(db.session.connection())


@bp.errorhandler(400)
@bp.errorhandler(403)
@bp.errorhandler(404)
def _error_page(exc: HTTPException):
    """Refusals as a page; a form without a valid CSRF token (CSRFError, a 400) lands
    here too and changes nothing."""
    return render_template("ui/error.html", code=exc.code,
                           name=_(ERROR_NAMES[exc.code]) if exc.code in ERROR_NAMES
                           else exc.name, description=_error_text(exc)), exc.code


@bp.errorhandler(500)
def _failure_page(exc: HTTPException):
    """A page that failed on our side: the site's page with its navigation, not a bare
    500. Flask has logged what failed, with its traceback; what the request had not
    committed is rolled back."""
    db.session.rollback()
    return render_template("ui/error.html", code=500, name=_("Something went wrong"),
                           description=_("The hub could not show this page. What failed is "
                                         "in the log (Logs); try again, or tell whoever "
                                         "runs the hub.")), 500


#: the error pages' titles (werkzeug's names of the codes, in English)
ERROR_NAMES = {400: i18n.N_("Bad Request"), 403: i18n.N_("Forbidden"),
               404: i18n.N_("Not Found")}


def _error_text(exc: HTTPException) -> str:
    """What an error page says: the view's own reason (already in the user's language
    where the UI wrote it), else werkzeug's default, put in the user's words."""
    if exc.description == type(exc).description:
        return _(DEFAULT_TEXTS[exc.code]) if exc.code in DEFAULT_TEXTS else exc.description
    return exc.description


DEFAULT_TEXTS = {
    400: i18n.N_("The browser (or proxy) sent a request that this server could not "
                 "understand."),
    403: i18n.N_("You don't have the permission to access the requested resource. It is "
                 "either read-protected or not readable by the server."),
    404: i18n.N_("The requested URL was not found on the server. If you entered the URL "
                 "manually please check your spelling and try again."),
}


@bp.app_errorhandler(404)
def _unknown_address(exc: HTTPException):
    """An address under /ui/ that matches no page gets the site's own 404 page, with
    its navigation (a URL that matches no rule never reaches the blueprint's
    handlers); any other address is answered as the API answers.

    A visitor not logged in is sent to the login page first, as from any page of the
    UI: no page is shown to them, not even which addresses exist, and once logged in
    they land on the 404 page with the navigation to go on from."""
    if request.path == bp.url_prefix or request.path.startswith(bp.url_prefix + "/"):
        if not current_user.is_authenticated:
            return redirect(url_for("ui.login", next=request.full_path.rstrip("?")))
        return _error_page(exc)
    return http_error(exc)


def record_change(text) -> None:
    """A history line (not tied to a message) for a change of configuration by the
    logged-in user, written in the transaction of the change. The line is stored in
    English whatever the user reads (a lazy text is rendered in English here)."""
    with force_locale(i18n.DEFAULT):
        text = str(text)
    add_line(db.session, None, "config_changed", f"{g.actor}: {text}", actor=g.actor)


def submit(form, change: Callable[[], object], describe: Callable[[object], str],
           aliases: dict | None = None) -> object | None:
    """Run a valid form's ``change``: commit it with a history line saying
    ``describe(result)`` and flash that, or roll back and show the refusal on the form
    (each error beside its field). Returns the result, or None when refused."""
    try:
        result = change()
    except ServiceError as exc:
        db.session.rollback()
        show_service_error(form, exc, aliases)
        return None
    _done(describe(result))
    return result


def ask_first(question: str, detail: str, back: str, confirm: str | None = None,
              active: str | None = None) -> None:
    """Show the confirm page of a delete or a bulk action unless this is its confirmed
    POST (then return, and the view acts).

    Such a view is reached by GET (a link) or by a POST of its list's form; both only
    show this page, which works without JavaScript: its form posts the same fields again
    (with a fresh CSRF token) and ``confirm=yes``, and only that POST acts. A POST
    without it changes nothing."""
    if request.method == "POST" and request.form.get("confirm") == "yes":
        return
    carried = [(key, value) for key in request.form if key not in ("csrf_token", "confirm")
               for value in request.form.getlist(key)]
    abort(make_response(render_template(
        "ui/confirm.html", action=ActionForm(), question=question, detail=detail,
        confirm=confirm or _("Delete"), back=back, carried=carried, target=request.path,
        active=active)))


def button(change: Callable[[], object], describe: Callable[[object], str],
           record: bool = True) -> None:
    """A button's POST (delete, enable, acknowledge): refused without its CSRF token;
    committed with a history line (unless the service writes its own) and flashed, or
    rolled back with the reason flashed."""
    if not ActionForm().validate_on_submit():
        abort(400, expired())
    try:
        result = change()
    except (ServiceError, ActionRefused, UnknownObject) as exc:
        db.session.rollback()
        flash(refusal(exc), "error")
        return
    _done(describe(result), record)


def _done(text, record: bool = True) -> None:
    """Commit a change; its history line in English, its flash in the user's words
    (``text`` may be a lazy text: it is rendered once in each)."""
    if record:
        record_change(text)
    db.session.commit()
    text = str(text)
    flash(text[:1].upper() + text[1:])


def expired() -> str:
    """Why a form without its valid CSRF token changed nothing."""
    return _("the form expired or was not sent from this site; reload and try again")


@bp.app_context_processor
def _party_words() -> dict:
    """The kinds of party as the pages name them."""
    return {"party_kinds": {"organization": _l("Organization"), "partner": _l("Partner")},
            "party_words": {"organization": _l("organization"), "partner": _l("partner")}}


def request_session():
    """The web request's database session, the one the core's pages write through: a
    plugin's own page (``ProfileKind.ui_page``) saves on it, the core commits."""
    return db.session


def render_plugin_template(path: str, **context) -> str:
    """Render a template file a plugin ships (it may extend ``ui/base.html`` and use
    ``ui/_form.html``), with the UI's globals and filters."""
    source = _template_sources.get(path)
    if source is None:
        with open(path, encoding="utf-8") as fh:
            source = _template_sources[path] = fh.read()
    return render_template_string(source, **context)


_template_sources: dict[str, str] = {}


def form_status(form) -> int:
    """400 for a form shown again with errors, so a refusal is visible to any client."""
    return 400 if form.errors or form.form_errors else 200
