"""Every API call: its role check (from the OpenAPI document, so a new call is covered
the day it is added), its validation errors, and the success paths of the calls that
tests/test_api.py and tests/test_api_actions.py do not cover: filters, bulk redeliver,
alerts, users and tokens. Also: the document itself validates and lists every route."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from flask import Flask, jsonify
from openapi_spec_validator import validate as validate_openapi
from sqlalchemy import select

from b2bhub.api.blueprint import ApiBlueprint, init_api
from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.history import raise_alert
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import Alert, ApiToken, Delivery, HistoryLine, User, utcnow
from b2bhub.services.profiles import profile_kinds
from b2bhub.services.users import check_login, create_user
from tests.test_api import error_of, token_client

T0 = datetime(2024, 5, 1, 12, 0, 0)
ROLES = ("viewer", "operator", "admin")


@pytest.fixture
def spec(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    return response.get_json()


def operations(spec: dict):
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method in ("get", "put", "post", "delete", "patch"):
                shared = item.get("parameters", [])
                yield path, method, {**operation, "parameters": shared + operation.get(
                    "parameters", [])}


def concrete(path: str, operation: dict) -> str:
    """A URL for a documented path: the first allowed value of an enum parameter, an id
    or a name that does not exist otherwise (the role check comes before any lookup)."""
    params = {p["name"]: p for p in operation.get("parameters", []) if p["in"] == "path"}

    def value(match: re.Match) -> str:
        schema = params[match.group(1)]["schema"]
        if "enum" in schema:
            return schema["enum"][0]
        return "999999" if schema["type"] == "integer" else "some-name"
    return re.sub(r"{(\w+)}", value, path)


# --- the document ----------------------------------------------------------------------

def test_the_openapi_document_is_valid_and_lists_every_api_route(app, spec):
    validate_openapi(spec)
    documented = {(re.sub(r"{\w+}", "{}", path), method.upper())
                  for path, method, _ in operations(spec)}
    served = set()
    kinds = profile_kinds(app.extensions["b2bhub.plugin.registry"])
    for rule in app.url_map.iter_rules():
        if rule.endpoint.startswith("api.") or rule.endpoint == "metrics.metrics":
            path = re.sub(r"<[^>]+>", "{}", rule.rule)
            # a profile rule takes any kind; the document has a path per registered kind
            paths = [path.replace("/profiles/{}", f"/profiles/{kind}") for kind in kinds] \
                if path.endswith("/profiles/{}") else [path]
            # and a kind's actions, a path per action it offers
            if path.endswith("/profiles/{}/actions/{}"):
                paths = [path.replace("/profiles/{}/actions/{}",
                                      f"/profiles/{kind}/actions/{action}")
                         for kind, found in kinds.items()
                         for action in getattr(found, "actions", ())]
            # and the presets of the kinds that have them, a path per such kind
            if path.endswith("/profile-kinds/{}/presets"):
                paths = [path.replace("/profile-kinds/{}/", f"/profile-kinds/{kind}/")
                         for kind, found in kinds.items()
                         if getattr(found, "has_presets", False)]
            if path.endswith("/plugins/configs/{}/actions/{}"):
                types = app.extensions["b2bhub.plugin.registry"].types().values()
                paths = [path.replace("/actions/{}", f"/actions/{action}") for cls in types
                         for action in getattr(cls, "instance_actions", ())]
            served |= {(p, m) for p in paths for m in rule.methods - {"HEAD", "OPTIONS"}}
    assert served and served == documented
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    error = spec["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
    for path, method, operation in operations(spec):
        assert "default" in operation["responses"], (path, method)
        if path == "/api/v1/health":
            assert operation["security"] == [] and "x-required-role" not in operation
        else:
            assert operation["x-required-role"] in ROLES, (path, method)
            assert {"401", "403"} <= set(operation["responses"]), (path, method)


def test_every_operation_has_an_id_a_summary_and_its_area_tag(spec):
    tags = {tag["name"] for tag in spec["tags"]}
    ids = [operation["operationId"] for _, _, operation in operations(spec)]
    assert len(ids) == len(set(ids))
    for path, method, operation in operations(spec):
        assert operation["summary"] and "\n" not in operation["summary"], (path, method)
        assert len(operation["tags"]) == 1 and operation["tags"][0] in tags, (path, method)
    by_id = {operation["operationId"]: (path, method) for path, method, operation
             in operations(spec)}
    assert by_id["redeliver_delivery"] == ("/api/v1/deliveries/{delivery_id}/redeliver", "post")
    assert by_id["send_again_delivery"][0] == "/api/v1/deliveries/{delivery_id}/send-again"
    assert by_id["redispatch_message"][0] == "/api/v1/messages/{message_id}/redispatch"
    assert by_id["list_partners"] == ("/api/v1/partners", "get")
    assert by_id["stop_instance"][0] == "/api/v1/plugins/configs/{name}/stop"
    assert not any("{collection}" in path or "{action}" in path for path in spec["paths"])
    stats = spec["paths"]["/api/v1/stats"]["get"]["responses"]["200"]
    assert stats["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Stats"}
    events = spec["paths"]["/api/v1/events"]["get"]["responses"]["200"]["content"]
    assert set(events) == {"text/event-stream"}
    metrics = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert set(metrics) == {"text/plain"}


def test_a_204_has_no_body_and_no_content_type_and_a_405_says_what_is_allowed(
        app, registry, api, hub):
    from plugins.as2.plugin import As2Receiver
    from tests.as2kit import make_pair
    registry.register(As2Receiver)
    hub.parties(partners=("acme",))
    pem, _key = make_pair("acme")
    assert api.put("/api/v1/partners/acme/profiles/as2", json={
        "as2_id": "ACME", "url": "http://127.0.0.1:9/as2",
        "certificate": {"pem": pem}}).status_code == 200
    for url in ("/api/v1/partners/acme/profiles/as2", "/api/v1/partners/acme"):
        gone = api.delete(url)
        assert gone.status_code == 204 and gone.data == b"", url
        assert "Content-Type" not in gone.headers, (url, gone.headers)
    for method in ("TRACE", "PATCH"):
        refused = api.open("/api/v1/messages", method=method)
        assert refused.status_code == 405
        assert set(refused.headers["Allow"].split(", ")) == {"GET", "HEAD", "OPTIONS", "POST"}
        assert refused.get_json()["error"]["code"] == "method_not_allowed"


def test_a_profile_kind_of_a_plugin_gets_its_paths_and_schemas(app, registry, api):
    from plugins.as2.plugin import As2Receiver
    registry.register(As2Receiver)
    spec = api.get("/api/v1/openapi.json").get_json()
    validate_openapi(spec)
    item = spec["paths"]["/api/v1/partners/{name}/profiles/as2"]
    assert {item[m]["operationId"] for m in ("get", "put", "delete")} == {
        "get_partner_as2_profile", "put_partner_as2_profile", "delete_partner_as2_profile"}
    body = spec["components"]["schemas"]["As2ProfileIn"]
    assert body["properties"]["mdn_mode"]["enum"] == ["none", "sync", "async"]
    assert body["properties"]["as2_id"]["maxLength"] == 128
    assert item["put"]["x-server-checks"]
    assert set(item["delete"]["responses"]) >= {"204", "401", "403", "404"}


def test_the_document_describes_filters_and_pages(spec):
    params = {p["name"]: p for p in spec["paths"]["/api/v1/messages"]["get"]["parameters"]}
    assert {"limit", "cursor", "status", "from", "to", "source", "target", "since",
            "until", "q"} <= set(params)
    assert params["limit"]["schema"]["maximum"] == 500
    deliveries = {p["name"] for p in spec["paths"]["/api/v1/deliveries"]["get"]["parameters"]}
    assert {"state", "message"} <= deliveries and set(params) - {"cursor"} <= deliveries
    page = spec["components"]["schemas"]["MessagePage"]
    assert set(page["properties"]) == {"items", "next_cursor"}


def test_retry_policies_and_business_rules_are_typed_as_the_hub_reads_them(spec):
    """A client generated from the document gets the policy's and the rules' fields,
    with the choices the hub accepts, not a bare object."""
    schemas = spec["components"]["schemas"]
    # one shape per plugin type (and OtherInstance): every one of them says so
    shapes = [ref["$ref"].rsplit("/", 1)[1] for name in ("InstanceFields", "Instance")
              for ref in schemas[name].get("anyOf", schemas[name].get("oneOf"))]
    assert len(shapes) == 2 * len(schemas["InstanceCreate"]["oneOf"]) + 1
    for shape in shapes:
        policy = schemas[shape]["properties"]["retry_policy"]
        assert policy["additionalProperties"] is False
        assert set(policy["properties"]) == {"strategy", "base_delay", "max_delay",
                                             "max_attempts", "jitter", "schedule", "rules"}
        assert policy["properties"]["strategy"]["enum"] == [
            "fixed", "linear", "exponential", "schedule"]
        assert policy["properties"]["rules"]["items"]["properties"]["action"]["enum"] == [
            "retry", "fail"]
        rule = schemas[shape]["properties"]["business_rules"]["items"]
        assert set(rule["properties"]) == {"name", "status", "body_regex", "json_path",
                                           "json_value", "block"}
        assert {"none", "sequence", "instance"} <= set(rule["properties"]["block"]["enum"])


def test_a_plain_flask_view_on_an_api_blueprint_is_served_and_documented(tmp_path):
    bp = ApiBlueprint("probe", __name__, url_prefix="/probe")

    @bp.get("/plain")
    def plain():
        return jsonify({"ok": True})

    app = Flask(__name__)
    init_api(app, bp)
    client = app.test_client()
    assert client.get("/probe/plain").get_json() == {"ok": True}
    spec = client.get("/probe/openapi.json").get_json()
    validate_openapi(spec)
    operation = spec["paths"]["/probe/plain"]["get"]
    assert operation["x-required-role"] == "viewer" and "default" in operation["responses"]


# --- role checks, one per call ------------------------------------------------------------

def test_every_call_refuses_without_a_token_and_below_its_role(app, session, spec):
    """Each documented call: 401 without a token, 403 one role below the one it names,
    and not 401/403 with that role."""
    clients = {role: token_client(app, session, role, f"{role}-probe") for role in ROLES}
    anonymous = app.test_client()
    checked = 0
    for path, method, operation in operations(spec):
        url = concrete(path, operation)
        needed = operation.get("x-required-role")
        if needed is None:
            assert getattr(anonymous, method)(url).status_code == 200
            continue
        error_of(getattr(anonymous, method)(url, json={}), 401, "unauthorized")
        rank = ROLES.index(needed)
        if rank > 0:
            below = ROLES[rank - 1]
            error = error_of(getattr(clients[below], method)(url, json={}), 403, "forbidden")
            assert f"needs the {needed} role" in error["message"]
        allowed = getattr(clients[needed], method)(url, json={})
        assert allowed.status_code not in (401, 403), (method, url, allowed.get_json())
        checked += 1
    assert checked >= 30


# --- validation errors, one table -------------------------------------------------------

VALIDATION = [
    ("get", "/api/v1/messages?limit=0", None, "limit"),
    ("get", "/api/v1/messages?since=yesterday", None, "since"),
    ("get", "/api/v1/messages?status=lost", None, "status"),
    ("get", "/api/v1/messages?q=", None, "q"),
    ("get", "/api/v1/messages?cursor=garbage", None, "cursor"),
    ("get", "/api/v1/messages?stauts=error", None, "stauts"),  # misspelt: not ignored
    ("get", "/api/v1/deliveries?state=lost", None, "state"),
    ("get", "/api/v1/deliveries?status=lost", None, "status"),
    ("get", "/api/v1/deliveries?until=later", None, "until"),
    ("get", "/api/v1/organizations?limit=501", None, "limit"),
    ("get", "/api/v1/partners?cursor=%%%", None, "cursor"),
    ("get", "/api/v1/plugins/configs?limit=x", None, "limit"),
    ("get", "/api/v1/routes?cursor=InhfIg", None, "cursor"),
    ("get", "/api/v1/alerts?state=closed", None, "state"),
    ("get", "/api/v1/users?limit=-1", None, "limit"),
    ("get", "/api/v1/tokens?revoked=perhaps", None, "revoked"),
    ("post", "/api/v1/partners", {"display_name": "no name"}, "name"),
    ("post", "/api/v1/organizations", {"name": "x", "colour": "red"}, "colour"),
    ("put", "/api/v1/partners/acme", {}, "display_name"),
    ("post", "/api/v1/plugins/configs", {"name": "w", "type": "noop", "enabled": "yes"},
     "enabled"),
    ("put", "/api/v1/plugins/configs/inbox", {"max_concurrent_deliveries": 0},
     "max_concurrent_deliveries"),
    ("post", "/api/v1/routes", {"source": "inbox"}, "target"),
    ("post", "/api/v1/routes/test", {"from": "acme"}, "source"),
    ("post", "/api/v1/deliveries/redeliver", {"state": ["delivered"]}, "state"),
    ("post", "/api/v1/deliveries/redeliver", {"max": 0}, "max"),
    ("post", "/api/v1/users", {"name": "bob"}, "password"),
    ("post", "/api/v1/users", {"name": "bob", "password": "long enough", "role": "root"},
     "role"),
    ("post", "/api/v1/users", {"name": "bob", "password": "short"}, "password"),
    ("post", "/api/v1/users", {"name": "has space", "password": "long enough"}, "name"),
    ("put", "/api/v1/users/tests-admin", {"disabled": "no"}, "disabled"),
    ("put", "/api/v1/users/tests-admin", {"password": "short"}, "password"),
    ("post", "/api/v1/tokens", {}, "name"),
    ("post", "/api/v1/tokens", {"name": "ci", "role": "root"}, "role"),
]

#: valid in the document's shape, refused for what the hub holds: 422 (the operation
#: lists the field in x-server-checks)
MEANING = [
    ("post", "/api/v1/tokens", {"name": "ci", "user": "tests-admin", "role": "viewer"},
     "role"),
    ("post", "/api/v1/routes", {"source": "inbox", "from": "nobody", "target": "writer_a"},
     "from"),
    ("put", "/api/v1/partners/acme", {"display_name": "A", "edi_identities": ["ZZ:A+B"]},
     "edi_identities"),
]


@pytest.mark.parametrize(("method", "url", "body", "field"), VALIDATION,
                         ids=[f"{m} {u} {f}" for m, u, _b, f in VALIDATION])
def test_bad_input_is_400_invalid_naming_the_field(configured_admin, method, url, body,
                                                   field):
    response = getattr(configured_admin, method)(url, json=body)
    error = error_of(response, 400, "invalid")
    assert field in error["details"], error
    assert field in error["message"], error


@pytest.mark.parametrize(("method", "url", "body", "field"), MEANING,
                         ids=[f"{m} {u} {f}" for m, u, _b, f in MEANING])
def test_valid_input_refused_for_what_the_hub_holds_is_422_naming_the_field(
        configured_admin, method, url, body, field):
    response = getattr(configured_admin, method)(url, json=body)
    error = error_of(response, 422, "invalid")
    assert set(error["details"]) == {field}, error


def test_an_id_beyond_what_the_database_holds_is_a_404(configured_admin):
    for url in ("/api/v1/messages/9223372036854775808", "/api/v1/tokens/2147483648",
                "/api/v1/routes/2147483648"):  # tokens and routes have INTEGER ids
        method = configured_admin.get if "messages" in url else configured_admin.delete
        error_of(method(url), 404, "not_found")
    error_of(configured_admin.get("/api/v1/routes?cursor=MjE0NzQ4MzY0OA"), 400, "invalid")
    error = error_of(configured_admin.get("/api/v1/deliveries?message=9223372036854775808"),
                     400, "invalid")
    assert "message" in error["details"]


def test_bodies_that_are_not_json_objects_are_refused(configured_admin):
    for body in ("{not json", "[1, 2]", "null"):
        response = configured_admin.post("/api/v1/users", data=body,
                                         content_type="application/json")
        error = error_of(response, 400, "invalid")
        assert "JSON" in error["message"]


@pytest.fixture
def configured_admin(app, session, hub, record_dir):
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    hub.instance("inbox", "manual_source")
    for name in ("writer_a", "writer_b"):
        hub.instance(name, "recorder", config={"record_dir": str(record_dir)})
    return user_client(app, session, "tests-admin", "admin")


def user_client(app, session, name: str, role: str):
    from b2bhub.services.tokens import create_token
    user = create_user(session, name, "long enough pw", role)
    token = create_token(session, f"{name}-token", user=user)
    session.commit()
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client


# --- message and delivery filters -------------------------------------------------------

def test_q_finds_by_id_file_name_and_external_id(configured_admin, hub):
    hub.route("inbox", "*", "*", "writer_a")
    invoice = hub.message(filename="Invoice_May.edi", external_id="EXT-1", now=T0)
    order = hub.message(filename="order.edi", correlation_id="CORR-9",
                        now=T0 + timedelta(minutes=1))

    def ids(query: str) -> list[int]:
        response = configured_admin.get(f"/api/v1/messages?{query}")
        assert response.status_code == 200, response.get_json()
        return [m["id"] for m in response.get_json()["items"]]

    assert ids("q=invoice") == [invoice.id]
    assert ids("q=.EDI") == [order.id, invoice.id]
    assert ids("q=EXT-1") == [invoice.id]
    assert ids("q=CORR-9") == [order.id]
    assert ids(f"q={order.id}") == [order.id]
    assert ids("q=100%25") == []  # a literal %, not a wildcard
    assert ids("q=invoice&from=globex") == []


def test_deliveries_filter_on_their_message_and_state(configured_admin, hub, session):
    hub.route("inbox", "*", "*", "writer_a")
    hub.route("inbox", "globex", "*", "writer_b")
    acme = hub.message(from_party="acme", filename="a.edi", now=T0)
    globex = hub.message(from_party="globex", filename="g.edi", now=T0 + timedelta(hours=1))
    _fail(session, "writer_a")  # the oldest due: acme's delivery to writer_a

    def found(query: str) -> set[tuple[int, str]]:
        response = configured_admin.get(f"/api/v1/deliveries?{query}")
        assert response.status_code == 200, response.get_json()
        return {(d["message_id"], d["target"]) for d in response.get_json()["items"]}

    assert found("from=acme") == {(acme.id, "writer_a")}
    assert found("from=globex&target=writer_b") == {(globex.id, "writer_b")}
    assert found("to=mycompany&source=inbox&state=queued") == {
        (globex.id, "writer_a"), (globex.id, "writer_b")}
    assert found("status=error") == {(acme.id, "writer_a")}
    assert found("state=failed") == {(acme.id, "writer_a")}
    assert found("q=g.edi") == {(globex.id, "writer_a"), (globex.id, "writer_b")}
    assert found("since=2024-05-01T12:30:00Z") == {(globex.id, "writer_a"),
                                                  (globex.id, "writer_b")}
    assert found("until=2024-05-01T12:30:00Z") == {(acme.id, "writer_a")}


def _fail(session, target: str) -> int:
    now = utcnow()
    [claim] = claiming.claim(session, target, "w1", now, 1, 300)
    settlement.settle(session, claim, Outcome.failed("boom"), RetryPolicy(), now)
    session.commit()
    return claim.delivery_id


# --- bulk redeliver -------------------------------------------------------------------------

def test_bulk_redeliver_takes_the_failed_ones_matching_and_names_the_operator(
        app, session, hub, configured_admin):
    hub.route("inbox", "*", "*", "writer_a")
    hub.route("inbox", "*", "*", "writer_b")
    for minute in range(3):
        hub.message(now=T0 + timedelta(minutes=minute))
    failed_a = [_fail(session, "writer_a") for _ in range(3)]
    failed_b = _fail(session, "writer_b")
    operator = user_client(app, session, "olga", "operator")

    response = operator.post("/api/v1/deliveries/redeliver",
                             json={"target": "writer_a", "max": 2})
    assert response.status_code == 200, response.get_json()
    assert response.get_json() == {"redelivered": failed_a[:2], "skipped": [],
                                   "more": True}
    rest = operator.post("/api/v1/deliveries/redeliver", json={"target": "writer_a"})
    assert rest.get_json() == {"redelivered": failed_a[2:], "skipped": [],
                                "more": False}
    session.expire_all()
    assert {session.get(Delivery, i).state for i in failed_a} == {"queued"}
    assert session.get(Delivery, failed_b).state == "failed"
    lines = session.scalars(select(HistoryLine).where(
        HistoryLine.type == "redeliver_requested")).all()
    assert sorted(line.delivery_id for line in lines) == failed_a
    assert {line.actor for line in lines} == {"olga"}
    nothing = operator.post("/api/v1/deliveries/redeliver", json={"state": ["stalled"]})
    assert nothing.get_json() == {"redelivered": [], "skipped": [], "more": False}


@pytest.mark.parametrize("body", [None, {}, {"max": 10}, {"all": False},
                                  {"status": [], "state": []}])
def test_bulk_redeliver_without_a_filter_or_all_is_refused_and_changes_nothing(
        app, session, hub, configured_admin, body):
    hub.route("inbox", "*", "*", "writer_a")
    hub.message(now=T0)
    failed = _fail(session, "writer_a")
    operator = user_client(app, session, "olga", "operator")

    response = (operator.post("/api/v1/deliveries/redeliver") if body is None else
                operator.post("/api/v1/deliveries/redeliver", json=body))

    assert response.status_code == 400, response.get_json()
    error = response.get_json()["error"]
    assert 'at least one filter' in error["message"] and '"all": true' in error["message"]
    session.expire_all()
    assert session.get(Delivery, failed).state == "failed"
    assert not session.scalars(select(HistoryLine).where(
        HistoryLine.type == "redeliver_requested")).all()


def test_bulk_redeliver_with_all_true_takes_every_one(app, session, hub, configured_admin):
    hub.route("inbox", "*", "*", "writer_a")
    hub.route("inbox", "*", "*", "writer_b")
    hub.message(now=T0)
    failed = sorted([_fail(session, "writer_a"), _fail(session, "writer_b")])
    operator = user_client(app, session, "olga", "operator")

    response = operator.post("/api/v1/deliveries/redeliver", json={"all": True})

    assert response.status_code == 200, response.get_json()
    assert response.get_json() == {"redelivered": failed, "skipped": [], "more": False}
    session.expire_all()
    assert {session.get(Delivery, i).state for i in failed} == {"queued"}
    refused = operator.post("/api/v1/deliveries/redeliver", json={"all": "yes"})
    assert refused.status_code == 400 and "all" in refused.get_json()["error"]["details"]


# --- alerts ---------------------------------------------------------------------------------

def test_alerts_list_and_acknowledge_naming_the_operator(app, session, hub):
    hub.parties()
    hub.instance("inbox", "manual_source")
    message = hub.message()
    raise_alert(session, "message_not_routed", f"message:{message.id}", "no route",
                message_id=message.id, now=T0)
    raise_alert(session, "target_offline", "instance:writer", "refused", now=T0)
    session.commit()
    operator = user_client(app, session, "olga", "operator")
    alerts = operator.get("/api/v1/alerts").get_json()["items"]
    assert [a["kind"] for a in alerts] == ["target_offline", "message_not_routed"]
    not_routed = alerts[1]

    response = operator.post(f"/api/v1/alerts/{not_routed['id']}/acknowledge")
    assert response.status_code == 200
    assert response.get_json()["acknowledged_by"] == "olga"
    line = session.scalar(select(HistoryLine).where(HistoryLine.type == "alert_acknowledged"))
    assert (line.actor, line.message_id) == ("olga", message.id)
    error_of(operator.post(f"/api/v1/alerts/{not_routed['id']}/acknowledge"), 409,
             "already_acknowledged")
    error_of(operator.post("/api/v1/alerts/424242/acknowledge"), 404, "not_found")

    unacked = operator.get("/api/v1/alerts?state=unacknowledged").get_json()["items"]
    assert [a["kind"] for a in unacked] == ["target_offline"]
    assert len(operator.get("/api/v1/alerts?kind=message_not_routed").get_json()["items"]) == 1
    session.scalar(select(Alert).where(Alert.kind == "target_offline")).resolved_at = T0
    session.commit()
    resolved = operator.get("/api/v1/alerts?state=resolved").get_json()["items"]
    assert [a["kind"] for a in resolved] == ["target_offline"]
    assert len(operator.get("/api/v1/alerts?state=all&limit=1").get_json()["items"]) == 1


# --- users and tokens -----------------------------------------------------------------------

def _audit_lines(session, type_: str) -> list[HistoryLine]:
    return session.scalars(select(HistoryLine).where(HistoryLine.type == type_)
                           .order_by(HistoryLine.id)).all()


def test_admin_creates_changes_disables_and_deletes_users(app, session):
    admin = user_client(app, session, "root", "admin")
    response = admin.post("/api/v1/users", json={"name": "carol", "password": "s3cret-pass",
                                                 "role": "operator"})
    assert response.status_code == 201, response.get_json()
    created = response.get_json()
    assert (created["name"], created["role"], created["disabled"]) == (
        "carol", "operator", False)
    assert "password" not in created and "password_hash" not in created
    assert response.headers["Location"].endswith("/api/v1/users/carol")
    assert check_login(session, "carol", "s3cret-pass") is not None
    error_of(admin.post("/api/v1/users", json={"name": "carol", "password": "another1"}),
             409, "conflict")

    changed = admin.put("/api/v1/users/carol", json={"role": "viewer",
                                                     "password": "new-pass-123"})
    assert changed.get_json()["role"] == "viewer"
    assert check_login(session, "carol", "new-pass-123") is not None
    disabled = admin.put("/api/v1/users/carol", json={"disabled": True}).get_json()
    assert disabled["disabled"] is True and disabled["disabled_at"] is not None
    assert check_login(session, "carol", "new-pass-123") is None
    names = [u["name"] for u in admin.get("/api/v1/users").get_json()["items"]]
    assert names == ["carol", "root"]
    assert admin.get("/api/v1/users/carol").get_json()["disabled"] is True

    assert admin.delete("/api/v1/users/carol").status_code == 204
    error_of(admin.get("/api/v1/users/carol"), 404, "not_found")
    error_of(admin.delete("/api/v1/users/carol"), 404, "not_found")
    texts = [(line.type, line.actor, line.text, line.message_id) for line in
             _audit_lines(session, "user_created") + _audit_lines(session, "user_changed")
             + _audit_lines(session, "user_deleted")]
    assert texts == [
        ("user_created", "root", "root created user carol (operator)", None),
        ("user_changed", "root", "root changed user carol: role operator -> viewer, "
                                 "password changed", None),
        ("user_changed", "root", "root changed user carol: disabled", None),
        ("user_deleted", "root", "root deleted user carol and the user's tokens", None)]


def test_an_admin_cannot_lock_themselves_out(app, session):
    admin = user_client(app, session, "root", "admin")
    for change in ({"disabled": True}, {"role": "viewer"}):
        error_of(admin.put("/api/v1/users/root", json=change), 409, "self_change")
    error_of(admin.delete("/api/v1/users/root"), 409, "self_change")
    assert admin.put("/api/v1/users/root", json={"password": "fresh-pass-1"}
                     ).status_code == 200
    session.expire_all()
    assert session.scalar(select(User).where(User.name == "root")).role == "admin"


def test_admin_creates_lists_and_revokes_tokens(app, session):
    admin = user_client(app, session, "root", "admin")
    create_user(session, "dave", "long enough pw", "operator")
    session.commit()
    response = admin.post("/api/v1/tokens", json={"name": "ci", "user": "dave"})
    assert response.status_code == 201, response.get_json()
    made = response.get_json()
    assert (made["user"], made["role"]) == ("dave", "operator")
    assert made["token"].startswith("b2b_")
    own = admin.post("/api/v1/tokens", json={"name": "monitor"}).get_json()
    assert (own["user"], own["role"]) == (None, "viewer")
    error_of(admin.post("/api/v1/tokens", json={"name": "x", "user": "nobody"}), 404)

    dave = app.test_client()
    dave.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {made['token']}"
    assert dave.get("/api/v1/messages").status_code == 200
    listed = admin.get("/api/v1/tokens").get_json()["items"]
    assert [t["name"] for t in listed] == ["root-token", "ci", "monitor"]
    assert all("token" not in t for t in listed)

    assert admin.delete(f"/api/v1/tokens/{made['id']}").status_code == 204
    error_of(dave.get("/api/v1/messages"), 401, "unauthorized")
    error_of(admin.delete(f"/api/v1/tokens/{made['id']}"), 409, "already_revoked")
    error_of(admin.delete("/api/v1/tokens/424242"), 404, "not_found")
    assert [t["name"] for t in admin.get("/api/v1/tokens").get_json()["items"]] == [
        "root-token", "monitor"]
    every = admin.get("/api/v1/tokens?revoked=true&limit=2").get_json()
    assert len(every["items"]) == 2 and every["next_cursor"] is not None
    session.expire_all()
    assert session.get(ApiToken, made["id"]).revoked_at is not None
    assert [(line.actor, line.text) for line in _audit_lines(session, "token_created")] == [
        ("root", f"root created token {made['id']} 'ci' acting as dave"),
        ("root", f"root created token {own['id']} 'monitor' with the viewer role")]
    assert [(line.actor, line.text) for line in _audit_lines(session, "token_revoked")] == [
        ("root", f"root revoked token {made['id']} 'ci'")]
