"""The README's first run works as written (issue 20, item 6): the fixtures file it
loads, `examples/first-run.json`, loads with `b2bhub fixtures load` in a process of its
own, and a file dropped under its inbox is written out under its outbox by a real worker
and beat. The only change to the file is its directory, `/tmp/b2bhub-demo`, which
becomes the test's own so that runs side by side do not meet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from b2bhub.models import Message
from tests.procs import wait_until
from tests.test_e2e_files import procs as procs_fixture  # noqa: F401 (the `procs` fixture)
from tests.test_e2e_files import rows

pytestmark = pytest.mark.processes

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "first-run.json"
DEMO = "/tmp/b2bhub-demo"


def test_the_first_run_fixtures_load_and_a_dropped_file_is_written_out(procs, tmp_path):
    text = EXAMPLE.read_text(encoding="utf-8")
    assert DEMO in text
    fixtures = tmp_path / "first-run.json"
    fixtures.write_text(text.replace(DEMO, str(tmp_path / "demo")), encoding="utf-8")
    loaded = procs.cli("fixtures", "load", str(fixtures))
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    assert "1 organizations, 1 partners, 2 plugins, 1 routes" in loaded.stdout
    worker = procs.worker(wait=False)
    procs.beat()
    worker.wait_in_log(" ready.", timeout=60)

    # as the README does it: a file under in/<partner>/
    body = b"UNA:+.? \nUNB+UNOC:3+MYCOMPANY+ACME\n"
    (tmp_path / "demo" / "in" / "acme").mkdir(parents=True, exist_ok=True)
    (tmp_path / "demo" / "in" / "acme" / "order.edi").write_bytes(body)

    out = tmp_path / "demo" / "out" / "acme" / "order.edi"
    wait_until(lambda: out.exists() and rows(select(Message.status))[0][0] == "delivered",
               60, "the dropped file written out and its message delivered")
    assert out.read_bytes() == body
    message = rows(select(Message.from_party, Message.to_party, Message.original_filename))
    assert [tuple(m) for m in message] == [("mycompany", "acme", "order.edi")]
    assert json.loads(text)["routes"] == [
        {"source": "inbox", "from": "*", "to": "acme", "target": "outbox"}]
