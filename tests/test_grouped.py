"""Group commit of intakes (b2bhub.engine.grouped): requests that reach their write while
another's is in flight are written together, each answered with its own message; a
group the server refuses for one message's content is written again one by one; any
other failure fails the group without writing anything twice."""

from __future__ import annotations

import hashlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from sqlalchemy import select
from sqlalchemy.exc import DataError

from b2bhub.engine.dispatch import INTAKE_KEYS, NewMessage, read_settings
from b2bhub.engine.grouped import WriteGroup, intakes, store_and_dispatch_grouped
from b2bhub.models import Delivery, Message, Payload, utcnow
from b2bhub.runtime.hub import new_session
from plugins.http_poster import HttpPoster
from plugins.http_receiver import HttpReceiver
from tests.conftest import IS_POSTGRES
from tests.enginekit import standard_hub
from tests.test_http_receiver import auth, set_up_receivers


def _refused(text: str) -> DataError:
    return DataError("INSERT ...", {}, Exception(text))


class Recorder:
    """A group's write: records each call's items; the first call waits for ``release``
    once ``hold`` is set; items named ``bad`` make a call refused (or fail otherwise)."""

    def __init__(self, hold: bool = False, failure: type[Exception] = DataError):
        self.calls: list[list[str]] = []
        self.entered, self.release = threading.Event(), threading.Event()
        self.hold, self.failure = hold, failure

    def __call__(self, items):
        self.calls.append(list(items))
        if self.hold and len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(10)
        if "bad" in items:
            raise (_refused("value too long") if self.failure is DataError
                   else self.failure("connection lost"))
        return [f"id-{item}" for item in items]


def _waiting(group: WriteGroup, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(group._pending) < n:
        assert time.monotonic() < deadline, "the other writes never queued"
        time.sleep(0.001)


def _in_threads(group: WriteGroup, write, first: str, others: list[str], hold: Recorder):
    """``first`` written while ``others`` arrive; each one's result or error by item."""
    results: dict[str, object] = {}

    def one(item):
        try:
            results[item] = group.write(item, write)
        except Exception as exc:
            results[item] = exc

    with ThreadPoolExecutor(len(others) + 1) as pool:
        pool.submit(one, first)
        assert hold.entered.wait(10)
        for item in others:
            pool.submit(one, item)
        _waiting(group, len(others))
        hold.release.set()
    return results


def test_writes_arriving_during_a_write_go_together_each_with_its_own_result():
    group, write = WriteGroup(writers=1), Recorder(hold=True)
    results = _in_threads(group, write, "a", ["b", "c", "d"], write)
    assert write.calls[0] == ["a"]
    assert sorted(write.calls[1]) == ["b", "c", "d"] and len(write.calls) == 2
    assert results == {item: f"id-{item}" for item in "abcd"}
    assert (group.groups, group.items) == (2, 4)
    # alone, a write goes at once, in a group of its own
    assert group.write("e", write) == "id-e" and write.calls[-1] == ["e"]


def test_a_group_refused_for_one_message_is_written_again_one_by_one():
    group, write = WriteGroup(writers=1), Recorder(hold=True)
    results = _in_threads(group, write, "a", ["b", "bad", "c"], write)
    assert sorted(write.calls[1]) == ["b", "bad", "c"]
    assert sorted(map(tuple, write.calls[2:])) == [("b",), ("bad",), ("c",)]
    assert results["b"] == "id-b" and results["c"] == "id-c"
    assert isinstance(results["bad"], DataError)


def test_any_other_failure_fails_the_group_and_writes_nothing_again():
    """The server may have committed before the connection was lost: writing each again
    could store a message twice, so every request of the group fails (503, retried by
    its sender as it would be alone)."""
    group, write = WriteGroup(writers=1), Recorder(hold=True, failure=ConnectionError)
    results = _in_threads(group, write, "a", ["b", "bad", "c"], write)
    assert len(write.calls) == 2  # no write again
    assert results["a"] == "id-a"
    for item in ("b", "bad", "c"):
        assert isinstance(results[item], RuntimeError), results[item]
        assert isinstance(results[item].__cause__, ConnectionError)


def test_two_writers_at_once_and_an_entry_waits_for_the_writer_that_took_it():
    """Two writes go at once (two statements in flight, as without groups); more wait
    and go together. A waiting request whose entry one writer took is not made a writer
    when the other writer ends: it waits for its own result."""
    group = WriteGroup(writers=2)
    entered = {k: threading.Event() for k in "abc"}
    release = {k: threading.Event() for k in "abc"}
    calls: list[list[str]] = []

    def write(items):
        calls.append(sorted(items))
        for item in items:
            if item in release:
                entered[item].set()
                assert release[item].wait(10)
        return [f"id-{item}" for item in items]

    results: dict[str, object] = {}

    def one(item):
        results[item] = group.write(item, write)

    with ThreadPoolExecutor(5) as pool:
        pool.submit(one, "a")
        assert entered["a"].wait(10)
        pool.submit(one, "b")
        assert entered["b"].wait(10)
        for item in ("c", "d", "e"):
            pool.submit(one, item)
        _waiting(group, 3)
        release["a"].set()  # a ends; c, d and e go together, held by c
        assert entered["c"].wait(10)
        release["b"].set()  # b ends while d and e are still being written
        time.sleep(0.05)
        assert "d" not in results and "e" not in results
        release["c"].set()
    assert calls == [["a"], ["b"], ["c", "d", "e"]]
    assert results == {item: f"id-{item}" for item in "abcde"}


def test_a_writer_stopped_midway_fails_its_group_and_the_next_write_goes_on():
    group = WriteGroup()

    def stopped(items):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        group.write("a", stopped)
    assert group.write("b", Recorder()) == "id-b"


# --- with the database -----------------------------------------------------------------

def _new(hub, name: str, **more) -> NewMessage:
    stored = hub.store.put(name.encode() * 10)
    return NewMessage("inbox", "acme", "mycompany", {"unpacked": (stored.digest, stored.size)},
                      original_filename=name, **more)


def test_a_group_of_real_intakes_one_statement_each_its_own_message(hub, session, app,
                                                                    wakeups):
    """Four intakes wait while a write is in flight, then go in one group: messages with
    their own files and deliveries, a wake-up for the target. On PostgreSQL one of them
    is refused by the database (a file name past its column's 255 characters): it fails
    alone and the others are written (SQLite does not hold text to its length)."""
    standard_hub(hub, targets=("writer",))
    hub.route("inbox", "*", "*", "writer")
    session.commit()
    news = {name: _new(hub, name) for name in ("one.xml", "two.xml", "three.xml")}
    news["bad.xml"] = _new(hub, "bad.xml")
    news["bad.xml"].original_filename = "x" * 300
    blocker = Recorder(hold=True)
    results: dict[str, object] = {}

    def intake(name: str) -> None:
        with app.app_context():
            own = new_session()
            try:
                known = read_settings(own, INTAKE_KEYS)
                own.commit()
                results[name] = store_and_dispatch_grouped(own, news[name], utcnow(), known)
            except Exception as exc:
                results[name] = exc
            finally:
                own.close()

    group, other = intakes(), Recorder(hold=True)
    with ThreadPoolExecutor(6) as pool:
        for held in (blocker, other):  # the process's writers all busy
            pool.submit(group.write, "held", held)
            assert held.entered.wait(10)
        for name in news:
            pool.submit(intake, name)
        _waiting(group, len(news))
        blocker.release.set()
        other.release.set()

    if IS_POSTGRES:
        assert isinstance(results.pop("bad.xml"), DataError)
    else:
        assert isinstance(results["bad.xml"], int)
    session.expire_all()
    rows = {m.id: m for m in session.scalars(select(Message))}
    assert sorted(rows) == sorted(results.values())  # the bad one stored nothing
    for name, message_id in results.items():
        assert rows[message_id].original_filename == news[name].original_filename
        [digest] = session.scalars(select(Payload.digest).where(
            Payload.message_id == message_id)).all()
        assert digest == news[name].stages["unpacked"][0]
        assert session.scalar(select(Delivery.target).where(
            Delivery.message_id == message_id)) == "writer"
    delivery_ids = set(session.scalars(select(Delivery.id)))
    assert {d for d, target in wakeups if target == "writer"} <= delivery_ids
    assert any(target == "writer" for _d, target in wakeups)


def test_concurrent_intakes_each_answered_with_their_own_message(served, hub, session,
                                                                 registry):
    """24 senders at once at a threaded server: each answer names the message holding
    the body that request sent (on PostgreSQL the intakes go in groups)."""
    registry.register(HttpReceiver)
    registry.register(HttpPoster)
    tokens = set_up_receivers(hub, session, "http://127.0.0.1:9/in", timeout=2,
                              base_delay=3)
    bodies = [f"<order n='{i}'/>".encode() * 20 for i in range(24)]

    def post(body: bytes):
        return requests.post(f"{served}/in/inbox", data=body, headers=auth(tokens["inbox"]),
                             timeout=30)

    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(post, bodies))
    assert [a.status_code for a in answers] == [202] * 24, [a.text for a in answers]
    ids = [a.json()["message_id"] for a in answers]
    assert len(set(ids)) == 24
    session.expire_all()
    digests = dict(session.execute(select(Payload.message_id, Payload.digest)).all())
    assert [digests[i] for i in ids] == [hashlib.sha256(b).hexdigest() for b in bodies]
    assert session.scalar(select(Message.id).where(Message.id.not_in(ids))) is None


def test_a_group_that_is_more_than_one_statement_is_one_transaction(hub, session, app,
                                                                    monkeypatch):
    """Each request checked that its message is one statement, with the routes as it
    read them; with the routes as the writer read them one may not be routed (a route
    removed in between), which takes statements of its own: the group then goes in a
    transaction, so a failure midway leaves nothing half-written (in autocommit the
    message would stay, Received, without its status and alert)."""
    standard_hub(hub, targets=("writer",))
    session.commit()  # no route: the message is not routed
    new = _new(hub, "lost.xml")
    own = new_session()
    try:
        known = read_settings(own, INTAKE_KEYS)
        own.commit()
        if IS_POSTGRES:  # as the receiver runs a lone intake (_statement_at_a_time)
            own.connection(execution_options={"isolation_level": "AUTOCOMMIT"})

        def failing(*args, **kwargs):
            raise RuntimeError("the alert could not be written")

        monkeypatch.setattr("b2bhub.engine.status.raise_alert", failing)
        with pytest.raises(RuntimeError):
            store_and_dispatch_grouped(own, new, utcnow(), known)
    finally:
        own.close()
    session.expire_all()
    assert session.scalars(select(Message)).all() == []
