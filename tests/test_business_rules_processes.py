"""``block: "instance"`` end to end with a real ``celery worker`` and ``celery beat``: a
business error on a 200 answer blocks the target instance; later messages wait (the
destination sees none of them, the sweep neither wakes nor stalls them); Resubmit of
the blocker releases them and everything goes out in order; Skip likewise. The
destination is a real HTTP server on loopback that records what it is sent."""

from __future__ import annotations

import re

import b2bhub_testplugins as testplugins
import pytest
from sqlalchemy import select

from b2bhub.engine import wakeups as wakeup_module
from b2bhub.engine.settings import DeliverySettings, save_settings
from b2bhub.models import Delivery, PluginInstance
from b2bhub.runtime.hub import CeleryPublisher, new_session
from tests import test_ui
from tests.answering_peer import PeerAnswer, running_peer
from tests.procs import wait_until

pytestmark = pytest.mark.processes

login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request
RULE = {"name": "rejected", "status": 200, "json_path": "$.status", "json_value": "ERR",
        "block": "instance"}


@pytest.fixture
def peer():
    with running_peer() as peer:
        peer.answers[b"BAD"] = PeerAnswer(200, b'{"status": "ERR", "text": "unknown GTIN"}')
        yield peer


@pytest.fixture
def live(hub, registry, session, app, peer):
    """inbox → poster (answer_poster to the peer, the rule above), wake-ups published
    to the broker the processes read, and a short wake-up schedule: a delivery woken
    twice without a claim is stalled after a few seconds, unless it waits on purpose."""
    registry.register(testplugins.AnswerPoster)
    wakeup_module.set_publisher(CeleryPublisher(app).publish)
    save_settings(session, DeliverySettings(stall_after=2, wake_delays=(1, 1)))
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("poster", "answer_poster", config={"url": peer.url}, business_rules=[RULE],
                 max_concurrent_deliveries=1)
    hub.route("inbox", "*", "*", "poster")
    return hub


def _delivery(message_id: int) -> Delivery:
    with new_session() as s:
        return s.scalar(select(Delivery).where(Delivery.message_id == message_id))


def _blocked_by() -> int | None:
    with new_session() as s:
        return s.scalar(select(PluginInstance.blocked_by_delivery_id).where(
            PluginInstance.name == "poster"))


def _sweeps(worker) -> int:
    return len(re.findall(r"Task b2bhub\.sweep\[[^\]]+\] succeeded", worker.output()))


def _block(hub, peer, worker, body: bytes, later: list[bytes]) -> tuple[Delivery, list]:
    """Send ``body`` (rejected), wait for the block, then send ``later`` and let the
    sweep run over them a few times."""
    first = hub.message(body=body)
    wait_until(lambda: _blocked_by() is not None, 30, "blocked")
    blocker = _delivery(first.id)
    assert (blocker.state, blocker.failure_kind, _blocked_by()) == (
        "failed", "business", blocker.id)
    messages = [hub.message(body=b) for b in later]
    swept = _sweeps(worker)
    wait_until(lambda: _sweeps(worker) >= swept + 3, 40, "swept three times")
    return blocker, [m.id for m in messages]


def test_block_instance_then_resubmit_then_skip_with_real_processes(
        procs, live, peer, api, login):
    worker = procs.worker()
    procs.beat()

    blocker, later = _block(live, peer, worker, b"BAD 1", [b"ok 2", b"ok 3", b"ok 4"])
    # later messages wait: not attempted, not stalled, not woken
    assert peer.received == [b"BAD 1"]
    assert [(d.state, d.attempt) for d in map(_delivery, later)] == [("queued", 0)] * 3
    shape = api.get("/api/v1/plugins/configs/poster").get_json()
    assert shape["blocked_by"]["delivery_id"] == blocker.id
    client = login("operator")
    services = client.get("/ui/system/services").text
    assert f'data-blocked-by="{blocker.id}">Blocked</strong>' in services
    assert f'data-blocked-by="{blocker.id}">Blocked</strong>' in client.get("/ui/plugins").text

    peer.answers.clear()  # the destination's data was fixed
    resubmitted = api.post(f"/api/v1/deliveries/{blocker.id}/resubmit")
    assert resubmitted.status_code == 200, resubmitted.text
    wait_until(lambda: all(_delivery(m).state == "delivered" for m in later), 30,
               "all delivered")
    assert peer.received == [b"BAD 1", b"BAD 1", b"ok 2", b"ok 3", b"ok 4"]
    assert _delivery(blocker.message_id).state == "delivered" and _blocked_by() is None

    # blocked again by another message; this time the operator skips it
    peer.answers[b"BAD"] = PeerAnswer(200, b'{"status": "ERR"}')
    second, later = _block(live, peer, worker, b"BAD 5", [b"ok 6", b"ok 7"])
    assert peer.received[5:] == [b"BAD 5"]
    assert [d.state for d in map(_delivery, later)] == ["queued"] * 2
    skipped = api.post(f"/api/v1/deliveries/{second.id}/skip")
    assert skipped.status_code == 200, skipped.text
    wait_until(lambda: all(_delivery(m).state == "delivered" for m in later), 30,
               "all delivered")
    assert peer.received[5:] == [b"BAD 5", b"ok 6", b"ok 7"]
    assert _delivery(second.message_id).state == "skipped" and _blocked_by() is None
    assert "Blocked</strong>" not in client.get("/ui/system/services").text
