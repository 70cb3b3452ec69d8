"""Probes (SPEC 6 and 8): the schedule, the record, what an offline target's deliveries
do, and where the result shows. The destination is a real HTTP server on loopback that
counts the requests it gets; the target is the test plugin ``probed_poster``.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import b2bhub_testplugins as testplugins
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.engine import probes
from b2bhub.engine import wakeups as wakeup_module
from b2bhub.engine.instances import mark_targets_running, stop_instance
from b2bhub.engine.probes import ProbeResult, ProbeRunner, due_probes, record
from b2bhub.engine.runner import TargetRunner
from b2bhub.engine.settings import DeliverySettings, save_settings
from b2bhub.engine.sweep import SweepGuard, run_sweep
from b2bhub.models import Alert, Delivery, HistoryLine, PluginInstance, utcnow
from b2bhub.plugin.registry import PluginRegistry
from b2bhub.runtime import hub as hub_module
from b2bhub.runtime.hub import CeleryPublisher
from b2bhub.services import config as svc
from tests.enginekit import T0, at
from tests.http_peer import own_path, own_prefix
from tests.loopback import serve_in_thread
from tests.procs import free_port, wait_until

SUBJECT = "instance:poster"


# --- the destination and the plugins ------------------------------------------------

class Peer:
    """A destination on loopback. ``GET /health`` answers ``health`` (503: the
    destination is down); ``POST /in`` records the body and answers 200. Its URL has a
    path prefix of its own (:mod:`tests.http_peer`)."""

    def __init__(self) -> None:
        self.health = 503
        self.posts: list[dict] = []
        self.probes = 0
        self.prefix, self.strays = own_prefix(), []
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if own_path(self, peer.prefix, peer.strays) is None:
                    return
                peer.probes += 1
                self._answer(peer.health)

            def do_POST(self):  # noqa: N802
                if own_path(self, peer.prefix, peer.strays) is None:
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                peer.posts.append({"body": body, "attempt": self.headers.get("X-Attempt")})
                self._answer(200)

            def _answer(self, status: int) -> None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{self.prefix}"
        self.thread = serve_in_thread(self.server)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Hanging:
    """A target whose probe hangs until the test lets it go."""

    type_name = "hanging"
    roles = frozenset({"target"})
    config_schema: list = []
    entered = threading.Event()
    release = threading.Event()

    def __init__(self, instance_name, config):
        self.instance_name, self.config = instance_name, config

    def probe(self) -> bool:
        Hanging.entered.set()
        Hanging.release.wait(30)
        return True

    def deliver(self, delivery, payload, context):
        raise AssertionError("never attempted in these tests")


@pytest.fixture
def registry():
    reg = PluginRegistry()
    for cls in (testplugins.ProbedPoster, testplugins.Noop, testplugins.ManualSource,
                Hanging):
        reg.register(cls)
    return reg


@pytest.fixture
def peer():
    server = Peer()
    yield server
    server.close()


class Clock:
    """The runners' clock, moved on by the test."""

    def __init__(self, start: datetime):
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def poster(hub, peer: Peer, name: str = "poster", **fields) -> PluginInstance:
    return hub.instance(name, "probed_poster", config={
        "url": f"{peer.url}/in", "probe_url": f"{peer.url}/health", "timeout": 2}, **fields)


def setup_poster(hub, session, peer: Peer, **fields) -> PluginInstance:
    """Parties, an ``inbox`` source, the ``poster`` target (Running) and the route."""
    hub.parties()
    hub.instance("inbox", "manual_source")
    row = poster(hub, peer, **fields)
    hub.route("inbox", "*", "*", "poster")
    mark_targets_running(session, hub.registry, utcnow())
    session.commit()
    return row


def instance(name: str = "poster") -> PluginInstance:
    with Session(db.engine) as s:
        return s.scalar(select(PluginInstance).where(PluginInstance.name == name))


def the_delivery(message_id: int) -> Delivery:
    with Session(db.engine) as s:
        return s.scalars(select(Delivery).where(Delivery.message_id == message_id)).one()


def offline_alerts(session) -> list[Alert]:
    session.expire_all()
    return list(session.scalars(select(Alert).where(
        Alert.kind == "target_offline", Alert.subject == SUBJECT).order_by(Alert.id)))


def tick(runner: ProbeRunner, session) -> list[str]:
    """One tick; waits for the probes it started; the instances probed."""
    threads = runner.tick(session)
    for thread in threads:
        thread.join(30)
    return sorted(t.name.removeprefix("probe-") for t in threads)


def probe_lines(session) -> list[HistoryLine]:
    """History lines not about a message, or that speak of probes or being offline."""
    session.expire_all()
    return [line for line in session.scalars(select(HistoryLine))
            if line.message_id is None or "probe" in line.text or "offline" in line.text]


# --- the schedule -------------------------------------------------------------------

def test_the_interval_is_the_instance_s_own_or_else_the_setting_s(hub, session, peer,
                                                                   registry):
    settings = DeliverySettings(probe_interval=20)
    assert probes.probe_interval(0, settings) == 20
    assert probes.probe_interval(45, settings) == 45
    hub.parties()
    poster(hub, peer, "by_setting")
    poster(hub, peer, "own", probe_interval=45)
    mark_targets_running(session, registry, T0)
    session.commit()
    assert instance("by_setting").probe_interval == 0  # the default follows the setting

    def due(seconds: float) -> list[str]:
        """Due at T0 + seconds, with the settings stored (20 s unless changed)."""
        return sorted(name for name, _ in due_probes(session, registry, at(seconds)))

    save_settings(session, settings)
    session.commit()
    assert due(0) == ["by_setting", "own"]
    assert due(1) == []  # each is published once per interval
    assert due(20) == ["by_setting"]
    assert due(40) == ["by_setting"]
    assert due(45) == ["own"]
    save_settings(session, DeliverySettings(probe_interval=100))
    session.commit()
    assert due(60) == ["by_setting"]  # now due 100 s on
    assert due(90) == ["own"]
    assert due(134) == []
    assert due(135) == ["own"]
    assert due(159) == []
    assert due(160) == ["by_setting"]
    save_settings(session, DeliverySettings(probe_interval=20))
    session.commit()
    assert due(161) == ["by_setting"]  # due at 260, but the interval is 20 now
    assert due(180) == ["own"]
    assert due(181) == ["by_setting"]


def test_only_enabled_started_targets_whose_type_probes_are_due(hub, session, peer,
                                                                registry):
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("plain", "noop")  # a target without a probe
    for name in ("probed", "stopped", "disabled"):
        poster(hub, peer, name)
    disabled = svc.get_instance(session, "disabled")
    svc.save_instance(session, registry, {"enabled": False, "config": disabled.config},
                      disabled)
    session.commit()
    assert [n for n, _ in due_probes(session, registry, T0)] == []  # none started yet
    mark_targets_running(session, registry, T0)
    stop_instance(session, "stopped", "olga", T0)
    session.commit()

    assert due_probes(session, registry, at(1)) == [("probed", 60)]


def test_one_process_ticks_at_a_time(hub, session, peer, registry):
    """Two sessions stand for two worker processes that got a tick each; the probe
    guard is the sweep's kind of guard, apart from the sweep's own."""
    peer.health = 200
    setup_poster(hub, session, peer)
    first_runner = ProbeRunner(registry, "worker-1", clock=Clock(T0))
    second_runner = ProbeRunner(registry, "worker-2", clock=Clock(at(1)))
    with Session(db.engine) as first, Session(db.engine) as second:
        with SweepGuard(first, "worker-1", T0, name="probes") as held:
            assert held
            assert tick(second_runner, second) == []
            assert run_sweep(second, at(1), "worker-2").ran  # the sweep is not held up
        assert peer.probes == 0
        assert tick(second_runner, second) == ["poster"]
        assert tick(first_runner, first) == []  # due again only one interval later
    assert peer.probes == 1
    assert instance().online is True


# --- offline and back ---------------------------------------------------------------

def test_offline_holds_deliveries_without_attempts_and_online_delivers(
        hub, session, peer, registry, wakeups, app):
    setup_poster(hub, session, peer)
    save_settings(session, DeliverySettings(stall_after=1, wake_delays=(1,)))
    session.commit()
    clock = Clock(utcnow())
    probing = ProbeRunner(registry, "worker-1", clock=clock)
    assert tick(probing, session) == ["poster"]
    row = instance()
    assert (row.online, row.probe_checked_at, row.probe_text) == (
        False, clock.now, "the probe answered offline")
    assert [a.text for a in offline_alerts(session)] == [
        "poster is offline: the probe answered offline"]

    message = hub.message(body=b"ORDERS 1")
    delivering = TargetRunner(hub_module.new_session, registry, hub.store, "worker-1")
    assert delivering.drain("poster").claimed == 0  # the wake-up of the dispatch
    report = run_sweep(session, utcnow() + timedelta(minutes=30), "sweeper")
    assert (report.stalled, report.woken) == (0, 0)  # it waits; nothing stalls
    clock.advance(60)
    assert tick(probing, session) == ["poster"]  # still offline: the same one alert
    assert len(offline_alerts(session)) == 1 and offline_alerts(session)[0].resolved_at is None
    waiting = the_delivery(message.id)
    assert (waiting.state, waiting.attempt, waiting.wake_count) == ("queued", 0, 1)
    assert peer.posts == []

    peer.health = 200
    wakeups.clear()
    clock.advance(60)
    assert tick(probing, session) == ["poster"]
    assert instance().online is True
    assert offline_alerts(session)[0].resolved_at == clock.now
    assert wakeups == [(waiting.id, "poster")]  # woken at once, after the commit
    assert delivering.drain("poster").claimed == 1
    done = the_delivery(message.id)
    assert (done.state, done.attempt) == ("delivered", 1)
    assert peer.posts == [{"body": b"ORDERS 1", "attempt": "1"}]
    assert peer.probes == 3
    assert probe_lines(session) == []  # probe results never enter history


def test_a_hanging_probe_holds_up_neither_the_tick_nor_other_probes(hub, session, peer,
                                                                     registry):
    peer.health = 200
    hub.parties()
    poster(hub, peer)
    hub.instance("stuck", "hanging")
    mark_targets_running(session, registry, T0)
    session.commit()
    Hanging.entered.clear()
    Hanging.release.clear()
    clock = Clock(utcnow())
    runner = ProbeRunner(registry, "worker-1", timeout=5, clock=clock)
    try:
        threads = {t.name: t for t in runner.tick(session)}
        assert set(threads) == {"probe-poster", "probe-stuck"}
        assert threads["probe-stuck"].is_alive()  # the tick returned without waiting
        assert Hanging.entered.wait(10)
        threads["probe-poster"].join(10)
        assert instance("poster").online is True  # recorded while the other hangs
        assert threads["probe-stuck"].is_alive() and instance("stuck").online is None
        threads["probe-stuck"].join(10)
        stuck = instance("stuck")
        assert (stuck.online, stuck.probe_text) == (False, "no answer within 5 s")

        clock.advance(60)
        assert tick(runner, session) == ["poster"]  # not again while its call hangs
    finally:
        Hanging.release.set()
    assert peer.probes == 2


def test_a_target_whose_type_has_no_probe_is_never_left_offline(hub, session, peer,
                                                                 registry, wakeups):
    """A result left by a type that probed once (an upgrade took its probe away)."""
    setup_poster(hub, session, peer)
    hub.instance("plain", "noop")
    hub.route("inbox", "acme", "mycompany", "plain")
    mark_targets_running(session, registry, T0)
    record(session, "plain", ProbeResult(False, "down"), T0, T0)
    session.commit()
    message = hub.message()
    wakeups.clear()
    assert [name for name, _ in due_probes(session, registry, at(1))] == ["poster"]
    assert (instance("plain").online, instance("plain").probe_text) == (
        None, "type noop has no probe")
    plain = [d for d in session.scalars(select(Delivery).where(
        Delivery.message_id == message.id)) if d.target == "plain"]
    assert wakeups == [(plain[0].id, "plain")]
    session.expire_all()
    assert session.scalar(select(Alert.resolved_at).where(
        Alert.subject == "instance:plain")) is not None


def test_a_late_answer_never_overwrites_a_newer_one(hub, session, peer):
    setup_poster(hub, session, peer)
    assert record(session, "poster", ProbeResult(True, "up"), at(10), at(11)) == "same"
    assert record(session, "poster", ProbeResult(False, "down"), at(5), at(12)) == "stale"
    session.commit()
    row = instance()
    assert (row.online, row.probe_checked_at, row.probe_text) == (True, at(10), "up")
    assert offline_alerts(session) == []


def test_a_probe_that_fails_is_offline_with_its_reason(hub, session, peer, registry):
    setup_poster(hub, session, peer)
    with Session(db.engine) as s:
        s.get(PluginInstance, instance().id).config = {
            "url": f"{peer.url}/in", "probe_url": f"http://127.0.0.1:{free_port()}/",
            "timeout": 2}
        s.commit()
    assert tick(ProbeRunner(registry, "worker-1"), session) == ["poster"]
    row = instance()
    assert row.online is False
    assert row.probe_text.startswith("probe failed: ConnectionError: ")
    assert offline_alerts(session)[0].text.startswith("poster is offline: probe failed")


def test_an_instance_without_a_probe_any_more_is_no_longer_offline(
        hub, session, peer, registry, wakeups):
    setup_poster(hub, session, peer)
    clock = Clock(utcnow())
    runner = ProbeRunner(registry, "worker-1", clock=clock)
    tick(runner, session)
    message = hub.message()
    assert instance().online is False
    with Session(db.engine) as s:  # the operator removes the probe URL
        s.get(PluginInstance, instance().id).config = {"url": f"{peer.url}/in"}
        s.commit()
    wakeups.clear()
    clock.advance(60)
    assert tick(runner, session) == ["poster"]
    row = instance()
    assert (row.online, row.probe_text) == (None, "this instance has no probe")
    assert offline_alerts(session)[0].resolved_at is not None
    assert wakeups == [(the_delivery(message.id).id, "poster")]


# --- with real processes ------------------------------------------------------------

@pytest.mark.processes
def test_real_worker_and_beat_hold_an_offline_target_and_deliver_once_it_is_back(
        procs, hub, session, peer, app):
    """Beat ticks, a worker probes every 5 s; the destination's health says 503, then
    200. With a stall after one wake-up 1 s apart, the sweep would stall a delivery that
    it did not leave alone."""
    setup_poster(hub, session, peer, probe_interval=5)
    save_settings(session, DeliverySettings(stall_after=1, wake_delays=(1,)))
    session.commit()
    wakeup_module.set_publisher(CeleryPublisher(app).publish)
    procs.worker()
    procs.beat()
    wait_until(lambda: instance().online is False, 60, "probed offline")
    message = hub.message(body=b"ORDERS 2")
    first = instance().probe_checked_at
    # two probes later, every sweep of 10 s and the dispatch's wake-up have come and gone
    wait_until(lambda: instance().probe_checked_at >= first + timedelta(seconds=10), 60,
               "probed twice more")
    waiting = the_delivery(message.id)
    assert (waiting.state, waiting.attempt) == ("queued", 0)
    assert peer.posts == []
    assert [a.resolved_at for a in offline_alerts(session)] == [None]
    assert session.scalar(select(func.count()).select_from(Alert).where(
        Alert.kind == "delivery_stalled")) == 0

    peer.health = 200
    wait_until(lambda: the_delivery(message.id).state == "delivered", 60, "delivered")
    assert instance().online is True
    assert [a.resolved_at is not None for a in offline_alerts(session)] == [True]
    assert the_delivery(message.id).attempt == 1
    assert peer.posts == [{"body": b"ORDERS 2", "attempt": "1"}]
    assert probe_lines(session) == []
