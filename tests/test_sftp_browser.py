"""SFTP in a real browser against a real hub on loopback (gunicorn, a worker and beat)
and a real OpenSSH server: an admin saves a partner's SFTP profile, fetches the
server's host key, compares the SHA256 fingerprint shown with the server's own and
confirms it, then creates an sftp_writer from its generated form; secrets are shown as
``********``; a viewer gets no host-key buttons. Screenshots go to ``test-artifacts/``."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from b2bhub.models import HistoryLine
from b2bhub.services import config as svc
from tests import test_browser as kit
from tests.sshd_server import PASSWORD, USER, SshServer

pytestmark = pytest.mark.processes
hub_url, page_for, shot, fresh = kit.hub_url, kit.page_for, kit.shot, kit.fresh


@pytest.fixture
def sshd(tmp_path):
    server = SshServer(tmp_path / "sshd")
    yield server
    server.close()


@pytest.fixture
def acme(session):
    svc.create_party(session, "organization", "mycompany")
    svc.create_party(session, "partner", "acme")
    session.commit()


def test_an_admin_pins_a_partners_host_key_after_comparing_its_fingerprint(
        browser, acme, hub_url, sshd):
    page = page_for(browser, hub_url, "ada")
    page.goto("/ui/parties/partner/acme/sftp")
    assert "No SFTP profile yet" in page.inner_text("main")
    page.fill("#host", "127.0.0.1")
    page.fill("#port", str(sshd.port))
    page.fill("#username", USER)
    page.fill("#password", PASSWORD)
    page.click("button:has-text('Save SFTP profile')")
    assert f"Created the SFTP profile of partner acme ({USER}@127.0.0.1:{sshd.port})" in \
        page.inner_text("main")
    profile = page.inner_text("#sftp-profile")
    assert "********" in profile and PASSWORD not in page.content()
    assert "none: no connection is made until one is pinned" in page.inner_text(
        "#pinned-key")
    shot(page, "sftp1-profile-saved")

    page.click("#fetch-key button")
    offered = page.inner_text("#offered-fingerprint")
    assert offered == sshd.fingerprint()  # what ssh-keygen -l says on the server
    assert "none" in page.inner_text("#pinned-key")  # fetching pins nothing
    shot(page, "sftp2-host-key-fetched")

    page.click(f"#confirm-key button:has-text('Confirm and pin {offered}')")
    assert f"Pinned the host key {offered}" in page.inner_text("main")
    assert offered in page.inner_text("#pinned-key")
    shot(page, "sftp3-host-key-pinned")

    lines = fresh(select(HistoryLine.actor, HistoryLine.text).where(
        HistoryLine.type == "config_changed", HistoryLine.text.contains("host key"))
        .order_by(HistoryLine.id))
    assert [actor for actor, _text in lines] == ["ada", "ada"]
    assert "fetched the host key" in lines[0][1] and "pinned the fetched" in lines[1][1]

    viewer = page_for(browser, hub_url, "vic")
    viewer.goto("/ui/parties/partner/acme/sftp")
    assert offered in viewer.inner_text("#pinned-key")
    assert viewer.locator("#fetch-key").count() == 0
    assert viewer.locator("#paste-key").count() == 0


def test_an_admin_creates_an_sftp_writer_from_its_form(browser, acme, hub_url, sshd):
    page = page_for(browser, hub_url, "ada")
    page.goto("/ui/plugins/new/sftp_writer")
    page.fill("#name", "to-acme")
    page.fill("#config-host", "127.0.0.1")
    page.fill("#config-port", str(sshd.port))
    page.fill("#config-username", USER)
    page.fill("#config-password", PASSWORD)
    page.fill("#config-remote_directory", str(sshd.directory("to-acme")))
    page.click("button:has-text('Save')")  # refused: no pinned host key
    assert page.locator(".field.has-error #config-host_key").count() == 1
    assert "pin the server's host key" in page.inner_text("main")
    shot(page, "sftp4-writer-needs-host-key")

    page.fill("#config-password", PASSWORD)  # a browser never fills a password again
    page.fill("#config-host_key", f"[127.0.0.1]:{sshd.port} {sshd.host_key}")
    page.click("button:has-text('Save')")
    assert "Created sftp_writer instance to-acme" in page.inner_text("main")
    page.goto("/ui/plugins/to-acme/edit")
    assert page.input_value("#config-password") == "********"
    assert PASSWORD not in page.content()
    shot(page, "sftp5-writer-form")

    # the server is re-installed with a new host key: the operator fetches it, compares
    # its fingerprint with the server's own and confirms
    sshd.new_host_key()
    page.click("#instance-actions [data-action=fetch_host_key] button")
    fingerprint = page.inner_text('#action-answer code[data-key="fingerprint"]')
    assert fingerprint == sshd.fingerprint()
    shot(page, "sftp6-writer-host-key-fetched")
    page.click(f"#confirm-action button:has-text('Confirm and pin {fingerprint}')")
    assert f"Pinned the fetched host key ssh-ed25519 {fingerprint}" in page.inner_text("main")
    assert page.input_value("#config-host_key") == sshd.host_key
    assert page.input_value("#config-password") == "********"
    shot(page, "sftp7-writer-host-key-pinned")


def test_an_admin_creates_an_sftp_poller_and_pins_its_new_host_key(browser, acme, hub_url,
                                                                   sshd):
    """The poller's generated form (the post-processing choice, the archive), then the
    same fetch-and-confirm of a changed host key as the writer's."""
    page = page_for(browser, hub_url, "ada")
    page.goto("/ui/plugins/new/sftp_poller")
    page.fill("#name", "from-acme")
    page.fill("#config-host", "127.0.0.1")
    page.fill("#config-port", str(sshd.port))
    page.fill("#config-username", USER)
    page.fill("#config-password", PASSWORD)
    page.fill("#config-host_key", sshd.host_key)
    page.fill("#config-remote_directory", str(sshd.directory("from-acme")))
    page.fill("#config-to", "acme")
    page.select_option("#config-after", "move")
    page.click("button:has-text('Save')")  # refused: move needs an archive directory
    assert page.locator(".field.has-error #config-archive_directory").count() == 1
    page.fill("#config-password", PASSWORD)
    page.fill("#config-archive_directory", str(sshd.root / "done"))
    page.click("button:has-text('Save')")
    assert "Created sftp_poller instance from-acme" in page.inner_text("main")
    shot(page, "sftp8-poller-created")

    page.goto("/ui/plugins/from-acme/edit")
    assert page.input_value("#config-after") == "move"
    sshd.new_host_key()
    page.click("#instance-actions [data-action=fetch_host_key] button")
    fingerprint = page.inner_text('#action-answer code[data-key="fingerprint"]')
    assert fingerprint == sshd.fingerprint()
    page.click(f"#confirm-action button:has-text('Confirm and pin {fingerprint}')")
    assert f"Pinned the fetched host key ssh-ed25519 {fingerprint}" in page.inner_text("main")
    assert page.input_value("#config-host_key") == sshd.host_key
    shot(page, "sftp9-poller-host-key-pinned")
