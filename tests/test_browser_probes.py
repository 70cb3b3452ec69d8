"""A probe in a real browser against a real hub on loopback (gunicorn, a worker and
beat): an admin creates a target with a probe interval through its form, sees it
Offline on Services, Plugins and Alerts while its destination answers 503, and Online
once the destination is back. Screenshots go to ``test-artifacts/``."""

from __future__ import annotations

import pytest

from tests import test_browser as kit
from tests.test_probes import Peer

pytestmark = pytest.mark.processes
hub_url, page_for, shot = kit.hub_url, kit.page_for, kit.shot


def test_an_admin_sees_a_target_go_offline_and_come_back(browser, hub_url):
    peer = Peer()
    try:
        page = page_for(browser, hub_url, "ada")
        page.goto("/ui/plugins/new/probed_poster")
        page.fill("#name", "shop")
        page.fill("#config-url", f"{peer.url}/in")
        page.fill("#config-probe_url", f"{peer.url}/health")
        page.fill("#probe_interval", "3")  # refused: below the 5 s tick
        page.click("button:has-text('Save')")
        assert page.locator(".field.has-error #probe_interval").count() == 1
        shot(page, "p1-probe-interval-refused")
        page.fill("#probe_interval", "5")
        page.click("button:has-text('Save')")
        assert "Created probed_poster instance shop" in page.inner_text("main")

        page.goto("/ui/system/services")
        probe = page.locator('#instances tr[data-instance="shop"] td.probe')
        probe.locator(".s-offline").wait_for(timeout=60_000)  # the page refreshes itself
        assert "the probe answered offline" in page.inner_text(
            '#instances tr[data-instance="shop"]')
        shot(page, "p2-services-offline")
        page.goto("/ui/plugins")
        assert "Offline" in page.inner_text('tr[data-instance="shop"]')
        shot(page, "p3-plugins-offline")
        page.goto("/ui/alerts")
        assert "shop is offline: the probe answered offline" in page.inner_text("main")

        peer.health = 200
        page.goto("/ui/system/services")
        probe.locator(".s-online").wait_for(timeout=60_000)
        shot(page, "p4-services-online")
        assert peer.posts == []
    finally:
        peer.close()
