"""The REST API as a client sees it: tokens and roles, parties, plugin instances, routes,
the route tester, and the read side of messages and deliveries."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from b2bhub.engine.runner import TargetRunner
from b2bhub.models import ApiToken, Party, PluginInstance, Route, utcnow
from b2bhub.plugin.schema import Field
from b2bhub.runtime.hub import new_session
from b2bhub.services.tokens import create_token

T0 = datetime(2024, 5, 1, 12, 0, 0)


def token_client(app, session, role: str, name: str | None = None):
    token = create_token(session, name or f"{role}-token", role)
    session.commit()
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client


def error_of(response, status: int, code: str | None = None) -> dict[str, Any]:
    """The error object of a refusal, after checking its status and shape."""
    assert response.status_code == status, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert set(error) == {"code", "message", "details"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    return error


@pytest.fixture
def configured(hub, record_dir):
    """Two parties, a source and two recorder targets, as most tests need them."""
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    hub.instance("inbox", "manual_source")
    for name in ("writer_a", "writer_b"):
        hub.instance(name, "recorder", config={"record_dir": str(record_dir)})
    return hub


# --- tokens and roles ---------------------------------------------------------------

def test_health_needs_no_token(client):
    response = client.get("/api/v1/health")
    assert response.status_code == 200
    assert response.get_json()["status"] == "ok"


def test_missing_token_is_401_with_the_error_shape(client):
    response = client.get("/api/v1/organizations")
    error = error_of(response, 401, "unauthorized")
    assert "Bearer" in error["message"]
    assert response.headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("header", ["Bearer b2b_not-a-token", "Basic dXNlcjpwYXNz", "Bearer"])
def test_invalid_token_is_401(client, header):
    response = client.get("/api/v1/partners", headers={"Authorization": header})
    error_of(response, 401, "unauthorized")


def test_revoked_token_is_401(app, session):
    viewer = token_client(app, session, "viewer", "old")
    assert viewer.get("/api/v1/partners").status_code == 200
    session.scalar(select(ApiToken).where(ApiToken.name == "old")).revoked_at = utcnow()
    session.commit()
    error_of(viewer.get("/api/v1/partners"), 401, "unauthorized")


def test_viewer_reads_but_may_not_configure(app, session, configured):
    viewer = token_client(app, session, "viewer", "reader")
    assert viewer.get("/api/v1/organizations").status_code == 200
    assert viewer.get("/api/v1/plugins/configs/inbox").status_code == 200
    writes = [("post", "/api/v1/partners", {"name": "initech"}),
              ("put", "/api/v1/partners/acme", {"display_name": "ACME"}),
              ("delete", "/api/v1/partners/globex", None),
              ("post", "/api/v1/plugins/configs", {"name": "x", "type": "noop"}),
              ("delete", "/api/v1/plugins/configs/writer_b", None),
              ("post", "/api/v1/routes", {"source": "inbox", "target": "writer_a"})]
    for method, url, body in writes:
        error = error_of(getattr(viewer, method)(url, json=body), 403, "forbidden")
        assert "admin" in error["message"] and "reader" in error["message"]
    session.expire_all()
    assert session.scalar(select(Party).where(Party.name == "initech")) is None
    assert session.scalar(select(Party).where(Party.name == "globex")) is not None
    assert session.scalars(select(Route)).all() == []


def test_operator_may_not_configure_either(app, session, configured):
    operator = token_client(app, session, "operator")
    response = operator.post("/api/v1/routes", json={"source": "inbox", "target": "writer_a"})
    error_of(response, 403, "forbidden")


def test_the_acting_token_is_recorded_as_the_route_creator(app, session, configured):
    admin = token_client(app, session, "admin", "alice")
    response = admin.post("/api/v1/routes", json={"source": "inbox", "target": "writer_a"})
    assert response.status_code == 201
    assert response.get_json()["created_by"] == "alice"


def test_unknown_api_path_is_404_with_the_error_shape(api):
    error_of(api.get("/api/v1/nothing-here"), 404, "not_found")
    error_of(api.get("/api/v1/messages/not-a-number"), 404)
    error_of(api.patch("/api/v1/routes"), 405)


# --- parties ------------------------------------------------------------------------

def test_party_create_list_get_update(api):
    response = api.post("/api/v1/organizations",
                        json={"name": "mycompany", "display_name": "My Company"})
    assert response.status_code == 201
    assert response.headers["Location"].endswith("/api/v1/organizations/mycompany")
    assert response.get_json()["display_name"] == "My Company"
    assert api.post("/api/v1/partners", json={"name": "acme"}).status_code == 201

    orgs = api.get("/api/v1/organizations").get_json()
    assert [p["name"] for p in orgs["items"]] == ["mycompany"]
    assert orgs["next_cursor"] is None
    assert api.get("/api/v1/partners/acme").get_json()["display_name"] == "acme"

    for name in ("globex", "initech", "umbrella"):
        assert api.post("/api/v1/partners", json={"name": name}).status_code == 201
    partners = collect_pages(api, "/api/v1/partners", 2)
    assert [p["name"] for p in partners] == ["acme", "globex", "initech", "umbrella"]

    response = api.put("/api/v1/partners/acme", json={"display_name": "ACME Corp"})
    assert response.status_code == 200
    assert api.get("/api/v1/partners/acme").get_json()["display_name"] == "ACME Corp"


def test_party_refusals(api):
    assert api.post("/api/v1/partners", json={"name": "acme"}).status_code == 201
    error_of(api.post("/api/v1/organizations", json={"name": "acme"}), 409, "conflict")
    error = error_of(api.post("/api/v1/partners", json={"name": "Bad Name!"}), 400)
    assert "a-z" in error["message"]
    error_of(api.post("/api/v1/partners", json={"name": "x", "colour": "red"}), 400)
    error_of(api.post("/api/v1/partners", json={"display_name": "no name"}), 400)
    error_of(api.post("/api/v1/partners", data="{not json", content_type="application/json"),
             400)
    error_of(api.post("/api/v1/partners", json=["acme"]), 400)
    # the name in the body is not the party's: valid in shape, refused for its meaning
    error_of(api.put("/api/v1/partners/acme", json={"name": "acme2", "display_name": "A"}),
             422)
    error_of(api.get("/api/v1/organizations/acme"), 404, "not_found")
    error_of(api.put("/api/v1/partners/nobody", json={"display_name": "N"}), 404)


def test_party_delete_refused_while_a_route_names_it(api, session, configured):
    configured.route("inbox", "acme", "*", "writer_a")
    error = error_of(api.delete("/api/v1/partners/acme"), 409, "in_use")
    assert "route 1: inbox, acme -> *, writer_a" in error["message"]
    assert api.get("/api/v1/partners/acme").status_code == 200

    assert api.delete("/api/v1/partners/globex").status_code == 204
    error_of(api.get("/api/v1/partners/globex"), 404)
    error_of(api.delete("/api/v1/partners/globex"), 404)


# --- plugin types and instances -----------------------------------------------------

class SecretTarget:
    """A target with a password in its configuration."""

    type_name = "secret_target"
    roles = frozenset({"target"})
    config_schema = [Field("url", "string", required=True),
                     Field("password", "secret", help="sent as basic auth")]

    def __init__(self, instance_name: str, config: dict[str, Any]):
        self.config = config


def test_plugin_types_list_roles_and_schema(api):
    types = {t["name"]: t for t in api.get("/api/v1/plugins/types").get_json()["items"]}
    assert set(types) == {"recorder", "noop", "manual_source", "external_echo"}
    assert types["manual_source"]["roles"] == ["source"]
    schema = types["recorder"]["schema"]
    assert schema["required"] == ["record_dir"]
    assert schema["properties"]["sleep"]["type"] == "number"


def test_instance_create_get_update_list(api, record_dir):
    body = {"name": "writer", "type": "recorder", "config": {"record_dir": str(record_dir)},
            "max_concurrent_deliveries": 3,
            "retry_policy": {"strategy": "fixed", "base_delay": 5, "max_attempts": 2}}
    response = api.post("/api/v1/plugins/configs", json=body)
    assert response.status_code == 201, response.get_json()
    created = response.get_json()
    assert created["config"] == {"record_dir": str(record_dir), "sleep": 0.0,
                                 "fail_attempts": 0, "error_class": "connection",
                                 "claim_batch": 1,
                                 # the core's fields of every target (docs/openpgp.md)
                                 "openpgp_encrypt": False, "openpgp_sign": False}
    assert (created["enabled"], created["max_concurrent_deliveries"]) == (True, 3)
    assert created["retry_policy"]["max_attempts"] == 2
    assert api.get("/api/v1/plugins/configs/writer").get_json() == created

    # a JSON body takes JSON values: the text "0.5" is not a number (a form's would be)
    error = error_of(api.put("/api/v1/plugins/configs/writer", json={
        "config": {"record_dir": str(record_dir), "sleep": "0.5"}}), 400, "invalid")
    assert error["details"] == {"config": {"sleep": "must be a number"}}
    assert api.get("/api/v1/plugins/configs/writer").get_json() == created
    response = api.put("/api/v1/plugins/configs/writer",
                       json={"enabled": False, "max_concurrent_deliveries": 1,
                             "config": {"record_dir": str(record_dir), "sleep": 0.5}})
    assert response.status_code == 200, response.get_json()
    updated = api.get("/api/v1/plugins/configs/writer").get_json()
    assert (updated["enabled"], updated["max_concurrent_deliveries"]) == (False, 1)
    assert updated["config"]["sleep"] == 0.5
    names = [i["name"] for i in api.get("/api/v1/plugins/configs").get_json()["items"]]
    assert names == ["writer"]


def test_instance_refusals(api, record_dir):
    error = error_of(api.post("/api/v1/plugins/configs",
                              json={"name": "w", "type": "recorder",
                                    "config": {"sleep": "slow"}}), 400, "invalid")
    assert error["details"]["config"] == {"record_dir": "required",
                                          "sleep": "must be a number"}
    error = error_of(api.post("/api/v1/plugins/configs", json={"name": "w", "type": "ftp"}),
                     400)  # the document lists the types there are
    assert "ftp" in error["message"] and "recorder" in error["message"]
    error_of(api.post("/api/v1/plugins/configs",
                      json={"name": "w", "type": "noop", "enabled": "yes"}), 400)
    error_of(api.post("/api/v1/plugins/configs",
                      json={"name": "w", "type": "noop", "max_concurrent_deliveries": 0}), 400)
    error_of(api.post("/api/v1/plugins/configs",
                      json={"name": "w", "type": "noop", "queue": "Not A Queue"}), 422)
    assert api.post("/api/v1/plugins/configs",
                    json={"name": "w", "type": "noop"}).status_code == 201
    error_of(api.post("/api/v1/plugins/configs", json={"name": "w", "type": "noop"}), 409)
    error_of(api.put("/api/v1/plugins/configs/w", json={"name": "w2"}), 422)  # renamed
    error_of(api.put("/api/v1/plugins/configs/w", json={"type": "external_echo"}), 422)
    assert api.get("/api/v1/plugins/configs/w").get_json()["type"] == "noop"
    error_of(api.get("/api/v1/plugins/configs/nope"), 404, "not_found")


def test_secrets_are_masked_and_kept_when_sent_back(api, session, registry):
    registry.register(SecretTarget)
    body = {"name": "poster", "type": "secret_target",
            "config": {"url": "https://example.test/in", "password": "s3cret"}}
    assert api.post("/api/v1/plugins/configs", json=body).status_code == 201
    shown = api.get("/api/v1/plugins/configs/poster").get_json()
    assert shown["config"]["password"] == "********"

    shown["config"]["url"] = "https://example.test/v2"
    response = api.put("/api/v1/plugins/configs/poster", json={"config": shown["config"]})
    assert response.status_code == 200
    session.expire_all()
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "poster"))
    assert row.config == {"url": "https://example.test/v2", "password": "s3cret",
                          "openpgp_encrypt": False, "openpgp_sign": False}


def test_instance_delete_refused_while_a_route_uses_it(api, configured):
    configured.route("inbox", "*", "acme", "writer_a")
    error = error_of(api.delete("/api/v1/plugins/configs/writer_a"), 409, "in_use")
    assert "route 1: inbox, * -> acme, writer_a" in error["message"]
    error_of(api.delete("/api/v1/plugins/configs/inbox"), 409, "in_use")
    assert api.delete("/api/v1/plugins/configs/writer_b").status_code == 204
    error_of(api.get("/api/v1/plugins/configs/writer_b"), 404)


# --- routes -------------------------------------------------------------------------

def test_route_create_list_delete(api, configured):
    response = api.post("/api/v1/routes", json={"source": "inbox", "from": "acme",
                                                "to": "mycompany", "target": "writer_a"})
    assert response.status_code == 201
    route = response.get_json()
    assert isinstance(route["id"], int)
    assert {k: route[k] for k in ("source", "from", "to", "target")} == {
        "source": "inbox", "from": "acme", "to": "mycompany", "target": "writer_a"}
    any_route = api.post("/api/v1/routes", json={"source": "inbox", "target": "writer_b"})
    assert (any_route.get_json()["from"], any_route.get_json()["to"]) == ("*", "*")

    listed = api.get("/api/v1/routes").get_json()["items"]
    assert [r["target"] for r in listed] == ["writer_a", "writer_b"]
    assert api.delete(f"/api/v1/routes/{route['id']}").status_code == 204
    assert [r["target"] for r in api.get("/api/v1/routes").get_json()["items"]] == ["writer_b"]
    error_of(api.delete(f"/api/v1/routes/{route['id']}"), 404, "not_found")


def test_redundant_route_is_409_naming_the_route_in_the_way(api, configured):
    first = api.post("/api/v1/routes", json={"source": "inbox", "from": "*", "to": "*",
                                             "target": "writer_a"}).get_json()
    response = api.post("/api/v1/routes", json={"source": "inbox", "from": "acme",
                                                "to": "mycompany", "target": "writer_a"})
    error = error_of(response, 409, "redundant_route")
    assert f"route {first['id']}: inbox, * -> *, writer_a" in error["message"]
    assert error["details"] == {"route": first["id"]}
    # the same parties to another target overlap freely
    assert api.post("/api/v1/routes", json={"source": "inbox", "from": "acme",
                                            "to": "mycompany", "target": "writer_b"}
                    ).status_code == 201


def test_route_refusals(api, configured):
    # what the hub holds: valid in shape, refused for its meaning (422)
    meaning = [{"source": "inbox", "from": "nobody", "target": "writer_a"},
               {"source": "inbox", "target": "missing"},
               {"source": "writer_a", "target": "writer_b"},  # a target cannot start a route
               {"source": "inbox", "target": "inbox"}]        # a source cannot end one
    # what the document says: the wrong shape (400)
    shape = [{"source": "inbox", "from": 7, "target": "writer_a"},
             {"source": "inbox"},
             {"source": "inbox", "target": "writer_a", "via": "x"}]
    for body in meaning:
        error_of(api.post("/api/v1/routes", json=body), 422, "invalid")
    for body in shape:
        error_of(api.post("/api/v1/routes", json=body), 400, "invalid")
    assert api.get("/api/v1/routes").get_json()["items"] == []


def test_route_tester_shows_targets_and_why(app, session, api, configured):
    configured.route("inbox", "acme", "*", "writer_a")
    configured.route("inbox", "*", "mycompany", "writer_b")
    viewer = token_client(app, session, "viewer")
    response = viewer.post("/api/v1/routes/test",
                           json={"source": "inbox", "from": "globex", "to": "mycompany"})
    assert response.status_code == 200
    result = response.get_json()
    assert result["targets"] == ["writer_b"]
    by_target = {line["target"]: line for line in result["routes"]}
    assert by_target["writer_b"]["matched"] is True
    assert by_target["writer_a"]["matched"] is False
    assert "from 'globex' does not match 'acme'" in by_target["writer_a"]["reason"]

    both = api.post("/api/v1/routes/test",
                    json={"source": "inbox", "from": "acme", "to": "mycompany"}).get_json()
    assert both["targets"] == ["writer_a", "writer_b"]
    error_of(api.post("/api/v1/routes/test", json={"from": "acme"}), 400)


# --- messages and deliveries --------------------------------------------------------

def collect_pages(api, url: str, limit: int) -> list[dict]:
    """Every item of a list, page by page, following next_cursor."""
    items, cursor = [], None
    while True:
        sep = "&" if "?" in url else "?"
        query = f"{url}{sep}limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        body = api.get(query).get_json()
        assert len(body["items"]) <= limit
        items.extend(body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return items


def test_message_pages_return_every_message_once_newest_first(api, configured):
    configured.route("inbox", "*", "*", "writer_a")
    ids = [configured.message(now=T0 + timedelta(minutes=i)).id for i in range(7)]

    assert [m["id"] for m in collect_pages(api, "/api/v1/messages", 3)] == ids[::-1]

    first = api.get("/api/v1/messages?limit=3").get_json()
    newer = configured.message(now=T0 + timedelta(hours=1))  # arrives while a client pages
    seen, cursor = [m["id"] for m in first["items"]], first["next_cursor"]
    while cursor:
        body = api.get(f"/api/v1/messages?limit=3&cursor={cursor}").get_json()
        seen.extend(m["id"] for m in body["items"])
        cursor = body["next_cursor"]
    assert seen == ids[::-1]  # no repeat, no gap: the newcomer heads the next first page
    assert api.get("/api/v1/messages?limit=1").get_json()["items"][0]["id"] == newer.id


def test_default_limit_and_limit_bounds(api, configured):
    for i in range(52):
        configured.message(now=T0 + timedelta(seconds=i))
    body = api.get("/api/v1/messages").get_json()
    assert len(body["items"]) == 50 and body["next_cursor"] is not None
    assert len(api.get("/api/v1/messages?limit=500").get_json()["items"]) == 52
    for bad in ("0", "501", "ten", "-1"):
        error = error_of(api.get(f"/api/v1/messages?limit={bad}"), 400, "invalid")
        assert "limit" in error["message"]
    error_of(api.get("/api/v1/messages?cursor=garbage"), 400)
    error_of(api.get("/api/v1/routes?cursor=InhfIg"), 400)  # a string key for an id list


def test_every_cursor_of_the_documented_pattern_is_a_position(api, configured):
    """What the document says a cursor is, is what the API takes: any text of a list's
    pattern is a place in it, anything else a 400 (a client can check before asking)."""
    names = [p["name"] for p in collect_pages(api, "/api/v1/partners", 1)]
    assert names == ["acme", "globex"]
    after_acme = api.get("/api/v1/partners?cursor=YWNtZQ").get_json()  # "acme"
    assert [p["name"] for p in after_acme["items"]] == ["globex"]
    # bytes that are no text, NUL bytes: still positions (before every name here)
    for cursor in ("_-_-", "AAAA", "xI8Asl2tvZVDiA6ID13j"):
        answer = api.get(f"/api/v1/partners?cursor={cursor}")
        assert answer.status_code == 200, (cursor, answer.get_json())
    for cursor in ("", "a", "abcde", "a=", "%%%"):
        error_of(api.get(f"/api/v1/partners?cursor={cursor}"), 400, "invalid")
    assert api.get("/api/v1/routes?cursor=999999999").status_code == 200
    for cursor in ("", "1234567890", "-1", "1.0", "MTIz"):
        error_of(api.get(f"/api/v1/routes?cursor={cursor}"), 400, "invalid")


def test_message_filters(api, configured):
    configured.route("inbox", "acme", "*", "writer_a")
    routed = configured.message(from_party="acme", now=T0)
    unrouted = configured.message(from_party="globex", now=T0 + timedelta(hours=2))

    def ids(query: str) -> list[int]:
        response = api.get(f"/api/v1/messages?{query}")
        assert response.status_code == 200, response.get_json()
        return [m["id"] for m in response.get_json()["items"]]

    assert ids("status=not_routed") == [unrouted.id]
    assert ids("status=received,not_routed") == [unrouted.id, routed.id]
    assert ids("from=acme") == [routed.id]
    assert ids("to=mycompany&source=inbox") == [unrouted.id, routed.id]
    assert ids("source=elsewhere") == []
    assert ids("target=writer_a") == [routed.id]
    assert ids("since=2024-05-01T13:00:00Z") == [unrouted.id]
    assert ids("until=2024-05-01T13:00:00") == [routed.id]
    assert ids("since=2024-05-01T14:00:00%2B02:00") == [unrouted.id, routed.id]  # 12:00 UTC
    assert ids("since=2024-05-01T15:00:00+02:00") == [unrouted.id]  # "+" read as a space
    assert ids("until=2024-05-01 13:00:00") == [routed.id]
    error_of(api.get("/api/v1/messages?status=lost"), 400, "invalid")
    error_of(api.get("/api/v1/messages?since=yesterday"), 400, "invalid")


def test_a_text_filter_holding_a_nul_is_refused_not_a_server_error(api, configured):
    """PostgreSQL's text takes no NUL: such a filter is the request's fault (400, naming
    the field), on either database, for messages, deliveries, alerts and bulk actions."""
    configured.message(from_party="acme", now=T0)
    for path, field in (("/api/v1/messages?transaction_control=1%002", "transaction_control"),
                        ("/api/v1/messages?from=ac%00me", "from"),
                        ("/api/v1/messages?q=%00", "q"),
                        ("/api/v1/deliveries?target=a%00", "target"),
                        ("/api/v1/alerts?kind=%00", "kind")):
        error = error_of(api.get(path), 400, "invalid")
        assert "NUL" in error["details"][field], (path, error)


def test_message_detail_with_deliveries_history_and_payloads(api, configured, registry):
    configured.route("inbox", "*", "*", "writer_a")
    configured.route("inbox", "acme", "*", "writer_b")
    message = configured.message(body=b"UNB+UNOA:2'", filename="invoice.edi")
    TargetRunner(new_session, registry, configured.store, "test-owner").drain("writer_a", 10)

    response = api.get(f"/api/v1/messages/{message.id}")
    assert response.status_code == 200
    detail = response.get_json()
    assert (detail["status"], detail["original_filename"]) == ("in_progress", "invoice.edi")
    states = {d["target"]: d["state"] for d in detail["deliveries"]}
    assert states == {"writer_a": "delivered", "writer_b": "queued"}
    delivered = next(d for d in detail["deliveries"] if d["target"] == "writer_a")
    assert delivered["attempt"] == 1 and delivered["settled_at"] is not None
    assert detail["payloads"] == [{"stage": "unpacked", "size": 11,
                                   "digest": message.sha256,
                                   "created_at": detail["payloads"][0]["created_at"]}]
    types = [line["type"] for line in detail["history"]]
    assert types[0] == "received"
    assert "invoice.edi received from acme" in detail["history"][0]["text"]
    assert [line["id"] for line in detail["history"]] == sorted(
        line["id"] for line in detail["history"])
    assert any(line["delivery_id"] == delivered["id"] for line in detail["history"])
    error_of(api.get("/api/v1/messages/999999"), 404, "not_found")


def test_deliveries_list_filters_and_pages(api, configured, registry):
    configured.route("inbox", "*", "*", "writer_a")
    configured.route("inbox", "*", "*", "writer_b")
    messages = [configured.message(now=T0 + timedelta(minutes=i)) for i in range(3)]
    TargetRunner(new_session, registry, configured.store, "test-owner").drain("writer_a", 10)

    every = collect_pages(api, "/api/v1/deliveries", 2)
    assert len(every) == 6 and len({d["id"] for d in every}) == 6
    assert [d["id"] for d in every] == sorted((d["id"] for d in every), reverse=True)

    def pairs(query: str) -> set[tuple[int, str, str]]:
        items = api.get(f"/api/v1/deliveries?{query}").get_json()["items"]
        return {(d["message_id"], d["target"], d["state"]) for d in items}

    assert pairs("target=writer_a") == {(m.id, "writer_a", "delivered") for m in messages}
    assert pairs("state=queued") == {(m.id, "writer_b", "queued") for m in messages}
    assert pairs(f"message={messages[1].id}") == {(messages[1].id, "writer_a", "delivered"),
                                                   (messages[1].id, "writer_b", "queued")}
    error_of(api.get("/api/v1/deliveries?state=lost"), 400)
    error_of(api.get("/api/v1/deliveries?message=first"), 400)
