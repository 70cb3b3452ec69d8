"""The storage report (SPEC 13) through the API and the UI, on 100k messages; and the
site's own 404 page for an unknown /ui/ address."""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta

import pytest
from flask import g
from sqlalchemy import func, insert, select

from b2bhub.engine.cleanup import run_cleanup
from b2bhub.engine.settings import DeliverySettings, save_settings
from b2bhub.models import Delivery, Message, utcnow
from b2bhub.runtime import hub as hub_module
from b2bhub.services import config as svc
from b2bhub.services import storage
from b2bhub.services.storage import storage_report
from b2bhub.services.users import create_user

PASSWORD = "correct horse battery"
N = 100_000


@pytest.fixture
def viewer(app, session):
    @app.before_request
    def forget_user() -> None:
        g.pop("_login_user", None)

    create_user(session, "ada", PASSWORD, "viewer")
    session.commit()
    client = app.test_client()
    assert client.post("/ui/login", data={"name": "ada", "password": PASSWORD}
                       ).status_code == 302
    return client


@pytest.fixture
def setup(hub, session):
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    hub.instance("inbox", "manual_source", retention_days=7)
    hub.instance("ftp_in", "manual_source", retention_days=-1)
    hub.instance("writer_a", "noop")
    hub.instance("writer_b", "noop")
    save_settings(session, DeliverySettings(retention_days=45))
    session.commit()


def _bulk(session, count: int) -> tuple[Counter, Counter, dict]:
    """``count`` messages inserted in bulk, with their expected figures kept aside:
    per (party, source) and per (party, source, target) counts and bytes, and each
    source's oldest message."""
    rng = random.Random(13)
    start = utcnow() - timedelta(days=3)
    by_source: Counter = Counter()
    by_target: Counter = Counter()
    oldest: dict = {}
    messages, deliveries = [], []
    for i in range(1, count + 1):
        direction = rng.choice(("inbound", "outbound"))
        partner = rng.choice(("acme", "globex"))
        source = rng.choice(("inbox", "ftp_in", "gone_source"))
        size = rng.randrange(0, 50_000)
        created = start + timedelta(seconds=i)
        sender, addressee = ((partner, "mycompany") if direction == "inbound"
                             else ("mycompany", partner))
        messages.append({"id": i, "source": source, "from_party": sender,
                         "to_party": addressee, "direction": direction, "size": size,
                         "status": "delivered", "created_at": created,
                         "updated_at": created})
        by_source[partner, source, "n"] += 1
        by_source[partner, source, "b"] += size
        oldest.setdefault((partner, source), created)
        for target in rng.sample(("writer_a", "writer_b"), rng.randrange(0, 3)):
            deliveries.append({"message_id": i, "target": target, "state": "delivered",
                               "created_at": created, "updated_at": created})
            by_target[partner, source, target, "n"] += 1
            by_target[partner, source, target, "b"] += size
    for chunk in range(0, len(messages), 10_000):
        session.execute(insert(Message), messages[chunk:chunk + 10_000])
    for chunk in range(0, len(deliveries), 10_000):
        session.execute(insert(Delivery), deliveries[chunk:chunk + 10_000])
    session.commit()
    return by_source, by_target, oldest


def test_report_equals_the_counts_on_100k_messages(setup, session, api):
    by_source, by_target, oldest = _bulk(session, N)
    report = api.get("/api/v1/storage").get_json()  # nothing kept yet: computed now
    assert report == {**api.get("/api/v1/storage?fresh=true").get_json(),
                      "computed_at": report["computed_at"]}
    assert report["messages"] == N == session.scalar(select(func.count(Message.id)))
    assert report["bytes"] == session.scalar(select(func.sum(Message.size)))
    seen_sources = seen_targets = 0
    for party in report["parties"]:
        assert party["messages"] == sum(s["messages"] for s in party["sources"])
        for source in party["sources"]:
            key = (party["party"], source["source"])
            assert (source["messages"], source["bytes"]) == (
                by_source[(*key, "n")], by_source[(*key, "b")])
            seen_sources += 1
            assert source["oldest_message_at"] == oldest[key].isoformat() + "Z"
            for target in source["targets"]:
                tkey = (*key, target["target"])
                assert (target["messages"], target["bytes"]) == (
                    by_target[(*tkey, "n")], by_target[(*tkey, "b")])
                seen_targets += 1
    assert seen_sources == len(by_source) // 2 and seen_targets == len(by_target) // 2
    retention = {s["source"]: (s["retention_days"], s["retention"])
                 for p in report["parties"] for s in p["sources"]}
    assert retention == {"inbox": (7, "7 days"), "ftp_in": (None, "forever"),
                         "gone_source": (45, "45 days (default)")}
    # the oldest kept of one source, by a direct query
    first = session.scalar(select(func.min(Message.created_at)).where(
        Message.source == "inbox", Message.direction == "inbound",
        Message.from_party == "acme"))
    first_out = session.scalar(select(func.min(Message.created_at)).where(
        Message.source == "inbox", Message.direction == "outbound",
        Message.to_party == "acme"))
    [acme] = [p for p in report["parties"] if p["party"] == "acme"]
    [inbox] = [s for s in acme["sources"] if s["source"] == "inbox"]
    assert inbox["oldest_message_at"] == min(first, first_out).isoformat() + "Z"


def test_page_shows_the_tree_and_the_store_against_the_rows(setup, hub, session, viewer,
                                                            app):
    store = hub_module.store()
    hub.route("inbox", "*", "*", "writer_a")
    hub.message(body=b"kept")
    leaked = store.put(b"written by a process that died before its commit")
    run_cleanup(session, store, utcnow(), "tests")  # young: not removed, but counted
    page = viewer.get("/ui/storage")
    assert page.status_code == 200
    text = page.text
    assert 'href="/ui/storage" class="active"' in text
    assert 'data-source="inbox" data-target="writer_a"' in text
    assert "7 days" in text

    figures = storage_report(session, utcnow())["store"]
    assert figures["files"] == 2 and figures["referenced_files"] == 1
    assert figures["unreferenced_bytes"] == leaked.size
    assert "Referenced by no row" in text and "1 file</td>" in text


def test_unknown_ui_address_gets_the_sites_404_page(viewer, api):
    page = viewer.get("/ui/no/such/page")
    assert page.status_code == 404
    assert "404 Not Found" in page.text
    assert 'href="/ui/messages"' in page.text and 'href="/ui/storage"' in page.text
    # the API keeps its JSON errors
    resp = api.get("/api/v1/no-such-thing")
    assert resp.status_code == 404 and resp.get_json()["error"]["code"] == "not_found"


def test_a_page_that_fails_gets_the_sites_500_page(viewer, app, monkeypatch):
    def fails():
        raise RuntimeError("the page's query went wrong")

    monkeypatch.setitem(app.view_functions, "ui.alerts", fails)
    monkeypatch.setitem(app.config, "PROPAGATE_EXCEPTIONS", False)  # as when deployed
    page = viewer.get("/ui/alerts")
    assert page.status_code == 500
    assert "500 Something went wrong" in page.text and "in the log" in page.text
    assert 'href="/ui/messages"' in page.text  # the site's navigation, not a bare 500
    assert "RuntimeError" not in page.text  # the traceback is for the log only


def test_the_instance_form_takes_keep_forever_and_refuses_less(setup, app, session):
    create_user(session, "root", PASSWORD, "admin")
    session.commit()
    admin = app.test_client()
    admin.post("/ui/login", data={"name": "root", "password": PASSWORD})
    form = admin.get("/ui/plugins/inbox/edit").text
    assert "-1: keep forever" in form and 'value="7"' in form
    saved = admin.post("/ui/plugins/inbox/edit", data={
        "name": "inbox", "enabled": "y", "retention_days": "-1"})
    assert saved.status_code == 302, saved.text
    refused = admin.post("/ui/plugins/inbox/edit", data={
        "name": "inbox", "enabled": "y", "retention_days": "-5"})
    assert refused.status_code == 400 and "keep forever" in refused.text
    session.expire_all()
    assert svc.get_instance(session, "inbox").retention_days == -1


def test_reads_serve_the_kept_report_until_it_is_due_again(setup, hub, session, api):
    hub.route("inbox", "*", "*", "writer_a")
    hub.message(body=b"one")
    now = utcnow()
    assert storage.refresh(session, now)
    session.commit()
    assert not storage.refresh(session, now + timedelta(seconds=60))  # not due yet
    hub.message(body=b"two")
    kept = api.get("/api/v1/storage").get_json()
    assert kept["messages"] == 1 and kept["computed_at"] == now.isoformat() + "Z"
    assert api.get("/api/v1/storage?fresh=true").get_json()["messages"] == 2
    assert storage.refresh(session, now + timedelta(seconds=storage.REFRESH_SECONDS))
    session.commit()
    assert api.get("/api/v1/storage").get_json()["messages"] == 2
    # a kept report far too old is not served
    later = storage.storage_report(session, now + timedelta(days=1))
    assert later["computed_at"] == (now + timedelta(days=1)).isoformat() + "Z"
