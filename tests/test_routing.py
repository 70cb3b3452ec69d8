"""Routes: matching, fan-out, the route tester, redundancy and the name rule."""

from __future__ import annotations

import pytest

from b2bhub.domain.routing import (
    NAME_RE,
    Route,
    RouteMatch,
    RouteTable,
    redundant_with,
    type_names,
    validate_document_type,
    validate_name,
)


def r(id, source, from_party, to_party, target, document_type="*"):
    return Route(id, source, from_party, to_party, target, document_type)


def test_wildcards_match_any_party():
    route = r(1, "inbox", "*", "acme", "out")
    assert route.matches("inbox", "hq", "acme")
    assert route.matches("inbox", "anyone", "acme")
    assert not route.matches("inbox", "hq", "globex")
    assert not route.matches("other", "hq", "acme")


def test_source_is_never_a_wildcard():
    assert not r(1, "*", "*", "*", "out").matches("inbox", "hq", "acme")


def test_describe():
    assert r(3, "poller_inbox", "*", "acme", "writer_main").describe() == (
        "route 3: poller_inbox, * -> acme, writer_main")
    assert r(None, "a", "b", "c", "d").describe() == "new route: a, b -> c, d"


def test_fan_out_to_two_targets():
    table = RouteTable([r(1, "inbox", "*", "*", "writer_b"), r(2, "inbox", "hq", "*", "as2_a")])
    assert table.targets("inbox", "hq", "acme") == ["as2_a", "writer_b"]


def test_overlapping_routes_to_one_target_make_one_match_listing_both():
    first, second = r(1, "inbox", "hq", "*", "out"), r(2, "inbox", "*", "acme", "out")
    table = RouteTable([first, second, r(3, "inbox", "*", "*", "elsewhere")])
    assert table.match("inbox", "hq", "acme") == [
        RouteMatch("elsewhere", (table.routes[2],)),
        RouteMatch("out", (first, second)),
    ]
    assert table.targets("inbox", "hq", "acme") == ["elsewhere", "out"]


def test_no_route_means_no_target():
    table = RouteTable([r(1, "inbox", "hq", "*", "out")])
    assert table.match("inbox", "acme", "hq") == []
    assert RouteTable([]).targets("inbox", "hq", "acme") == []


def test_explain_gives_a_reason_per_route():
    table = RouteTable([
        r(1, "inbox", "acme", "*", "out"),
        r(2, "inbox", "*", "*", "out"),
        r(3, "other", "acme", "hq", "out2"),
    ])
    assert table.explain("inbox", "hq", "globex") == [
        {"route": 1, "target": "out", "document_type": "*", "matched": False,
         "reason": "from 'hq' does not match 'acme'"},
        {"route": 2, "target": "out", "document_type": "*", "matched": True,
         "reason": "matches"},
        {"route": 3, "target": "out2", "document_type": "*", "matched": False,
         "reason": "source 'inbox' does not match 'other'; from 'hq' does not match 'acme'; "
                   "to 'globex' does not match 'hq'"},
    ]


# --- redundancy --------------------------------------------------------------------------

def test_exact_duplicate_is_redundant():
    existing = r(1, "inbox", "hq", "acme", "out")
    assert redundant_with(r(None, "inbox", "hq", "acme", "out"), [existing]) is existing


def test_new_route_covered_by_existing_is_redundant():
    existing = r(1, "inbox", "*", "acme", "out")
    assert redundant_with(r(None, "inbox", "hq", "acme", "out"), [existing]) is existing


def test_new_route_covering_existing_is_redundant():
    existing = r(1, "inbox", "hq", "acme", "out")
    assert redundant_with(r(None, "inbox", "*", "*", "out"), [existing]) is existing


@pytest.mark.parametrize("other", [
    r(1, "inbox", "*", "acme", "other_target"),   # different target
    r(1, "poller2", "*", "acme", "out"),          # different source
    r(1, "inbox", "*", "acme", "out"),            # neither covers mycompany -> *
    r(1, "inbox", "hq", "globex", "out"),         # disjoint parties
])
def test_not_redundant(other):
    assert redundant_with(r(None, "inbox", "mycompany", "*", "out"), [other]) is None


def test_neither_covers_the_other():
    a, b = r(1, "inbox", "mycompany", "*", "out"), r(2, "inbox", "*", "acme", "out")
    assert not a.covers(b)
    assert not b.covers(a)


def test_an_edited_route_is_not_redundant_with_itself():
    saved = r(4, "inbox", "hq", "acme", "out")
    assert redundant_with(r(4, "inbox", "hq", "*", "out"), [saved]) is None
    assert redundant_with(r(5, "inbox", "hq", "*", "out"), [saved]) is saved


def test_redundant_with_names_the_first_route_in_the_way():
    routes = [r(1, "inbox", "a", "b", "x"), r(2, "inbox", "*", "b", "out"),
              r(3, "inbox", "*", "*", "out")]
    assert redundant_with(r(None, "inbox", "hq", "b", "out"), routes) is routes[1]


# --- names -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a", "acme", "writer_main", "as2-out", "0", "a" * 64])
def test_valid_names(name):
    assert validate_name(name) is None
    assert NAME_RE.fullmatch(name)


@pytest.mark.parametrize("name", ["", "a" * 65, "Acme", "ACME", "*", "a b", "a.b", "acme\n",
                                  "é", "a/b"])
def test_invalid_names(name):
    message = validate_name(name)
    assert message and "1-64" in message


# --- document types (docs/edi.md "Routing by document type") ----------------------------

def test_a_route_naming_a_type_takes_messages_whose_envelope_holds_it():
    table = RouteTable([r(1, "inbox", "*", "*", "erp", "850"),
                        r(2, "inbox", "*", "*", "archive")])
    assert table.targets("inbox", "acme", "hq", ["850"]) == ["archive", "erp"]
    assert table.targets("inbox", "acme", "hq", ["997"]) == ["archive"]
    assert table.targets("inbox", "acme", "hq", []) == ["archive"]  # no envelope
    assert table.targets("inbox", "acme", "hq") == ["archive"]


def test_an_edifact_type_matches_by_its_first_component():
    table = RouteTable([r(1, "inbox", "*", "*", "erp", "ORDERS")])
    assert table.targets("inbox", "acme", "hq", ["ORDERS:D:96A:UN"]) == ["erp"]
    assert table.targets("inbox", "acme", "hq", ["INVOIC:D:96A:UN"]) == []
    assert type_names(["ORDERS:D:96A", "850", ""]) == {"ORDERS", "850"}


def test_an_interchange_of_several_types_takes_every_route_naming_one_of_them():
    table = RouteTable([r(1, "inbox", "*", "*", "erp", "850"),
                        r(2, "inbox", "*", "*", "billing", "810"),
                        r(3, "inbox", "*", "*", "acks", "997")])
    assert table.targets("inbox", "acme", "hq", ["850", "810", "850"]) == [
        "billing", "erp"]


def test_the_tester_says_why_a_type_did_not_match():
    table = RouteTable([r(1, "inbox", "*", "*", "erp", "850")])
    [missed] = table.explain("inbox", "acme", "hq", ["997", "ORDERS:D:96A"])
    assert missed == {"route": 1, "target": "erp", "document_type": "850", "matched": False,
                      "reason": "document type '850' is not among the message's types "
                                "(997, ORDERS)"}
    [bare] = table.explain("inbox", "acme", "hq")
    assert bare["reason"] == "document type '850' wanted, and the message has no envelope"
    [hit] = table.explain("inbox", "acme", "hq", ["850"])
    assert (hit["matched"], hit["reason"]) == (True, "matches")


def test_routes_of_different_types_to_one_target_are_not_redundant():
    po = r(1, "inbox", "*", "*", "erp", "850")
    assert redundant_with(r(None, "inbox", "*", "*", "erp", "810"), [po]) is None
    assert redundant_with(r(None, "inbox", "acme", "*", "erp", "850"), [po]) is po
    assert redundant_with(r(None, "inbox", "*", "*", "erp"), [po]) is po  # * covers 850
    assert r(2, "inbox", "*", "*", "erp").covers(po) and not po.covers(r(2, "inbox", "*",
                                                                         "*", "erp"))


def test_a_route_naming_a_type_describes_it():
    assert r(4, "inbox", "*", "acme", "erp", "850").describe() == \
        "route 4: inbox, * -> acme, 850, erp"
    assert r(5, "inbox", "*", "acme", "erp").describe() == "route 5: inbox, * -> acme, erp"


@pytest.mark.parametrize("value", ["*", "850", "997", "ORDERS", "INVOIC", "A" * 35])
def test_valid_document_types(value):
    assert validate_document_type(value) is None


@pytest.mark.parametrize("value", ["", "orders", "ORDERS:D:96A", "8 50", "A" * 36, "**",
                                   "850\n", None, 850])
def test_invalid_document_types(value):
    assert "document type" in validate_document_type(value)
