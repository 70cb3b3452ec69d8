"""The web UI in a real browser (Debian's chromium driven by Playwright) against a real
hub on loopback: gunicorn, a celery worker and beat (``tests/procs.py``).

An admin sets the hub up through the pages alone, watches a dropped file's row reach
Delivered on the open Messages list without a reload, sees a delivery fail and
redelivers it from Delivery errors; a viewer sees no action and is refused one forced.
Deletes ask first on a page of their own, and a form shows every error at once.
Screenshots of every page, at 1366 and at 1024 px wide, go to ``test-artifacts/`` for a
person to look at.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import b2bhub_testplugins as testplugins
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.engine import wakeups as wakeup_module
from b2bhub.models import Delivery, HistoryLine, Message
from b2bhub.runtime.hub import CeleryPublisher
from b2bhub.services.users import create_user
from tests.answering_peer import PeerAnswer, running_peer
from tests.as2kit import make_pair
from tests.procs import ROOT, Processes, wait_until

pytestmark = pytest.mark.processes

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "test-artifacts"
PASSWORD = "browser test password"


@pytest.fixture
def hub_url(backend, app, tmp_path, session):
    """A hub on loopback (web, worker, beat) with an admin and a viewer."""
    for name, role in (("ada", "admin"), ("vic", "viewer")):
        create_user(session, name, PASSWORD, role)
    session.commit()
    app.extensions["celery"].control.purge()
    procs = Processes(backend, tmp_path, app.config["PAYLOAD_DIR"])
    try:
        web = procs.web()
        procs.worker(wait=False)
        procs.beat()
        yield web.url
    finally:
        procs.stop_all()


def page_for(browser, url: str, user: str):
    context = browser.new_context(viewport={"width": 1366, "height": 800}, base_url=url)
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.goto("/ui/")
    page.fill("#name", user)
    page.fill("#password", PASSWORD)
    page.click("button:has-text('Log in')")
    page.wait_for_url("**/ui/")
    return page


def shot(page, name: str) -> None:
    """The page as it is, at the context's width and at a laptop's 1024 px."""
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    size = page.viewport_size
    page.set_viewport_size({"width": 1024, "height": 768})
    page.screenshot(path=str(ARTIFACTS / f"{name}-1024.png"), full_page=True)
    page.set_viewport_size(size)


def fresh(stmt):
    with Session(db.engine) as s:
        return s.execute(stmt).all()


def wait_live(page) -> None:
    """Wait until the page's live updates are on. A selector, not a script: right after a
    click on a link the new document may be half parsed, and a script reading
    ``#live-state`` then finds nothing and fails at once (a CI failure, stop 47)."""
    page.wait_for_selector("#live-state.on", state="attached")


def row_status(page, message_id: int) -> str:
    return page.inner_text(f'#messages tr[data-id="{message_id}"] td.st')


def test_an_admin_sets_up_the_hub_and_mends_a_failed_delivery(browser, hub_url, tmp_path):
    inbox, out = tmp_path / "in", tmp_path / "out"
    page = page_for(browser, hub_url, "ada")
    shot(page, "01-dashboard-empty")

    page.click("nav >> text=Parties")
    page.fill("#organization-name", "mycompany")
    page.click("text=Create organization")
    page.fill("#partner-name", "acme")
    page.fill("#partner-display_name", "ACME Corp")
    page.click("text=Create partner")
    assert "ACME Corp" in page.inner_text("#partners")
    shot(page, "02-parties")

    page.click("#partners tr[data-party=acme] >> text=Add AS2 profile")
    certificate = tmp_path / "acme.pem"
    certificate.write_text(make_pair("acme.example", days=20)[0])
    page.fill("#as2_id", "ACME")
    page.set_input_files("#certificate_file", str(certificate))
    page.click("button:has-text('Save AS2 profile')")  # refused: a partner needs its URL
    assert page.locator(".field.has-error #url").count() == 1
    assert page.input_value("#as2_id") == "ACME"
    page.fill("#url", "https://acme.example/as2")
    page.set_input_files("#certificate_file", str(certificate))
    page.click("button:has-text('Save AS2 profile')")
    assert "expires within 30 days" in page.inner_text("#certificates tr.expiring")
    shot(page, "02b-as2-profile")
    page.click("nav >> text=Parties")

    page.click("nav >> text=Plugins")
    page.click("text=New file_poller…")
    page.fill("#name", "poller")
    page.fill("#config-base_directory", str(inbox))
    page.fill("#config-polling_interval", "1")
    page.fill("#config-path_pattern", "{to}/{filename}")
    page.click("button:has-text('Save')")
    page.click("text=New file_writer…")
    page.fill("#name", "writer")
    page.fill("#config-base_directory", "relative/dir")  # refused: must be absolute
    page.fill("#config-filename_pattern", "{to}/{original_filename}")
    page.fill("#retry_policy", '{"strategy": "fixed", "base_delay": 1, "max_attempts": 1}')
    bad_rules = '[{"name": "rejected", "body_regex": "ERR-(\\\\d+"}]'  # unclosed group
    page.fill("#business_rules", bad_rules)
    page.click("button:has-text('Save')")
    assert page.locator(".field.has-error #config-base_directory").count() == 1
    assert page.input_value("#config-filename_pattern") == "{to}/{original_filename}"
    assert page.input_value("#business_rules") == bad_rules  # and its reason beside it
    assert ("rule 1 (rejected): body_regex is not a valid regular expression"
            in page.inner_text(".field.has-error:has(#business_rules) .error"))
    shot(page, "03-plugin-form-error")
    page.fill("#config-base_directory", str(out))
    page.fill("#business_rules", '[{"name": "rejected", "status": "2xx", "json_path": '
                                 '"$.status", "json_value": "ERR"}]')
    page.click("button:has-text('Save')")
    assert "Created file_writer instance writer" in page.inner_text("main")
    shot(page, "04-plugins")

    page.click("nav >> text=Routes")
    page.click("text=New route…")
    page.select_option("#source", "poller")
    page.select_option("#target", "writer")
    page.click("button:has-text('Save')")
    page.select_option("select[name=test_source]", "poller")
    page.select_option("select[name=test_to]", "acme")
    page.click("button:has-text('Test')")
    assert "writer" in page.inner_text("#tested-targets")
    shot(page, "05-routes")

    page.click("nav >> text=Messages")
    wait_live(page)
    page.evaluate("window.notReloaded = true")
    drop(inbox, "order-1.edi", b"UNB+UNOA:2+ACME'")
    first = wait_for_message("order-1.edi")
    page.wait_for_selector(f'#messages tr[data-id="{first}"] .s-delivered', timeout=60_000)
    assert (out / "acme" / "order-1.edi").read_bytes() == b"UNB+UNOA:2+ACME'"

    shutil.rmtree(out / "acme")
    (out / "acme").write_text("a file where the writer wants a directory")
    drop(inbox, "order-2.edi", b"UNB+UNOA:2+ACME'2")
    second = wait_for_message("order-2.edi")
    page.wait_for_selector(f'#messages tr[data-id="{second}"] .s-error', timeout=60_000)
    assert page.evaluate("window.notReloaded") is True
    assert row_status(page, first) == "Delivered"
    shot(page, "06-messages-live")

    page.click(f'#messages tr[data-id="{second}"] a')
    assert "Redeliver" in page.inner_text("#deliveries")
    shot(page, "07-message-failed")

    page.click("nav >> text=Delivery errors")
    [delivery_id] = [d for (d,) in fresh(select(Delivery.id).where(
        Delivery.message_id == second))]
    page.check(f'input[name=delivery][value="{delivery_id}"]')
    shot(page, "08-delivery-errors")
    (out / "acme").unlink()
    page.click("#redeliver-selected")
    assert "Redeliver the 1 selected delivery?" in page.inner_text("#confirm")
    page.click("#confirm-yes")
    assert "1 delivery queued again" in page.inner_text("main")
    wait_until(lambda: (out / "acme" / "order-2.edi").exists(), 60, "redelivered")
    assert (out / "acme" / "order-2.edi").read_bytes() == b"UNB+UNOA:2+ACME'2"
    page.goto(f"/ui/messages/{second}")
    page.wait_for_selector("#message-live h1 .s-delivered", timeout=30_000)
    assert "ada asked to redeliver the delivery to writer" in page.inner_text("#history")
    actors = fresh(select(HistoryLine.actor).where(HistoryLine.type == "redeliver_requested"))
    assert actors == [("ada",)]
    shot(page, "09-message-delivered")

    for nav, name in (("Dashboard", "10-dashboard"), ("Services", "11-services"),
                      ("Settings", "12-settings"), ("Logs", "13-logs"),
                      ("Alerts", "14-alerts")):
        page.click(f"nav >> text={nav}")
        shot(page, name)
    page.goto("/ui/messages/send")
    shot(page, "15-send-message")

    viewer = page_for(browser, hub_url, "vic")
    viewer.goto(f"/ui/messages/{second}")
    assert viewer.locator("button:has-text('Redeliver')").count() == 0
    assert viewer.locator("button:has-text('Send again')").count() == 0
    viewer.goto("/ui/delivery-errors")
    assert viewer.locator("#redeliver-selected").count() == 0
    token = viewer.get_attribute("input[name=csrf_token]", "value")
    forced = viewer.request.post(f"/ui/deliveries/{delivery_id}/send-again",
                                 form={"csrf_token": token}, max_redirects=0)
    assert forced.status == 403
    assert fresh(select(Delivery.state).where(Delivery.id == delivery_id)) == [("delivered",)]
    shot(viewer, "16-viewer-message")


def drop(inbox: Path, name: str, body: bytes, to: str = "acme") -> None:
    """Write the file beside the inbox, then rename it in, as a partner would."""
    directory = inbox / to
    directory.mkdir(parents=True, exist_ok=True)
    staging = inbox.parent / f".{name}"
    staging.write_bytes(body)
    os.rename(staging, directory / name)


def wait_for_message(filename: str) -> int:
    found = wait_until(lambda: fresh(select(Message.id).where(
        Message.original_filename == filename)), 60, f"{filename} picked up")
    return found[0][0]



@pytest.fixture
def blocking_poster(hub, registry, app):
    """inbox → poster (answer_poster to a peer on loopback) whose rule blocks the
    instance on a 200 answer {"status": "ERR"}; wake-ups go to the real broker."""
    registry.register(testplugins.AnswerPoster)
    wakeup_module.set_publisher(CeleryPublisher(app).publish)
    with running_peer() as peer:
        peer.answers[b"BAD"] = PeerAnswer(200, b'{"status": "ERR", "text": "unknown GTIN"}')
        hub.parties()
        hub.instance("inbox", "manual_source")
        hub.instance("poster", "answer_poster", config={"url": peer.url},
                     max_concurrent_deliveries=1, business_rules=[
                         {"name": "rejected", "status": "2xx", "json_path": "$.status",
                          "json_value": "ERR", "block": "instance"}])
        hub.route("inbox", "*", "*", "poster")
        yield peer


def test_a_business_rule_blocks_an_instance_until_the_operator_resubmits(
        browser, hub_url, hub, blocking_poster):
    """A 200 answer the rule rejects blocks the target: Plugins shows it Blocked with the
    delivery linked; the message page's Resubmit (after the destination was fixed)
    releases it and the message held back goes out after the blocker."""
    peer = blocking_poster
    page = page_for(browser, hub_url, "ada")
    page.goto("/ui/plugins/poster/edit")
    assert '"block": "instance"' in page.input_value("#business_rules")
    shot(page, "17-plugin-form-business-rules")

    blocked = hub.message(body=b"BAD order 1")
    held = hub.message(body=b"order 2")
    [(blocker,)] = wait_until(lambda: fresh(select(Delivery.id).where(
        Delivery.message_id == blocked.id, Delivery.state == "failed")), 60, "failed")
    page.goto("/ui/plugins")
    cell = page.locator("table.instances tr[data-instance=poster] td:nth-child(3)")
    assert cell.inner_text().startswith(f"Blocked by delivery {blocker}")
    shot(page, "18-plugins-blocked")
    assert peer.received == [b"BAD order 1"]

    cell.locator(f"text=delivery {blocker}").click()
    assert "failed by business rule rejected" in page.inner_text("#history")
    shot(page, "19-message-business-error")
    peer.answers.clear()  # the destination's data was fixed
    page.click(f"#deliveries tr[data-delivery='{blocker}'] >> button:has-text('Resubmit')")
    wait_until(lambda: fresh(select(Delivery.state).where(
        Delivery.message_id == held.id)) == [("delivered",)], 60, "held one delivered")
    assert peer.received == [b"BAD order 1", b"BAD order 1", b"order 2"]
    page.goto("/ui/plugins")
    assert "Blocked" not in page.inner_text("table.instances tr[data-instance=poster]")


def test_an_admin_sets_up_an_http_poster_and_a_message_is_posted(browser, hub_url, tmp_path,
                                                                  session, registry):
    """The form drawn from the http_poster's schema: a cross-field problem shown on its
    field, secrets masked once saved, and a message it posted, seen on its page."""
    from b2bhub.services import config as svc
    from plugins.file_poller import FilePoller
    from plugins.http_poster import HttpPoster
    from tests.http_peer import Peer, Script

    for cls in (FilePoller, HttpPoster):
        registry.register(cls)
    inbox = tmp_path / "in"
    svc.create_party(session, "organization", "mycompany")
    svc.create_party(session, "partner", "acme")
    svc.save_instance(session, registry, {"name": "poller", "type": "file_poller", "config": {
        "base_directory": str(inbox), "polling_interval": 1, "path_pattern": "{to}/{filename}"}})
    session.commit()
    peer = Peer()
    peer.script("/orders", Script(201, body=b'{"order": "accepted"}'))
    try:
        page = page_for(browser, hub_url, "ada")
        page.click("nav >> text=Plugins")
        page.click("text=New http_poster…")
        page.fill("#name", "erp")
        page.fill("#config-url", peer.url("/orders"))
        page.fill("#config-headers", '{"X-Api-Version": "2"}')
        page.select_option("#config-auth", "basic")  # refused: basic needs a username
        page.fill("#config-password", "pw-never-shown")
        page.click("button:has-text('Save')")
        assert page.locator(".field.has-error #config-username").count() == 1
        assert "basic authentication needs a username" in page.inner_text("main")
        shot(page, "20-http-poster-form-error")
        page.fill("#config-username", "hub")
        page.fill("#config-password", "pw-never-shown")
        page.click("button:has-text('Save')")
        assert "Created http_poster instance erp" in page.inner_text("main")
        page.goto("/ui/plugins/erp/edit")
        assert page.input_value("#config-password") == "********"
        assert "pw-never-shown" not in page.content()
        shot(page, "21-http-poster-form")

        svc.create_route(session, registry, "poller", "*", "acme", "erp", actor="tests")
        session.commit()
        page.goto("/ui/messages")  # the list, live: the new row reaches Delivered
        wait_live(page)
        drop(inbox, "order-9.xml", b"<order n='9'/>")
        message_id = wait_for_message("order-9.xml")
        page.wait_for_selector(f'#messages tr[data-id="{message_id}"] .s-delivered',
                               timeout=60_000)
        page.goto(f"/ui/messages/{message_id}")
        page.wait_for_selector("#message-live h1 .s-delivered", timeout=30_000)
        assert "HTTP 201 Created" in page.inner_text("#history")
        seen = peer.seen[-1]
        assert seen.body == b"<order n='9'/>" and seen.headers["X-Api-Version"] == "2"
        assert seen.headers["Authorization"].startswith("Basic ")
        shot(page, "22-message-posted")
    finally:
        peer.close()


def test_deletes_ask_first_and_a_form_shows_every_error_at_once(browser, hub_url, hub,
                                                                 registry, tmp_path):
    """Delete asks on a page of its own (Cancel keeps, the confirm button deletes); a
    plugin form with several bad fields shows each error beside its field, once; every
    page, at 1366 and at 1024 px, with the whole menu on one line at 1024."""
    from plugins.file_writer import FileWriter
    registry.register(FileWriter)
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("writer", "file_writer", config={"base_directory": str(tmp_path)})
    route = hub.route("inbox", "*", "acme", "writer")
    message = hub.message(from_party="mycompany", to_party="acme").id
    page = page_for(browser, hub_url, "ada")

    page.click("nav >> text=Routes")
    row = f"#routes tr[data-route='{route.id}']"
    page.click(f"{row} >> text=Delete…")
    assert (f"Delete route {route.id}: inbox, * -> acme, writer?"
            in page.inner_text("#confirm h1"))
    shot(page, "23-confirm-delete-route")
    page.click("#confirm >> text=Cancel")
    assert page.locator(row).count() == 1  # cancelled: still there
    page.click(f"{row} >> text=Delete…")
    page.click("#confirm-yes")
    assert f"Deleted route {route.id}" in page.inner_text("main")
    assert page.locator(row).count() == 0

    page.click("nav >> text=Plugins")
    page.click("text=New file_writer…")
    assert page.inner_text("main h1") == "New file_writer instance"
    assert page.inner_text("label[for=config-base_directory]") == "Base directory (required)"
    page.fill("#name", "Bad Name")
    page.fill("#config-base_directory", "relative/dir")
    page.fill("#max_concurrent_deliveries", "lots")
    page.fill("#retry_policy", "{oops")
    page.click("button:has-text('Save')")
    for field_id, said in (("name", "must be 1-64 characters"),
                           ("config-base_directory", "must be an absolute path"),
                           ("max_concurrent_deliveries", "must be a whole number"),
                           ("retry_policy", "invalid JSON")):
        errors = page.locator(f".field.has-error:has(#{field_id}) .error")
        assert errors.count() == 1, field_id
        assert said in errors.inner_text(), field_id
    assert page.locator(".field.has-error").count() == 4
    assert page.input_value("#config-base_directory") == "relative/dir"
    shot(page, "24-plugin-form-every-error")

    for url, name in (("/ui/", "30-dashboard"), ("/ui/messages", "31-messages"),
                      (f"/ui/messages/{message}", "32-message"),
                      ("/ui/delivery-errors", "33-delivery-errors"),
                      ("/ui/routes", "34-routes"), ("/ui/plugins", "35-plugins"),
                      ("/ui/plugins/writer/edit", "36-plugin-form"),
                      ("/ui/parties", "37-parties"), ("/ui/parties/acme", "38-partner"),
                      ("/ui/parties/partner/acme/delete", "39-confirm-delete-party"),
                      ("/ui/system/services", "40-services"),
                      ("/ui/system/settings", "41-settings"),
                      ("/ui/system/notifications", "42-notifications"),
                      ("/ui/logs", "43-logs"), ("/ui/alerts", "44-alerts"),
                      ("/ui/storage", "45-storage"), ("/ui/messages/send", "46-send"),
                      ("/ui/no-such-page", "47-not-found")):
        page.goto(url)
        shot(page, name)
    # an address that is no page: the site's 404 page, with the menu to go on from
    answer = page.goto("/ui/no-such-page")
    assert answer.status == 404
    assert page.locator("h1").inner_text() == "404 Not Found"
    assert page.locator("header.top nav a").count() > 5
    page.click("header.top nav >> text=Routes")
    assert page.url.endswith("/ui/routes")
    page.set_viewport_size({"width": 1024, "height": 768})
    page.goto("/ui/messages")
    link = page.locator("header.top nav a").first.bounding_box()
    nav = page.locator("header.top").bounding_box()
    assert nav["height"] < 2 * link["height"], "the menu wraps at 1024 px"
    assert page.locator("#live-state").is_visible()

