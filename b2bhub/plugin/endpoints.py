"""``POST /<prefix>/<instance>``: the receiving endpoints of protocol plugins (SPEC 3).

A plugin type that declares ``endpoint_prefix`` gets this URL for each of its enabled
instances (:mod:`b2bhub.plugin`), answered ahead of Flask's request handling
(:class:`EndpointsFirst`). No login and no CSRF token: a protocol
authenticates its requests itself (signatures, party profiles). The view never answers
500: an unexpected failure (the database unreachable, say) is logged and answered 503,
which a sender retries; nothing was taken then.

No request holds a database connection while its body arrives: a body of at most
:data:`PREREAD` bytes (by Content-Length) is read first; a larger one is read after the
instance's lookup and its transaction ended, the instance's ``max_size`` known. A type
with ``endpoint_lookup = "handler"`` looks the instance up itself for a preread body, in
the statement it reads the rest with, so the whole request is one transaction on one
connection. The wake-ups the request committed are published once the answer is sent
(the sender waits for its answer, not for the broker; the sweep re-wakes what is lost).
"""

from __future__ import annotations

import io
import logging

from flask import Blueprint, Flask, Response, request
from flask.sessions import SecureCookieSessionInterface
from sqlalchemy import bindparam, select
from werkzeug.exceptions import MethodNotAllowed
from werkzeug.routing import BaseConverter, Rule, ValidationError
from werkzeug.wrappers import Request

from b2bhub.config.environment import name_the_server
from b2bhub.config.extensions import db
from b2bhub.engine import wakeups
from b2bhub.engine.envelope_checks import IntakeChecks
from b2bhub.engine.history import connection
from b2bhub.models import PluginInstance, utcnow
from b2bhub.observability import tracing
from b2bhub.plugin import PREREAD, EndpointReply, EndpointRequest
from b2bhub.runtime import hub

bp = Blueprint("endpoints", __name__)
log = logging.getLogger(__name__)
DEFAULT_MAX_SIZE = 100 * 1024 * 1024


class EndpointPrefix(BaseConverter):
    """Matches only a prefix some registered type declares, looked up per request (a
    type registered after the app was made is served), so other URLs keep their 404 and
    405.

    Werkzeug checks a rule's methods before its converters: a rule of POST alone made
    every two-segment path a "405 Method Not Allowed" for a GET (``/ui/nosuch``,
    ``/foo/bar``). The rule therefore takes any method (:func:`endpoints_init_app`), this
    converter refuses an unknown prefix first (the app's own 404, the view never runs),
    and the view refuses a method other than POST for a registered one."""

    regex = r"[A-Za-z0-9_.-]+"

    def to_python(self, value: str):
        found = endpoint_type(value)
        if found is None:
            raise ValidationError()
        return found


def endpoint_type(prefix: str) -> type | None:
    for cls in hub.registry().types().values():
        if getattr(cls, "endpoint_prefix", None) == prefix:
            return cls
    return None


class _NoSessionAtEndpoints(SecureCookieSessionInterface):
    """The UI's cookie session everywhere but at the endpoints: a request there is
    authenticated by its protocol and never logs in, so it opens no session (no cookie
    read, verified or written back; its ``session`` is Flask's null session). That was
    2 to 3% of the web CPU of a small intake."""

    def open_session(self, app: Flask, request):
        if request.method == "POST" and endpoint_at(request.path) is not None:
            return None  # Flask puts its null session in its place
        return super().open_session(app, request)


def _endpoint_path(path: str) -> tuple[str, str] | None:
    """(prefix, instance) when ``path`` has the shape ``/<prefix>/<instance>``."""
    parts = path.split("/")
    if len(parts) != 3 or parts[0] or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


def endpoint_at(path: str) -> tuple[type, str] | None:
    """The endpoint type and the instance's name of ``path`` when it is
    ``/<prefix>/<instance>`` of a registered endpoint type, else None (needs an
    application context: the registry)."""
    named = _endpoint_path(path)
    cls = endpoint_type(named[0]) if named is not None else None
    return None if cls is None else (cls, named[1])


#: the methods an endpoint answers (its 405 names them in ``Allow``)
ALLOWED = ("OPTIONS", "POST")


def endpoints_init_app(app, csrf) -> None:
    app.url_map.converters["endpoint_prefix"] = EndpointPrefix
    if type(app.session_interface) is SecureCookieSessionInterface:
        app.session_interface = _NoSessionAtEndpoints()
    # methods=None, any method: see EndpointPrefix (Flask's add_url_rule cannot say it)
    app.url_map.add(Rule("/<endpoint_prefix:cls>/<instance>", endpoint="endpoints.receive"))
    app.view_functions["endpoints.receive"] = receive
    app.register_blueprint(bp)
    csrf.exempt(bp)  # authenticated by the protocol, not by a session
    if not tracing.enabled():
        app.wsgi_app = EndpointsFirst(app, app.wsgi_app)


def plain(status: int, text: str) -> EndpointReply:
    return EndpointReply(status, {"Content-Type": "text/plain; charset=utf-8"},
                         (text + "\n").encode())


def receive(cls: type, instance: str):
    """The view of ``/<prefix>/<instance>`` of a registered prefix, whatever the method
    (an unknown prefix never gets here: :class:`EndpointPrefix`)."""
    if request.method == "POST":
        return answer(cls, instance, request)
    if request.method == "OPTIONS":  # as Flask's automatic OPTIONS answered
        return Response(status=200, headers={"Allow": ", ".join(ALLOWED)})
    raise MethodNotAllowed(valid_methods=list(ALLOWED))


class EndpointsFirst:
    """The app's WSGI callable, with ``POST /<prefix>/<instance>`` of a registered type
    answered here before Flask's request handling; every other request goes to the
    app as before (a wrong method, a trailing slash or an unknown prefix included, so
    its 404 and 405 are Flask's).

    An endpoint needs none of that handling: it opens no UI session, has no CSRF token,
    runs no ``before_request`` hook of the API or the UI, and its answer is made here.
    Without Flask's request context, URL matching, hooks and response finishing a 2 KB
    intake took a fifth less of the web process's CPU (``bench/http_intake.py``: 1.64
    against 2.05 ms). What is
    kept: an application context for the request (the database session, the registry,
    the payload store; its teardown ends the session as Flask's did) and werkzeug's
    Request over the same WSGI environment (headers, Content-Length, the body stream).

    Not installed while tracing is on: the Flask instrumentation names and annotates
    each request's span in Flask's hooks, so endpoints go through Flask then."""

    def __init__(self, app: Flask, inner):
        self.app, self.inner = app, inner

    def __call__(self, environ, start_response):
        named = (_endpoint_path(environ.get("PATH_INFO", ""))
                 if environ.get("REQUEST_METHOD") == "POST" else None)
        if named is not None:  # the shape of one: an app context to look the type up
            response = None
            with self.app.app_context():
                cls = endpoint_type(named[0])
                if cls is not None:
                    response = answer(cls, named[1], Request(environ))
                    name_the_server(environ, response)
            if response is not None:
                return response(environ, start_response)
        return self.inner(environ, start_response)


def answer(cls: type, instance: str, request: Request) -> Response:
    """The answer to one request at an endpoint of ``cls``.

    The request's session is taken from ``db.session`` once and handed on as itself:
    every attribute of the scoped proxy looks the session up again by the application
    context (a dozen lookups an intake). ``python bench/http_intake.py --rounds 3
    --count 1000``, two runs each alternated with the code before (2026-12-06, load
    average 4.5 to 5.8): the web CPU a request 3.38 and 2.85 ms (before 3.55 and 2.82)
    where the bare server's was 1.79 and 1.45 (1.64 and 1.37): hub / bare 56% and 61%
    (53% and 56%)."""
    session = db.session()
    wakeups.defer(session)  # what the request commits is woken once it is answered
    try:
        reply = _receive(cls, instance, request, session)
    finally:
        committed = wakeups.stop_deferring(session)
    response = Response(reply.body, reply.status, reply.headers)
    if committed or reply.after:
        response.call_on_close(lambda: _after(committed, reply.after))
    return response


def _receive(cls: type, instance: str, request: Request, session) -> EndpointReply:
    try:
        length, body = request.content_length, request.stream
        small = length is not None and length <= PREREAD
        config = None  # for a small body a "handler" type looks it up with the rest
        checks = IntakeChecks()
        if small:
            body = io.BytesIO(body.read())
        if not small or cls.endpoint_lookup != "handler":
            config, checks = instance_row(session, cls.type_name, instance)
            if not small:
                session.commit()  # its connection back to the pool while the body arrives
            if config is None:
                return plain(404, f"no enabled {cls.endpoint_label or cls.type_name} "
                                  f"named '{instance}'")
        max_size = int((config or {}).get("max_size") or DEFAULT_MAX_SIZE)
        if cls.endpoint_lookup != "handler" and length is not None and length > max_size:
            return plain(413, f"the body is over the size limit of {max_size} bytes")
        return cls.handle_request(EndpointRequest(
            type_name=cls.type_name, instance=instance, config=config,
            headers=[(k, v) for k, v in request.headers.items() if k.lower() != "host"],
            body=body, content_length=length, now=utcnow(), session=session,
            store=hub.store(), max_size=max_size, parties_from=checks.parties_from,
            checks=checks))
    except OSError as exc:  # the payload store: disk full, read-only, gone
        session.rollback()
        log.error("%s %s could not store the message (%s); answered 503", cls.type_name,
                  instance, exc.strerror or exc)
        return plain(503, f"the hub could not store the message ({exc.strerror or exc}); "
                          "nothing was taken; try again later")
    except Exception:
        session.rollback()
        log.exception("%s %s failed; answered 503", cls.type_name, instance)
        return plain(503, "the hub could not take the message now; try again later")


def instance_config(session, type_name: str, instance: str) -> dict | None:
    """The configuration of the enabled instance (None: there is none)."""
    return instance_row(session, type_name, instance)[0]


def instance_row(session, type_name: str, instance: str
                 ) -> tuple[dict | None, IntakeChecks]:
    """The configuration of the enabled instance (None: there is none) and its intake
    checks (``parties_from``, ``edi_errors``, ``duplicates``, ``duplicate_days``:
    docs/edi.md), in one statement."""
    row = connection(session).execute(_INSTANCE, {"name": instance, "type": type_name}).first()
    if row is None or not row.enabled:
        return None, IntakeChecks()
    return dict(row.config or {}), IntakeChecks.of(row)


_INSTANCE = select(PluginInstance.enabled, PluginInstance.config,
                   PluginInstance.parties_from, PluginInstance.edi_errors,
                   PluginInstance.duplicates, PluginInstance.duplicate_days).where(
    PluginInstance.name == bindparam("name"), PluginInstance.type == bindparam("type"))


def _after(committed: list, after) -> None:
    wakeups.publish_now(committed)
    if after is not None:
        try:
            after()
        except Exception:
            log.info("a plugin's after-answer step failed", exc_info=True)
