"""Every rule and example of seed 002 "Path pattern", as a table; no filesystem."""

from __future__ import annotations

import pytest

from b2bhub.domain.path_pattern import Match, PatternError, parse

# pattern, fixed from, fixed to, relative path, expected match (None: not described)
MATCHES = [
    # the seed's three examples
    ("{to}/{filename}", False, False, "acme/order1.xml", Match(None, "acme", "order1.xml")),
    ("outbox/{from}/{to}/{filename}", False, False, "outbox/hq/acme/order1.xml",
     Match("hq", "acme", "order1.xml")),
    ("{filename}", True, True, "order1.xml", Match(None, None, "order1.xml")),
    # the scan goes exactly as deep as the pattern
    ("{to}/{filename}", False, False, "order1.xml", None),
    ("{to}/{filename}", False, False, "acme/sub/order1.xml", None),
    ("{filename}", False, True, "acme/order1.xml", None),
    # literal elements must be equal, case included
    ("outbox/{to}/{filename}", False, False, "inbox/acme/order1.xml", None),
    ("outbox/{to}/{filename}", False, False, "Outbox/acme/order1.xml", None),
    ("in/{to}/order.xml", False, False, "in/acme/order.xml", Match(None, "acme", "order.xml")),
    ("in/{to}/order.xml", False, False, "in/acme/other.xml", None),
    # from fixed, captured, or neither
    ("{from}/{filename}", False, True, "hq/a.xml", Match("hq", None, "a.xml")),
    ("{to}/{filename}", True, False, "acme/a.xml", Match(None, "acme", "a.xml")),
    # six elements is the most
    ("a/b/c/{from}/{to}/{filename}", False, False, "a/b/c/hq/acme/x",
     Match("hq", "acme", "x")),
]


@pytest.mark.parametrize("text,fixed_from,fixed_to,relative,expected", MATCHES)
def test_match(text, fixed_from, fixed_to, relative, expected):
    pattern = parse(text, fixed_from=fixed_from, fixed_to=fixed_to)
    assert pattern.match(relative.split("/")) == expected


# pattern, fixed from, fixed to, words the refusal must hold
REFUSALS = [
    ("/{to}/{filename}", False, False, "absolute"),
    ("/srv/in/{filename}", False, True, "absolute"),
    ("../{to}/{filename}", False, False, ".."),
    ("in/../{to}/{filename}", False, False, ".."),
    ("./{to}/{filename}", False, False, "."),
    ("in//{to}/{filename}", False, False, "empty element"),
    ("{to}/{filename}/", False, False, "empty element"),
    ("", False, True, "empty"),
    ("order_{to}/{filename}", False, False, "whole path element"),
    ("{to}/{filename}.xml", False, False, "whole path element"),
    ("{to}x/{filename}", False, False, "whole path element"),
    ("{to/{filename}", False, False, "whole path element"),
    ("{sender}/{filename}", False, True, "unknown placeholder"),
    ("{}/{filename}", False, True, "unknown placeholder"),
    ("a/b/c/d/e/f/{filename}", False, True, "at most 6"),
    ("unroutable/{to}/{filename}", False, False, "unroutable"),
    ("Unroutable/{to}/{filename}", False, False, "unroutable"),
    ("unroutable", False, True, "unroutable"),
    ("{to}/{to}/{filename}", False, False, "more than once"),
    ("{filename}/{to}", False, False, "last element"),
    ("{filename}/{filename}", False, True, "more than once"),
    ("{to}", False, False, "last element"),
    ("{to}/{from}", False, False, "last element"),
    # to is fixed on the poller or captured, never both, never neither
    ("{to}/{filename}", False, True, "keep one"),
    ("{filename}", False, False, "neither"),
    ("{from}/{filename}", False, False, "neither"),
    ("{from}/{to}/{filename}", True, False, "keep one"),
    ("in\\{to}\\{filename}", False, False, "backslash"),
    ("in/\x07/{filename}", False, True, "control character"),
]


@pytest.mark.parametrize("text,fixed_from,fixed_to,words", REFUSALS)
def test_refusal(text, fixed_from, fixed_to, words):
    with pytest.raises(PatternError) as refused:
        parse(text, fixed_from=fixed_from, fixed_to=fixed_to)
    assert words in str(refused.value)


def test_starting_with_unroutable_means_the_folder_not_a_longer_name():
    assert parse("unroutable_in/{to}/{filename}").match(["unroutable_in", "acme", "x"]) == (
        Match(None, "acme", "x"))


# hostile names as elements of a relative path: each is either captured as text (only
# ever compared with party names) or not a place the pattern describes
HOSTILE = [
    (["..", "x.xml"], None),
    ([".", "x.xml"], None),
    (["", "x.xml"], None),
    (["a/b", "x.xml"], None),
    (["/etc", "x.xml"], None),
    (["acme\0", "x.xml"], None),
    (["acme", "../../etc/passwd"], None),
    (["acme", ".."], None),
    (["c:", "x.xml"], Match(None, "c:", "x.xml")),
    (["..\\..\\x", "x.xml"], Match(None, "..\\..\\x", "x.xml")),
    (["ac\nme", "x\r\x1b.xml"], Match(None, "ac\nme", "x\r\x1b.xml")),
    (["acme", "\udcff\udcfe"], Match(None, "acme", "\udcff\udcfe")),
]


@pytest.mark.parametrize("parts,expected", HOSTILE)
def test_hostile_names(parts, expected):
    assert parse("{to}/{filename}").match(parts) == expected


def test_depth_is_the_number_of_elements():
    assert parse("outbox/{from}/{to}/{filename}").depth == 4
    assert parse("{filename}", fixed_to=True).depth == 1
