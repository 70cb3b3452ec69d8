"""Routes (SPEC 4): redundancy, validation, the route tester, and a saved route applying
to the next dispatch in this process and in any other."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.engine.dispatch import RouteCache
from b2bhub.models import Route
from b2bhub.services import config as svc
from b2bhub.services.errors import Conflict, ServiceError
from tests.enginekit import T0, as_process, deliveries, standard_hub


def _route_count(session) -> int:
    return session.scalar(select(func.count()).select_from(Route))


@pytest.mark.parametrize("first, second", [
    (("*", "*"), ("acme", "*")),  # the new route is covered by the one there
    (("acme", "*"), ("*", "*")),  # the new route covers the one there
    (("acme", "mycompany"), ("acme", "mycompany")),  # an exact duplicate
])
def test_a_redundant_route_is_refused_naming_the_route_in_the_way(hub, session, registry,
                                                                  first, second):
    standard_hub(hub)
    there = hub.route("inbox", *first, "writer_a")

    with pytest.raises(Conflict) as refused:
        svc.create_route(session, registry, "inbox", *second, "writer_a")

    expected = f"route {there.id}: inbox, {first[0]} -> {first[1]}, writer_a"
    assert refused.value.code == "redundant_route"
    assert refused.value.message == f"redundant with {expected}"
    assert refused.value.details == {"route": there.id}
    session.rollback()
    assert _route_count(session) == 1


def test_the_same_match_to_another_target_is_not_redundant(hub, session):
    standard_hub(hub, targets=("writer_a", "writer_b"))
    hub.route("inbox", "*", "*", "writer_a")
    hub.route("inbox", "*", "*", "writer_b")
    assert _route_count(session) == 2


def _bad_route(hub, registry, session, **changes):
    route = {"source": "inbox", "from_party": "acme", "to_party": "*", "target": "writer_a",
             **changes}
    with pytest.raises(ServiceError) as refused:
        svc.create_route(session, registry, **route)
    session.rollback()
    return refused.value


@pytest.mark.parametrize("changes, message", [
    ({"source": "nowhere"}, "source: no plugin instance named 'nowhere'"),
    ({"target": "nowhere"}, "target: no plugin instance named 'nowhere'"),
    ({"target": "switched_off"}, "target: instance 'switched_off' is disabled"),
    ({"source": "writer_a"}, "source: instance 'writer_a' (noop) cannot start a route"),
    ({"target": "inbox"}, "target: instance 'inbox' (manual_source) cannot end a route"),
    ({"from_party": "initech"}, "from: no party named 'initech'"),
    ({"to_party": "initech"}, "to: no party named 'initech'"),
])
def test_route_validation_errors_say_what_is_wrong(hub, session, registry, changes, message):
    standard_hub(hub)
    hub.instance("switched_off", "noop", enabled=False)

    error = _bad_route(hub, registry, session, **changes)

    assert error.message == message
    assert not isinstance(error, Conflict)
    assert _route_count(session) == 0


def test_an_unknown_party_is_named_in_the_details(hub, session, registry):
    standard_hub(hub)
    error = _bad_route(hub, registry, session, from_party="initech")
    assert error.details == {"from": "unknown party"}


def test_the_route_tester_says_which_targets_and_why(hub, session):
    standard_hub(hub, targets=("writer_a", "writer_b", "writer_c"))
    everything = hub.route("inbox", "*", "*", "writer_a")
    from_acme = hub.route("inbox", "acme", "*", "writer_b")
    from_globex = hub.route("inbox", "globex", "*", "writer_c")

    result = svc.test_route(session, "inbox", "acme", "mycompany")

    assert result["targets"] == ["writer_a", "writer_b"]
    assert result["routes"] == [
        {"route": everything.id, "target": "writer_a", "document_type": "*",
         "matched": True, "reason": "matches"},
        {"route": from_acme.id, "target": "writer_b", "document_type": "*",
         "matched": True, "reason": "matches"},
        {"route": from_globex.id, "target": "writer_c", "document_type": "*",
         "matched": False, "reason": "from 'acme' does not match 'globex'"},
    ]
    other_source = svc.test_route(session, "elsewhere", "acme", "mycompany")
    assert other_source["targets"] == []
    assert other_source["routes"][0]["reason"] == "source 'elsewhere' does not match 'inbox'"


def test_a_route_saved_after_a_dispatch_applies_to_the_next_dispatch(hub, session):
    standard_hub(hub, targets=("writer_a", "writer_b"))
    hub.route("inbox", "*", "*", "writer_a")
    first = hub.message(now=T0)
    assert [d.target for d in deliveries(session, first.id)] == ["writer_a"]

    hub.route("inbox", "acme", "*", "writer_b")
    second = hub.message(now=T0)

    assert [d.target for d in deliveries(session, second.id)] == ["writer_a", "writer_b"]
    assert [d.target for d in deliveries(session, first.id)] == ["writer_a"]


def test_another_process_sees_a_saved_route_at_its_next_dispatch(hub, session, monkeypatch):
    """Process B's route cache is never told anything: the routes version it reads at
    dispatch is all it has, and it is enough."""
    standard_hub(hub, targets=("writer_a", "writer_b"))
    hub.route("inbox", "*", "*", "writer_a")
    other = RouteCache()
    with as_process(monkeypatch, other):
        first = hub.message(now=T0)  # loads B's cache
    assert [d.target for d in deliveries(session, first.id)] == ["writer_a"]

    hub.route("inbox", "acme", "*", "writer_b")  # saved by this process (A)

    with as_process(monkeypatch, other):
        second = hub.message(now=T0)
    assert [d.target for d in deliveries(session, second.id)] == ["writer_a", "writer_b"]


def test_a_deleted_route_stops_applying_in_another_process(hub, session, monkeypatch):
    standard_hub(hub, targets=("writer_a", "writer_b"))
    hub.route("inbox", "*", "*", "writer_a")
    gone = hub.route("inbox", "*", "*", "writer_b")
    other = RouteCache()
    with as_process(monkeypatch, other):
        first = hub.message(now=T0)
    assert len(deliveries(session, first.id)) == 2

    svc.delete_route(session, gone.id)
    session.commit()

    with as_process(monkeypatch, other):
        second = hub.message(now=T0)
    assert [d.target for d in deliveries(session, second.id)] == ["writer_a"]


def test_routes_of_a_rolled_back_save_never_reach_a_dispatch(hub, session, registry,
                                                            monkeypatch):
    """A save that reads the route table after adding a route (a fixture file's second
    route, say) and then rolls back must not leave that route in this process's cache,
    even once another process has committed a route change of its own."""
    standard_hub(hub, targets=("writer_a", "writer_b"))
    this, other = RouteCache(), RouteCache()
    with as_process(monkeypatch, this):
        svc.create_route(session, registry, "inbox", "*", "*", "writer_a")
        with pytest.raises(Conflict):
            svc.create_route(session, registry, "inbox", "acme", "*", "writer_a")
        session.rollback()

    with as_process(monkeypatch, other), Session(db.engine) as elsewhere:
        svc.create_route(elsewhere, registry, "inbox", "*", "*", "writer_b")
        elsewhere.commit()

    with as_process(monkeypatch, this):
        sent = hub.message(now=T0)
    assert [d.target for d in deliveries(session, sent.id)] == ["writer_b"]
