"""Expected-message rules with real processes and the hub's clock moved
(docs/expected-messages.md): web, worker and beat share one clock file
(``B2BHUB_FAKE_CLOCK_FILE``); beat's ``expected`` tick judges the windows. One hub
serves every scenario, in the clock's order: a message in the last 2 s before a window's
end (aimed at 2 s before; a loaded machine's requests may take most of that) raises
nothing while a missed window raises ``expected_missing`` within 60 s of its end; a
late message resolves it; a restart of worker and beat across a window's end; a window
across the spring change, its rule made on the Alerts page's form in a browser
(screenshots in ``test-artifacts/``)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests

from b2bhub.services.tokens import create_token
from b2bhub.services.users import create_user
from tests.procs import BIN, wait_until
from tests.test_browser import PASSWORD, page_for, shot

pytestmark = pytest.mark.processes

BERLIN = "Europe/Berlin"


class Hub:
    """The processes, the clock they share, and the API of the web process."""

    def __init__(self, procs, session, tmp_path):
        self.procs, self.clock_file = procs, tmp_path / "clock"
        self.clock_file.write_text("0")
        self.env = {"B2BHUB_FAKE_CLOCK_FILE": str(self.clock_file)}
        token = create_token(session, "expected-tests", "admin")
        session.commit()
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"
        self.probes = 0

    def start(self) -> None:
        self.worker = self.procs.worker(extra_env=self.env, wait=False)
        self.beat = self.procs.beat(extra_env=self.env)
        self.worker.wait_in_log(" ready.", timeout=60)

    def stop(self) -> None:
        self.beat.stop()
        self.worker.stop()

    def set_clock(self, moment: datetime) -> None:
        """Every process's clock reads ``moment`` (naive UTC) from now on."""
        real = datetime.now(UTC).replace(tzinfo=None)
        self.clock_file.write_text(str((moment - real).total_seconds()))

    def stamp_at(self, moment: datetime) -> None:
        """Set the clock and wait until the web process stamps messages with it (it
        reads the file again every 0.2 s): a probe message nothing expects, until one
        is stamped at ``moment`` or later."""
        self.set_clock(moment)

        def caught_up():
            self.probes += 1
            return self.send(f"probe-{self.probes}.txt", "mycompany", "acme")["created_at"] \
                >= f"{moment:%Y-%m-%dT%H:%M:%S}"
        wait_until(caught_up, 10, f"the web's clock at {moment}")

    def send(self, filename: str, sender: str = "acme", to: str = "mycompany") -> dict:
        answer = self.http.post(f"{self.web.url}/api/v1/messages", files={
            "file": (filename, b"body")}, data={"from": sender, "to": to,
                                                 "target": "writer"})
        assert answer.status_code == 201, answer.text
        return answer.json()

    def rule(self, name: str, **fields) -> None:
        made = self.http.post(f"{self.web.url}/api/v1/expected/rules",
                              json={"name": name, "direction": "inbound", "from": "acme",
                                    **fields})
        assert made.status_code == 201, made.text

    def windows(self, rule: str) -> list[dict]:
        return self.http.get(f"{self.web.url}/api/v1/expected/rules/{rule}/windows"
                             ).json()["items"]

    def alerts(self, rule: str, state: str = "all") -> list[dict]:
        items = self.http.get(f"{self.web.url}/api/v1/alerts", params={
            "kind": "expected_missing", "state": state}).json()["items"]
        return [a for a in items if a["subject"].startswith(f"expected:{rule}:")]


def test_windows_met_missed_late_across_a_restart_and_a_dst_change(procs, session, tmp_path,
                                                                  browser):
    hub = Hub(procs, session, tmp_path)
    create_user(session, "ada", PASSWORD, "admin")
    session.commit()
    fixtures = tmp_path / "fixtures.json"
    fixtures.write_text(json.dumps({
        "organizations": [{"name": "mycompany"}], "partners": [{"name": "acme"}],
        "plugins": [{"name": "writer", "type": "file_writer", "config": {
            "base_directory": str(tmp_path / "out"),
            "filename_pattern": "{message_id}-{original_filename}"}}],
        "expected": [{"name": "stock", "direction": "inbound", "from": "acme",
                      "filename": "STOCK-*.csv", "schedule": "0 6 * * *",
                      "timezone": BERLIN}]}))
    end = datetime(2027, 1, 11, 5)  # Monday 11 January 2027, 06:00 in Berlin
    hub.set_clock(end - timedelta(minutes=5))
    done = subprocess.run(  # the clock file too: the rule is made at the test's time
        [str(BIN / "b2bhub"), "fixtures", "load", str(fixtures)], env=procs.env(hub.env),
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    hub.web = procs.web(extra_env=hub.env)
    hub.start()
    hub.rule("inventory", filename="INV-*.csv", schedule="0 6 * * *", timezone=BERLIN)
    wait_until(lambda: [w["ends_at"] for w in hub.windows("inventory")] ==
               ["2027-01-11T05:00:00Z"], 30, "the open window planned")

    # a second or two before the end the inventory arrives; the stock never does
    hub.stamp_at(end - timedelta(seconds=2))
    sent = hub.send("INV-0111.csv")
    assert f"{end - timedelta(seconds=2):%Y-%m-%dT%H:%M:%S}" <= sent["created_at"] \
        < f"{end:%Y-%m-%dT%H:%M:%S}"
    hub.set_clock(end)
    ended = time.monotonic()
    missing = wait_until(lambda: hub.alerts("stock"), 60, "expected_missing for stock")
    assert time.monotonic() - ended < 60
    assert [(a["text"], a["resolved_at"]) for a in missing] == [
        ("no message for rule stock in the window 2027-01-10 06:00 to 2027-01-11 06:00 "
         "Europe/Berlin", None)]
    assert hub.alerts("inventory") == []
    assert [(w["state"], w["message_id"]) for w in hub.windows("inventory")][-1] == (
        "met", sent["id"])

    # the stock file comes 9.5 min late: the alert resolves, saying so
    hub.stamp_at(end + timedelta(minutes=9, seconds=30))
    late = hub.send("STOCK-0111.csv")
    resolved = wait_until(lambda: hub.alerts("stock", "resolved"), 30, "the alert resolved")
    assert resolved[0]["text"].endswith(f"; arrived 10 min late (message {late['id']})")
    assert [w["state"] for w in hub.windows("stock")
            if w["ends_at"] == "2027-01-11T05:00:00Z"] == ["late"]

    # worker and beat are down across Tuesday's 06:00; back, they judge it once
    hub.stamp_at(end + timedelta(days=1, minutes=-10))
    on_time = hub.send("INV-0112.csv")
    hub.stop()
    hub.set_clock(end + timedelta(days=1, minutes=30))
    hub.start()
    wait_until(lambda: hub.alerts("stock", "open"), 60, "Tuesday's stock judged missing")
    assert [w["state"] for w in hub.windows("inventory")][:2] == ["open", "met"]
    assert hub.windows("inventory")[1]["message_id"] == on_time["id"]
    assert [a["subject"] for a in hub.alerts("stock", "open")] == [
        "expected:stock:end:2027-01-12T05:00:00"]
    for name in ("inventory", "stock"):
        assert hub.http.delete(f"{hub.web.url}/api/v1/expected/rules/{name}"
                               ).status_code == 204
    assert hub.alerts("stock", "open") == []

    # Sunday 28 March 2027: 06:00 in Berlin is 04:00 UTC, the window 23 hours long
    spring = datetime(2027, 3, 28, 4)
    hub.stamp_at(spring - timedelta(minutes=2))
    page = page_for(browser, hub.web.url, "ada")  # the rule made on the Alerts page's form
    page.goto("/ui/alerts")
    for field, value in (("#name", "dst"), ("#from_party", "acme"), ("#filename", "DST-*.csv"),
                         ("#schedule", "0 6 * * *"), ("#timezone", BERLIN)):
        page.fill(f"#add-expected-rule {field}", value)
    page.select_option("#add-expected-rule #direction", "inbound")
    shot(page, "expected-1-rule-form")
    page.click("#add-expected-rule button:has-text('Add rule')")
    assert "Created expected-message rule dst" in page.inner_text("main")
    wait_until(lambda: hub.windows("dst"), 30, "the DST window planned")
    assert [(w["starts_at"], w["ends_at"]) for w in hub.windows("dst")] == [
        ("2027-03-27T05:00:00Z", "2027-03-28T04:00:00Z")]
    hub.set_clock(spring)
    ended = time.monotonic()
    dst = wait_until(lambda: hub.alerts("dst"), 60, "expected_missing for dst")
    assert time.monotonic() - ended < 60
    assert dst[0]["text"] == ("no message for rule dst in the window 2027-03-27 06:00 to "
                              "2027-03-28 06:00 Europe/Berlin")
    page.goto("/ui/alerts")
    assert page.inner_text('#expected-rules tr[data-rule="dst"] li[data-state="missed"]'
                           ).startswith("missed 2027-03-27 05:00")
    assert dst[0]["text"] in page.inner_text("#alerts")
    shot(page, "expected-2-alerts-missed-window")
    page.goto("/ui/parties/acme")
    assert page.locator('#expected-rules tr[data-rule="dst"] li[data-state="missed"]'
                        ).count() == 1
    # the partner's scorecard on the same page counts the missed window among its own
    card = page.inner_text("#scorecard-expected")
    assert int(re.search(r"(\d+) missed", card).group(1)) >= 1, card
    assert page.locator("#scorecard tbody tr").count() >= 1
    shot(page, "expected-3-partner-scorecard-and-windows")
    page.set_viewport_size({"width": 1024, "height": 768})  # a laptop: the page does not
    assert page.evaluate("document.documentElement.scrollWidth") <= 1024  # scroll sideways
