"""The API's blueprint and its OpenAPI document (flask-smorest: marshmallow + apispec).

:class:`ApiBlueprint` is flask-smorest's Blueprint that also documents, for every view,
the role it needs (``x-required-role``), the bearer security and the 401/403 refusals;
a plain Flask view added with ``@bp.get`` is documented the same way, with the default
error response. :class:`HubApi` serves the document at ``/api/v1/openapi.json`` and
leaves error handling to the blueprint (flask-smorest's own handler would answer every
HTTP error of the whole app, UI pages included, in its own shape).
"""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Callable
from copy import deepcopy

from flask import Flask, current_app
from flask_smorest import Api
from flask_smorest import Blueprint as SmorestBlueprint
from webargs.flaskparser import FlaskParser

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SECURITY_SCHEME = "bearer"


def role_for(view: Callable, method: str) -> str | None:
    """The least role a call needs; None for a public view. Reads need ``viewer``; any
    other method needs ``admin`` unless the view names its role with ``requires``."""
    if getattr(view, "public", False):
        return None
    default = "viewer" if method in READ_METHODS else "admin"
    return getattr(view, "required_role", default)


class ApiError(Exception):
    """An HTTP-level refusal (bad JSON, a missing token) with the error shape's fields."""

    def __init__(self, status: int, code: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details


class Parser(FlaskParser):
    """webargs' parser, refusing bad input in the API's error shape: 400 ``invalid``
    with one message per field in ``details``."""

    DEFAULT_VALIDATION_STATUS = 400
    # unknown fields: what each schema says (RAISE unless it says otherwise), in the
    # query string too, where webargs would otherwise drop them silently
    DEFAULT_UNKNOWN_BY_LOCATION: dict = {}

    def handle_error(self, error, req, schema, *, error_status_code, error_headers):
        details = _flatten(error.messages)
        # webargs files the messages under the location they were read from
        if len(details) == 1 and next(iter(details)) in self.__location_map__:
            details = next(iter(details.values()))
            details = details if isinstance(details, dict) else {"_body": details}
        details = {key: _text(value) for key, value in details.items()}
        summary = "; ".join(_sentence(key, text) for key, text in details.items())
        raise ApiError(400, "invalid", summary or "the request is not valid",
                       {k: v for k, v in details.items() if not k.startswith("_")})

    def _handle_invalid_json_error(self, error, req, *args, **kwargs):
        raise ApiError(400, "invalid", "the request body is not valid JSON")


def _flatten(messages) -> dict:
    return messages if isinstance(messages, dict) else {"_body": messages}


def _text(value) -> str | dict:
    """A field's messages as one sentence; a nested object's as a dict of them."""
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _text(v) for k, v in value.items()}
        return "; ".join(f"item {k}: {_text(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "; ".join(str(v) for v in value)
    return str(value)


def _sentence(field: str, text) -> str:
    if field in ("_schema", "_body"):
        return "the request body must be a JSON object" if "Invalid input type" in \
            str(text) else str(text)
    if text == "Missing data for required field.":
        return f"missing field: {field}"
    if text == "Unknown field.":
        return f"unknown field: {field}"
    return f"{field}: {text}"


#: the first path segment of a call -> its tag (the area it belongs to) and the tag's text
AREAS = {
    "organizations": "parties", "partners": "parties", "plugins": "plugins",
    "routes": "routes", "messages": "messages", "deliveries": "deliveries",
    "alerts": "alerts", "expected": "alerts", "notifications": "notifications", "users": "users",
    "tokens": "tokens", "events": "events", "logs": "logs", "processes": "system",
    "stats": "system", "storage": "system", "health": "system", "metrics": "system",
}
TAGS = {
    "parties": "Organizations (ours) and partners, and their protocol profiles",
    "plugins": "Plugin types and their instances (sources and targets)",
    "routes": "Routes from a source and parties to a target, and the route tester",
    "messages": "Messages: the list, one message, sending by hand, operator actions",
    "deliveries": "Deliveries of messages to targets, and the operator actions on them",
    "alerts": "Alerts and acknowledging them; expected-message rules and their windows",
    "notifications": "Alert notification channels and the notifications sent",
    "users": "UI users (admins only)",
    "tokens": "API tokens (admins only)",
    "events": "History lines as Server-Sent Events",
    "logs": "Log records of every process",
    "system": "Health, processes, figures, storage and Prometheus metrics",
}
#: the refusals an operation may name, by status
REFUSALS = {400: "BAD_REQUEST", 404: "NOT_FOUND", 409: "CONFLICT", 413: "REQUEST_ENTITY_TOO_LARGE",
            422: "UNPROCESSABLE_ENTITY", 503: "SERVICE_UNAVAILABLE"}


#: the operation's body fields whose validity depends on what the hub holds (a name that
#: must exist, a certificate that must parse, a plugin type's settings): a 422 naming only
#: these may answer a body the schema calls valid
SERVER_CHECKS = "x-server-checks"


def area_of(rule: str) -> str:
    first = rule.strip("/").split("/")[0]
    return AREAS.get(first, "system")


def summary_of(endpoint: str) -> str:
    """``list_users`` -> "List users": the default summary of an operation."""
    words = endpoint.split(".")[-1].replace("_", " ")
    return words[:1].upper() + words[1:]


def _no_content_no_type(response):
    """A 204 has no body, so it says no content type (Flask would say text/html)."""
    if response.status_code == 204:
        response.headers.pop("Content-Type", None)
        response.headers.pop("Content-Length", None)
    return response


class ApiBlueprint(SmorestBlueprint):
    """flask-smorest's Blueprint documenting, for every operation: its ``operationId``
    (the endpoint name), a summary (``summary=``, else made from the endpoint name) with
    the docstring as description, its area's tag, the role it needs, and the refusals it
    gives: 400 when it reads arguments, 404 when its path names an object (and any other
    named with ``refusals=``), 401/403 unless it is public; ``server_checks=`` names the
    body fields only the hub can judge (``x-server-checks``)."""

    ARGUMENTS_PARSER = Parser()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        #: ``hook(doc, registry)`` calls that complete the served document with what only
        #: the app's plugin registry knows (the profile kinds' paths)
        self.document_hooks: list[Callable] = []
        self.after_request(_no_content_no_type)

    def document_hook(self, hook: Callable) -> Callable:
        self.document_hooks.append(hook)
        return hook

    def add_url_rule(self, rule, endpoint=None, view_func=None,
                     provide_automatic_options=None, *, summary: str | None = None,
                     refusals: tuple[int, ...] = (), server_checks: tuple[str, ...] = (),
                     tags=None, **options):
        super().add_url_rule(rule, endpoint, view_func, provide_automatic_options,
                             tags=tags or [area_of(rule)], **options)
        name = self._endpoints[-1]
        docs = self._docs[name]
        for method, doc in docs.items():
            if method == "parameters":
                continue
            role = role_for(view_func, method.upper())
            manual = doc.setdefault("manual_doc", {})
            manual.setdefault("operationId", name)
            if server_checks:
                manual[SERVER_CHECKS] = list(server_checks)
            text = (view_func.__doc__ or "").strip()
            doc["docstring"] = {"summary": summary or summary_of(name),
                                **({"description": inspect.cleandoc(text)} if text else {})}
            if "response" not in doc and not doc.get("success"):
                # a plain view (no @bp.response): documented as a JSON object whose fields
                # its docstring describes, so a client and a checker know what comes back
                manual.setdefault("responses", {}).setdefault(200, {
                    "description": "OK",
                    "content": {"application/json": {"schema": {"type": "object"}}}})
            responses = manual.setdefault("responses", {})
            wanted = set(refusals)
            if "<" in rule:
                wanted.add(404)
            if doc.get("arguments") or getattr(view_func, "reads_body", False):
                wanted.add(400)  # the shape: what the schemas say
                if method != "get":
                    wanted.add(422)  # valid data refused for what the hub holds (errors.py)
            if server_checks:
                wanted.add(422)
            for status in sorted(wanted):
                responses.setdefault(status, REFUSALS[status])
            if role is None:
                manual.setdefault("security", [])
                continue
            manual["x-required-role"] = role
            responses.setdefault(401, "UNAUTHORIZED")
            responses.setdefault(403, "FORBIDDEN")
            doc["docstring"]["description"] = (
                doc["docstring"].get("description", "") + f"\n\nRole: {role}.").strip()


def document_operation(operation: dict, role: str | None) -> None:
    """Complete an operation written into the served document by a hook as
    :meth:`ApiBlueprint.add_url_rule` does for a view: refusals (given as
    ``{status: None}``) as references, the role and its 401/403, the default answer."""
    responses = operation.setdefault("responses", {})
    if role is None:
        operation["security"] = []
    else:
        operation["x-required-role"] = role
        responses.update({401: None, 403: None})
        operation["description"] = f"{operation.get('description', '')}\n\nRole: {role}."
    responses["default"] = {"$ref": "#/components/responses/DEFAULT_ERROR"}
    for status, answer in list(responses.items()):
        if answer is None:
            name = REFUSALS.get(status) or {401: "UNAUTHORIZED", 403: "FORBIDDEN"}[status]
            responses[status] = {"$ref": f"#/components/responses/{name}"}
    operation["responses"] = {str(k): v for k, v in responses.items()}


class HubApi(Api):
    """flask-smorest's ``Api``, documenting its views when the document is first read.

    ``register_blueprint`` adds the routes at once but leaves the OpenAPI paths to
    :meth:`document`: building them (apispec resolving every schema) was 40% of
    ``create_app`` (45 of 114 ms of CPU, load average 2.9 on 2 cores), paid by every web
    process at its start and by each of the suite's 2,000 apps, most of which never read
    the document. A process that serves it, or refuses a body (api/errors.py), builds it
    once."""
    document_hooks: list[Callable] = []

    def __init__(self, *args, **kwargs):
        self._undocumented: list[Callable[[], None]] = []
        self._documenting = threading.Lock()  # two threads' first reads build it once
        super().__init__(*args, **kwargs)

    def _register_error_handlers(self):
        """The blueprint's handlers answer in the API's shape; nothing app-wide here."""

    def register_blueprint(self, blp, *, parameters=None, **options):
        """flask-smorest's, with the views' documentation deferred (the class's text)."""
        name = options.get("name", blp.name)
        self._app.extensions["flask-smorest"]["blp_name_to_api"][name] = self
        self._app.register_blueprint(blp, **options)
        self._undocumented.append(lambda: blp.register_views_in_doc(
            self, self._app, self.spec, name=name, parameters=parameters))

    def after_documenting(self, step: Callable[[], None]) -> None:
        """Run ``step`` on the spec once the views are in it (at the first read)."""
        self._undocumented.append(step)

    def documented_spec(self):
        """The apispec object with every registered view in it."""
        with self._documenting:
            while self._undocumented:
                self._undocumented.pop(0)()
        return self.spec

    _built: tuple[tuple, dict] | None = None

    def document(self) -> dict:
        """The document, completed by the blueprint's hooks for this app's plugins; to
        read, not to change. Built once per set of plugin types (the hooks read nothing
        else): every refusal of a body reads it (api/errors.py). Building it takes 38 ms
        (cached: 4 us; load average 3.4 on 2 cores), most of a refused request's time:
        tests/test_api_fuzz.py took 200 s before, 94 s after."""
        registry = current_app.extensions.get("b2bhub.plugin.registry")
        key = (id(registry), tuple(sorted(registry.types().items())) if registry else ())
        built = self._built
        if built is None or built[0] != key:
            doc = deepcopy(self.documented_spec().to_dict())
            for hook in self.document_hooks:
                hook(doc, registry)
            self._built = built = (key, doc)
        return built[1]

    def _openapi_json(self):
        doc = self.document()
        return current_app.response_class(json.dumps(doc, indent=2),
                                          mimetype="application/json")


def init_api(app: Flask, blueprint: ApiBlueprint) -> HubApi:
    from b2bhub.api.schemas import ErrorSchema
    app.config.setdefault("API_TITLE", "b2bhub")
    app.config.setdefault("API_VERSION", "v1")
    app.config.setdefault("OPENAPI_VERSION", "3.0.3")
    app.config.setdefault("OPENAPI_URL_PREFIX", blueprint.url_prefix)
    app.config.setdefault("OPENAPI_JSON_PATH", "openapi.json")
    app.config.setdefault("API_SPEC_OPTIONS", {
        "info": {"description": "The b2bhub REST API. Every call but health needs "
                 "`Authorization: Bearer <token>` (`b2bhub token create`); "
                 "`x-required-role` names the least role it needs (viewer < operator "
                 "< admin). Errors: `{\"error\": {\"code\", \"message\", \"details\"}}`. "
                 "Lists: `limit` and `cursor` (the `next_cursor` of the previous page). "
                 "A request the schemas call invalid is refused with 400 naming the "
                 "fields in `details`. A body the schemas call valid is accepted, except "
                 "that the fields an operation lists in `x-server-checks` are also judged "
                 "against what the hub holds (a name that must exist, a certificate that "
                 "must parse): a 422 then names them in `details`."},
        "security": [{SECURITY_SCHEME: []}],
        "components": {"securitySchemes": {SECURITY_SCHEME: {
            "type": "http", "scheme": "bearer",
            "description": "an API token from `b2bhub token create` or POST /tokens"}}},
    })
    HubApi.ERROR_SCHEMA = ErrorSchema
    api = HubApi(app)
    app.extensions["b2bhub.api"] = api

    def events() -> None:
        # the events of the streams (``x-event-data``), named by no response of their own
        from b2bhub.api.schemas import HistoryEvent
        api.spec.components.schema("HistoryEvent", schema=HistoryEvent)

    def areas() -> None:
        # the areas' tags instead of one for the whole blueprint (which flask-smorest's
        # register_blueprint would add: HubApi's adds none)
        for name, text in TAGS.items():
            api.spec.tag({"name": name, "description": text})
    api.after_documenting(events)
    api.register_blueprint(blueprint)
    api.after_documenting(areas)
    api.document_hooks = blueprint.document_hooks  # also those added after this call
    return api


#: the API's blueprint: the view modules of :mod:`b2bhub.api` add their routes to it, and
#: the package imports them (so no view imports its package)
bp = ApiBlueprint("api", "b2bhub.api", url_prefix="/api/v1", description="b2bhub REST API")
