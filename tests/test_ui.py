"""The web UI through Flask's test client: login, roles, CSRF, forms that keep what was
typed and show each error beside its field, and the actions' history lines."""

from __future__ import annotations

import io
import re

import pytest
from flask import g
from sqlalchemy import select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, settlement
from b2bhub.engine.settings import load_settings
from b2bhub.models import Alert, Delivery, HistoryLine, Message, PluginInstance, Route, utcnow
from b2bhub.services.users import create_user

PASSWORD = "correct horse battery"
PAGES = ["/ui/", "/ui/messages", "/ui/delivery-errors", "/ui/routes", "/ui/plugins",
         "/ui/parties", "/ui/system/services", "/ui/system/settings", "/ui/logs",
         "/ui/alerts"]


@pytest.fixture(autouse=True)
def fresh_user_per_request(app):
    """The test app's context outlives a request, and ``g`` with it; a server starts each
    request with a fresh ``g``, so the user (and the flashed messages) are read again from
    the session cookie."""
    @app.before_request
    def forget_user() -> None:
        g.pop("_login_user", None)
        g.pop("_flashes", None)


@pytest.fixture
def login(app, session):
    """``login(role)``: a test client logged in as a new user with that role."""
    def log_in(role: str, name: str | None = None):
        name = name or f"{role}1"
        create_user(session, name, PASSWORD, role)
        session.commit()
        client = app.test_client()
        response = client.post("/ui/login", data={"name": name, "password": PASSWORD})
        assert response.status_code == 302, response.text
        return client
    return log_in


@pytest.fixture
def setup(hub, record_dir):
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    hub.instance("inbox", "manual_source")
    hub.instance("writer_a", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "writer_a")
    return hub


def failed_delivery(hub, session) -> Delivery:
    message = hub.message()
    now = utcnow()
    [claim] = claiming.claim(session, "writer_a", "w1", now, 1, 300)
    settlement.settle(session, claim, Outcome.failed("disk full"), RetryPolicy(), now)
    session.commit()
    return session.get(Delivery, message.deliveries[0].id)


def csrf_token(html: str) -> str:
    return re.search(r'name="csrf_token"[^>]*value="([^"]+)"', html).group(1)


# --- login --------------------------------------------------------------------------------

def test_pages_need_a_login_and_come_back_after_it(app, client, session):
    response = client.get("/ui/messages?status=error")
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/ui/login?next=")
    create_user(session, "alice", PASSWORD, "viewer")
    session.commit()
    done = client.post("/ui/login", data={"name": "alice", "password": PASSWORD,
                                          "next": "/ui/messages?status=error"})
    assert done.headers["Location"] == "/ui/messages?status=error"
    assert client.get("/ui/messages").status_code == 200


def test_a_wrong_password_is_refused_and_keeps_the_name(client, session):
    create_user(session, "alice", PASSWORD, "admin")
    session.commit()
    response = client.post("/ui/login", data={"name": "alice", "password": "nope"})
    assert response.status_code == 400
    assert "wrong user name or password" in response.text
    assert 'value="alice"' in response.text
    assert client.get("/ui/").status_code == 302


def test_login_never_sends_the_user_to_another_site(client, session):
    create_user(session, "alice", PASSWORD, "viewer")
    session.commit()
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
        response = client.post("/ui/login", data={"name": "alice", "password": PASSWORD,
                                                  "next": target})
        assert response.headers["Location"] == "/ui/", target


def test_a_disabled_user_is_logged_out_at_the_next_request(login, session):
    from b2bhub.models import User
    client = login("admin", "bob")
    session.scalar(select(User).where(User.name == "bob")).disabled_at = utcnow()
    session.commit()
    assert client.get("/ui/").status_code == 302


def test_logout(login):
    client = login("viewer")
    assert client.post("/ui/logout").headers["Location"] == "/ui/login"
    assert client.get("/ui/").status_code == 302


# --- roles ----------------------------------------------------------------------------------

def test_a_viewer_sees_every_page_but_no_action(setup, login, session):
    failed_delivery(setup, session)
    client = login("viewer")
    for page in PAGES:
        response = client.get(page)
        assert response.status_code == 200, page
        assert "Log out" in response.text
    message_id = session.scalar(select(Message.id))
    page = client.get(f"/ui/messages/{message_id}").text
    for offered in ("Redeliver", "Redispatch", "Cancel message", "New route", "Send a"):
        assert offered not in page
    assert "Redeliver" not in client.get("/ui/delivery-errors").text
    assert "New route" not in client.get("/ui/routes").text
    assert "Create partner" not in client.get("/ui/parties").text


def test_a_viewer_forcing_an_action_gets_403_and_nothing_changes(setup, login, session):
    delivery = failed_delivery(setup, session)
    client = login("viewer")
    forced = [f"/ui/deliveries/{delivery.id}/redeliver",
              f"/ui/messages/{delivery.message_id}/redispatch",
              "/ui/delivery-errors/redeliver", "/ui/routes/new", "/ui/parties/partner",
              "/ui/plugins/writer_a/disable", "/ui/system/settings", "/ui/messages/send"]
    for url in forced:
        assert client.post(url, data={"all_matching": "y", "name": "x"}).status_code == 403, url
    assert client.get("/ui/messages/send").status_code == 403
    session.expire_all()
    assert session.get(Delivery, delivery.id).state == "failed"
    assert session.get(PluginInstance, 2).enabled
    assert session.scalar(select(HistoryLine).where(HistoryLine.actor == "viewer1")) is None


def test_an_operator_acts_on_messages_but_does_not_configure(setup, login, session):
    delivery = failed_delivery(setup, session)
    client = login("operator", "olga")
    page = client.get(f"/ui/messages/{delivery.message_id}").text
    assert "Redeliver" in page and "New route" not in page
    response = client.post(f"/ui/deliveries/{delivery.id}/redeliver")
    assert response.headers["Location"] == f"/ui/messages/{delivery.message_id}"
    session.expire_all()
    assert session.get(Delivery, delivery.id).state == "queued"
    line = session.scalar(select(HistoryLine).where(
        HistoryLine.type == "redeliver_requested"))
    assert (line.actor, line.text) == ("olga", "olga asked to redeliver the delivery to "
                                               "writer_a")
    shown = client.get(f"/ui/messages/{delivery.message_id}").text
    assert "Redeliver: queued" in shown and "olga" in shown
    assert client.post("/ui/routes/new", data={}).status_code == 403


def test_a_blocked_sequence_offers_resubmit_and_skip(hub, login, session, record_dir):
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("ordered_out", "recorder", ordered=True,
                 config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "ordered_out")
    first, second = (hub.message(filename=f"{i}.edi") for i in range(2))
    now = utcnow()
    [claim] = claiming.claim(session, "ordered_out", "w1", now, 1, 300)
    settlement.settle(session, claim, Outcome.failed("down"), RetryPolicy(), now)
    session.commit()
    client = login("operator", "olga")
    page = client.get(f"/ui/messages/{first.id}").text
    assert "Resubmit" in page and "Skip" in page and ">Redeliver<" not in page
    assert "Resubmit" not in client.get(f"/ui/messages/{second.id}").text  # deferred

    client.post(f"/ui/deliveries/{claim.delivery_id}/skip")
    session.expire_all()
    assert [d.state for d in (session.get(Message, m.id).deliveries[0]
                              for m in (first, second))] == ["skipped", "queued"]
    line = session.scalar(select(HistoryLine).where(HistoryLine.type == "skip_requested"))
    assert line.actor == "olga"


def test_an_action_the_state_does_not_allow_is_refused_with_its_reason(setup, login,
                                                                         session):
    message = setup.message()
    client = login("operator")
    response = client.post(f"/ui/deliveries/{message.deliveries[0].id}/send-again",
                           follow_redirects=True)
    assert "is Queued: send again takes a delivery that is Delivered" in response.text


# --- CSRF -----------------------------------------------------------------------------------

def test_every_form_needs_its_csrf_token(app, setup, login, session):
    delivery = failed_delivery(setup, session)
    client = login("admin")
    app.config["WTF_CSRF_ENABLED"] = True
    try:
        refused = client.post(f"/ui/deliveries/{delivery.id}/redeliver")
        assert refused.status_code == 400
        assert "CSRF" in refused.text
        assert client.post("/ui/parties/partner", data={"partner-name": "initech"}
                           ).status_code == 400
        session.expire_all()
        assert session.get(Delivery, delivery.id).state == "failed"

        token = csrf_token(client.get(f"/ui/messages/{delivery.message_id}").text)
        done = client.post(f"/ui/deliveries/{delivery.id}/redeliver",
                           data={"csrf_token": token})
        assert done.status_code == 302
        session.expire_all()
        assert session.get(Delivery, delivery.id).state == "queued"

        login_page = app.test_client().get("/ui/login").text
        assert 'name="csrf_token"' in login_page
        assert app.test_client().post("/ui/login", data={
            "name": "admin", "password": PASSWORD}).status_code == 400
    finally:
        app.config["WTF_CSRF_ENABLED"] = False


# --- forms: errors beside the field, nothing lost -------------------------------------------

def test_route_form_refusals_keep_the_choices_and_say_why(setup, login, session):
    client = login("admin")
    setup.instance("off", "recorder", enabled=False, config={"record_dir": "/tmp"})
    redundant = client.post("/ui/routes/new", data={
        "source": "inbox", "from_party": "acme", "to_party": "*", "target": "writer_a"})
    assert redundant.status_code == 400
    assert "redundant with route 1: inbox, * -&gt; *, writer_a" in redundant.text
    assert '<option selected value="acme">' in redundant.text

    disabled = client.post("/ui/routes/new", data={
        "source": "inbox", "from_party": "acme", "to_party": "*", "target": "off"})
    assert disabled.status_code == 400
    target_field = re.search(r'<div class="field  has-error">\s*<label for="target">.*?</div>',
                             disabled.text, re.S).group(0)
    assert "target: instance &#39;off&#39; is disabled" in target_field
    assert session.scalar(select(Route.id).where(Route.target == "off")) is None


def test_routes_are_created_edited_deleted_and_tested(setup, login, session):
    client = login("admin", "ada")
    created = client.post("/ui/routes/new", data={
        "source": "inbox", "from_party": "mycompany", "to_party": "globex",
        "target": "writer_a"})
    assert created.status_code == 400  # covered by route 1 (* -> *)
    client.post("/ui/routes/1/delete", data={"confirm": "yes"})
    assert client.post("/ui/routes/new", data={
        "source": "inbox", "from_party": "mycompany", "to_party": "globex",
        "target": "writer_a"}).status_code == 302
    route = session.scalar(select(Route))
    assert (route.from_party, route.to_party, route.created_by) == ("mycompany", "globex",
                                                                    "ada")
    assert client.post(f"/ui/routes/{route.id}/edit", data={
        "source": "inbox", "from_party": "mycompany", "to_party": "acme",
        "target": "writer_a"}).status_code == 302
    session.expire_all()
    [edited] = session.scalars(select(Route)).all()
    assert edited.to_party == "acme"
    tested = client.get("/ui/routes?test_source=inbox&test_from=mycompany&test_to=acme")
    assert "Targets reached:</strong> writer_a" in tested.text
    missed = client.get("/ui/routes?test_source=inbox&test_from=mycompany&test_to=globex")
    assert "none (the message would be Not routed)" in missed.text
    lines = session.scalars(select(HistoryLine.text).where(
        HistoryLine.type == "config_changed", HistoryLine.actor == "ada")).all()
    assert any("deleted route 1" in t for t in lines)
    assert any(f"replaced route {route.id} by route" in t for t in lines)


def test_plugin_form_is_drawn_from_the_schema_and_keeps_bad_input(setup, login, session,
                                                                   registry):
    from b2bhub.plugin.schema import Field

    class Dialer:
        """Calls a number."""
        type_name, roles = "dialer", frozenset({"target"})
        config_schema = [Field("number", "string", required=True),
                         Field("tries", "integer", default=3, min=1),
                         Field("loud", "boolean", default=True),
                         Field("extra", "json", default={}),
                         Field("pin", "secret")]
    registry.register(Dialer)
    client = login("admin")
    form = client.get("/ui/plugins/new/dialer").text
    for name in ("config-number", "config-tries", "config-loud", "config-extra",
                 "config-pin", "max_concurrent_deliveries", "retry_policy"):
        assert f'name="{name}"' in form, name
    bad = client.post("/ui/plugins/new/dialer", data={
        "name": "phone", "enabled": "y", "config-tries": "zero", "config-extra": "{oops",
        "max_concurrent_deliveries": "4", "retry_policy": ""})
    assert bad.status_code == 400
    assert 'value="zero"' in bad.text and "{oops" in bad.text
    assert re.search(r'config-number.*?<span class="error">required</span>', bad.text, re.S)
    assert re.search(r'config-tries.*?<span class="error">must be an integer</span>',
                     bad.text, re.S)
    assert "invalid JSON" in bad.text
    assert session.scalar(select(PluginInstance).where(PluginInstance.name == "phone")) is None

    good = client.post("/ui/plugins/new/dialer", data={
        "name": "phone", "enabled": "y", "config-number": "555", "config-tries": "2",
        "config-extra": '{"a": 1}', "config-pin": "1234", "max_concurrent_deliveries": "2",
        "retry_policy": '{"strategy": "fixed", "base_delay": 5, "max_attempts": 2}'})
    assert good.status_code == 302, good.text
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "phone"))
    # every target also takes the core's OpenPGP settings (docs/openpgp.md), off
    assert row.config == {"number": "555", "tries": 2, "loud": False, "extra": {"a": 1},
                          "pin": "1234", "openpgp_encrypt": False, "openpgp_sign": False}
    assert row.max_concurrent_deliveries == 2
    edit = client.get("/ui/plugins/phone/edit").text
    assert "1234" not in edit and 'value="********"' in edit
    client.post("/ui/plugins/phone/edit", data={
        "name": "phone", "config-number": "556", "config-pin": "********",
        "max_concurrent_deliveries": "2", "retry_policy": ""})
    session.expire_all()
    assert row.config["pin"] == "1234" and row.config["number"] == "556"
    assert not row.enabled  # the box was left unticked


def test_enable_and_disable_keep_the_configuration(setup, login, session, record_dir):
    client = login("admin")
    client.post("/ui/plugins/writer_a/disable")
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "writer_a"))
    session.refresh(row)
    assert not row.enabled and row.config["record_dir"] == str(record_dir)
    client.post("/ui/plugins/writer_a/enable")
    session.refresh(row)
    assert row.enabled
    refused = client.post("/ui/plugins/writer_a/delete", data={"confirm": "yes"},
                          follow_redirects=True)
    assert "instance &#39;writer_a&#39; is used by route 1" in refused.text


def test_party_errors_stay_beside_the_field(setup, login, session):
    client = login("admin")
    bad = client.post("/ui/parties/partner", data={"partner-name": "Bad Name!",
                                                   "partner-display_name": "Bad Inc"})
    assert bad.status_code == 400
    assert 'value="Bad Name!"' in bad.text and 'value="Bad Inc"' in bad.text
    assert re.search(r'id="partner-name".*?<span class="error">.*?must be 1-64',
                     bad.text, re.S)
    taken = client.post("/ui/parties/partner", data={"partner-name": "acme"})
    assert "a party named &#39;acme&#39; exists already" in taken.text
    assert client.post("/ui/parties/organization", data={
        "organization-name": "initech"}).status_code == 302
    assert "initech" in client.get("/ui/parties").text


def test_send_message_by_hand(setup, login, session):
    client = login("operator", "olga")
    bad = client.post("/ui/messages/send", data={
        "file": (io.BytesIO(b"x"), "po.edi"), "from_party": "acme", "to_party": "globex",
        "target": ""}, content_type="multipart/form-data")
    assert bad.status_code == 400
    assert "one of from and to must be an organization" in bad.text
    assert '<option selected value="globex">' in bad.text
    sent = client.post("/ui/messages/send", data={
        "file": (io.BytesIO(b"UNB+"), "po.edi"), "from_party": "mycompany",
        "to_party": "acme", "target": "writer_a"}, content_type="multipart/form-data")
    assert sent.status_code == 302
    message = session.scalar(select(Message))
    assert (message.source, message.original_filename) == ("@operator", "po.edi")
    page = client.get(sent.headers["Location"]).text
    assert "Download" in page and "olga" in page
    download = client.get(f"/api/v1/messages/{message.id}/payload?stage=unpacked")
    assert download.status_code == 200 and download.data == b"UNB+"


def test_the_api_reads_with_a_ui_session_but_never_writes(setup, login):
    client = login("viewer")
    assert client.get("/api/v1/messages").status_code == 200
    assert client.post("/api/v1/organizations", json={"name": "x"}).status_code == 401
    assert client.get("/api/v1/messages", headers={
        "Authorization": "Bearer nope"}).status_code == 401


# --- lists ----------------------------------------------------------------------------------

def test_messages_filter_search_and_live_rows(setup, login, session):
    first = setup.message(filename="orders-17.edi")
    second = setup.message(from_party="globex", filename="invoice.edi")
    client = login("viewer")
    listed = client.get("/ui/messages?q=orders").text
    assert "orders-17.edi" in listed and "invoice.edi" not in listed
    assert "invoice.edi" in client.get("/ui/messages?from=globex").text
    assert "orders-17.edi" not in client.get("/ui/messages?from=globex").text
    bad = client.get("/ui/messages?since=yesterday")
    assert "a time like 2024-05-01T12:00 (UTC)" in bad.text
    found = client.get("/api/v1/messages?q=ORDERS-17").json["items"]
    assert [m["id"] for m in found] == [first.id]
    rows = client.get(f"/ui/messages/rows?ids={first.id},{second.id}&from=globex").text
    assert f'data-id="{first.id}" data-match="0"' in rows
    assert f'data-id="{second.id}" data-match="1"' in rows


def test_messages_filter_on_the_correlation_id_and_the_page_shows_it(setup, login):
    wanted = setup.message(filename="a.edi", correlation_id="PO-77")
    setup.message(filename="b.edi", correlation_id="PO-78")
    client = login("viewer")
    listed = client.get("/ui/messages?correlation_id=PO-77").text
    assert f'data-id="{wanted.id}"' in listed and "b.edi" not in listed
    assert 'name="correlation_id" value="PO-77"' in listed
    page = client.get(f"/ui/messages/{wanted.id}").text
    assert "<dt>Correlation id</dt><dd>PO-77</dd>" in page
    assert "Trace id" not in page  # stored while traces were off: no trace to name


def test_a_live_page_resumes_after_what_it_rendered(setup, login, session, registry, app):
    """A message delivered between the page's render and its stream's start still
    reaches the page: the page carries the last history id before it read what it
    shows, and the stream from there has the delivery's lines."""
    from b2bhub.engine.runner import TargetRunner
    from b2bhub.runtime.hub import new_session
    from tests.test_events import read_events
    app.config.update(STREAM_POLL_SECONDS=0.01, STREAM_KEEPALIVE_SECONDS=0.05)
    sent = setup.message(filename="late.edi")
    client = login("viewer")
    page = client.get(f"/ui/messages/{sent.id}").text
    after = int(re.search(r'<body data-live-after="(\d+)"', page).group(1))
    assert "Queued" in page
    shown = session.scalar(select(HistoryLine.id).where(HistoryLine.message_id == sent.id)
                           .order_by(HistoryLine.id.desc()).limit(1))
    assert after >= shown  # everything the page shows is at or below its resume point
    # the worker delivers before the page's script opens its stream
    TargetRunner(new_session, registry, setup.store, "test-owner").drain("writer_a", 10)
    delivered = session.scalars(select(HistoryLine.id).where(
        HistoryLine.message_id == sent.id, HistoryLine.id > after)).all()
    assert delivered
    events = read_events(client.get(f"/api/v1/events?after={after}&message={sent.id}"),
                         len(delivered))
    assert [int(event_id) for event_id, _type, _data in events] == delivered
    assert "data-live-after" in client.get("/ui/").text
    assert "data-live-after" not in client.get("/ui/routes").text


def test_delivery_errors_bulk_redeliver_all_matching(setup, login, session, record_dir):
    setup.instance("writer_b", "recorder", config={"record_dir": str(record_dir)})
    setup.route("inbox", "*", "*", "writer_b")
    ids = []
    for _ in range(3):
        message = setup.message()
        ids += [d.id for d in message.deliveries]
    now = utcnow()
    for target in ("writer_a", "writer_b"):
        for claim in claiming.claim(session, target, "w1", now, 10, 300):
            settlement.settle(session, claim, Outcome.failed("no disk"), RetryPolicy(), now)
    session.commit()
    client = login("operator", "olga")
    page = client.get("/ui/delivery-errors?target=writer_b").text
    assert "3 matching" in page
    done = client.post("/ui/delivery-errors/redeliver", data={
        "all_matching": "y", "target": "writer_b", "confirm": "yes"}, follow_redirects=True)
    assert "3 deliveries queued again" in done.text
    states = dict(session.execute(select(Delivery.target, Delivery.state)
                                  .where(Delivery.state == "queued")).all())
    assert states == {"writer_b": "queued"}
    assert session.scalar(select(Delivery.id).where(
        Delivery.target == "writer_a", Delivery.state != "failed")) is None
    some = [i for i in ids if session.get(Delivery, i).target == "writer_a"][:1]
    client.post("/ui/delivery-errors/redeliver", data={"delivery": some, "confirm": "yes"})
    session.expire_all()
    assert session.get(Delivery, some[0]).state == "queued"
    actors = set(session.scalars(select(HistoryLine.actor).where(
        HistoryLine.type == "redeliver_requested")))
    assert actors == {"olga"}


def test_settings_form(setup, login, session):
    client = login("admin", "ada")
    bad = client.post("/ui/system/settings", data={
        "stall_after": "0", "wake_delays": "10, x", "lease_seconds": "300",
        "scan_lease_seconds": "30", "claim_batch_max": "16", "probe_interval": "60",
        "cleanup_time": "25:00", "retention_days": "30"})
    assert bad.status_code == 400
    assert 'value="10, x"' in bad.text
    for text in ("a whole number of at least 1", "whole numbers of seconds",
                 "a time of day as HH:MM"):
        assert text in bad.text
    assert load_settings(session).stall_after == 5
    good = client.post("/ui/system/settings", data={
        "stall_after": "6", "wake_delays": "5, 20", "lease_seconds": "300",
        "scan_lease_seconds": "30", "claim_batch_max": "16", "probe_interval": "60",
        "cleanup_time": "04:00", "retention_days": "30"})
    assert good.status_code == 302
    settings = load_settings(session)
    assert (settings.stall_after, settings.wake_delays, settings.cleanup_time) == (
        6, (5, 20), "04:00")
    line = session.scalar(select(HistoryLine).where(HistoryLine.type == "config_changed"))
    assert line.text == "ada: changed delivery settings: cleanup_time, stall_after, " \
                        "wake_delays"


def test_alerts_are_acknowledged_in_the_users_name(setup, login, session):
    message = setup.message()
    session.add(Alert(kind="message_failed", subject=f"message:{message.id}",
                      text="it failed", message_id=message.id))
    session.commit()
    assert ">Acknowledge</button>" not in login("viewer").get("/ui/alerts").text
    client = login("operator", "olga")
    client.post("/ui/alerts/1/acknowledge")
    page = client.get("/ui/alerts").text
    assert "by olga" in page
    line = session.scalar(select(HistoryLine).where(HistoryLine.type == "alert_acknowledged"))
    assert (line.message_id, line.actor) == (message.id, "olga")


# --- dashboard, services, logs ---------------------------------------------------------------

def test_dashboard_counts_and_draws_the_per_minute_charts(setup, login, session):
    from datetime import timedelta

    from b2bhub.models import StatsMinute
    setup.message()
    minute = utcnow().replace(second=0, microsecond=0)
    for n, (came, failed) in enumerate(((3, 0), (7, 2))):
        session.add(StatsMinute(minute=minute - timedelta(minutes=2 - n), messages_in=came,
                                attempts=came, delivered=came - failed, failures=failed,
                                due=0))
    session.commit()
    page = login("viewer").get("/ui/").text
    assert re.search(r'data-status="received".*?<div class="n">1</div>', page, re.S)
    assert page.count("<svg") == 3 and page.count("<polyline") == 4
    assert ">7<" in page  # the top of the axis is the largest figure
    assert "no figures yet" not in page
    day = login("viewer", "v2").get("/ui/?span=day").text
    assert "Last day" in day


def test_services_start_and_stop_an_instance_in_the_users_name(setup, login, session):
    client = login("admin", "ada")
    page = client.get("/ui/system/services").text
    assert 'data-instance="writer_a"' in page and ">Stop</button>" in page
    client.post("/ui/system/instances/writer_a/stop")
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "writer_a"))
    session.refresh(row)
    assert (row.state, row.state_reason) == ("stopped", "stopped by ada")
    line = session.scalar(select(HistoryLine).where(HistoryLine.type == "instance_stopped"))
    assert (line.actor, line.text) == ("ada", "ada stopped writer_a")
    assert ">Start</button>" in client.get("/ui/system/services").text
    assert login("operator").post("/ui/system/instances/writer_a/start").status_code == 403
    client.post("/ui/system/instances/writer_a/start")
    session.refresh(row)
    assert row.state == "enabled"


def test_logs_page_filters_by_level(login, session):
    from b2bhub.models import LogRecord
    for level, text in ((20, "scan of poller took 3 files"), (40, "cannot write out/x")):
        session.add(LogRecord(level=level, logger="b2bhub.test", message=text,
                              process_id="h:1:x", kind="worker", host="h", pid=1))
    session.commit()
    client = login("viewer")
    page = client.get("/ui/logs").text
    assert "scan of poller" in page and "cannot write" in page
    errors_only = client.get("/ui/logs?level=error").text
    assert "scan of poller" not in errors_only and "cannot write" in errors_only
    assert 'data-live-logs="/api/v1/logs/stream?level=error"' in errors_only
    assert client.get("/ui/logs?level=loud").status_code == 400
