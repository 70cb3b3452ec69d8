"""The file writer's filename pattern: every rule and example of the seed's "Filename
pattern" section, refusals at save time, and hostile values that must stay one name
below the base directory."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b2bhub.domain import filename_pattern as fp
from b2bhub.domain.filename_pattern import PatternError, parse, safe_value

CREATED = datetime(2024, 1, 31, 23, 5, 9)  # naive UTC, as the database holds it


def values(original_filename="order1.xml", **overrides):
    """The placeholder values of a message from acme to mycompany."""
    base = fp.placeholder_values(
        message_id=42, delivery_id=7, from_party="acme", to_party="mycompany",
        source="inbox", target="writer", original_filename=original_filename,
        external_id="<as2-1@acme>", correlation_id="po-77", created_at=CREATED, attempt=2)
    return {**base, **overrides}


RENDERED = [
    # {a|b} takes the first alternative that has a value
    ("{original_filename|message_id}", {}, "order1.xml"),
    ("{original_filename|message_id}", {"original_filename": None}, "42"),
    ("{original_filename|message_id}", {"original_filename": ""}, "42"),
    ("{external_id|correlation_id|message_id}", {"external_id": None}, "po-77"),
    # a / in the pattern makes a subdirectory
    ("{to}/{original_filename}", {}, "mycompany/order1.xml"),
    ("out/{from}/{to}/{date}/{original_filename}", {}, "out/acme/mycompany/20240131/order1.xml"),
    # only {original_extension} may be empty
    ("{original_basename}.{original_extension}", {}, "order1.xml"),
    ("{message_id}{original_extension}", {"original_filename": "README"}, "42"),
    ("{original_basename}_{attempt}.{original_extension}", {"original_filename": "a.tar.gz"},
     "a.tar_2.gz"),
    ("{original_basename}", {"original_filename": ".profile"}, ".profile"),
    # every other placeholder
    ("{message_id}-{delivery_id}-{source}-{target}", {}, "42-7-inbox-writer"),
    ("{date}_{time}", {}, "20240131_230509"),
    ("{timestamp}", {}, "20240131T230509"),
    ("{correlation_id}", {}, "po-77"),
    ("{ to | message_id }.dat", {"to": None}, "42.dat"),  # spaces around names are fine
    # a value's separators and ':' never add a directory
    ("{external_id}", {}, "_as2-1@acme_"),
    ("{to}/{original_filename}", {"original_filename": "../../etc/passwd"},
     "mycompany/.._.._etc_passwd"),
]


@pytest.mark.parametrize(("pattern", "changes", "expected"), RENDERED)
def test_render(pattern, changes, expected):
    assert parse(pattern).render(values(**changes)) == expected


def test_dates_are_utc_whatever_zone_the_creation_time_has():
    plus_two = timezone(timedelta(hours=2))
    created = datetime(2024, 2, 1, 1, 5, 9, tzinfo=plus_two)  # 2024-01-31 23:05:09 UTC
    out = parse("{date}/{time}/{timestamp}").render(values(**fp.placeholder_values(
        message_id=1, delivery_id=1, from_party="a", to_party="b", source="s",
        target="t", original_filename=None, external_id=None, correlation_id=None,
        created_at=created, attempt=1)))
    assert out == "20240131/230509/20240131T230509"
    assert created.astimezone(UTC).hour == 23


NO_VALUE = [
    # a placeholder without a value fails rather than giving report_.dat
    ("report_{external_id}.dat", {"external_id": None}, "{external_id}"),
    ("report_{external_id}.dat", {"external_id": ""}, "{external_id}"),
    ("{original_filename}", {"original_filename": None}, "{original_filename}"),
    ("{original_basename}", {"original_filename": None}, "{original_basename}"),
    ("{external_id|correlation_id}", {"external_id": None, "correlation_id": None},
     "{external_id|correlation_id}"),
    # {original_extension} may be empty, but not be the whole name
    ("{original_extension}", {"original_filename": "README"}, "''"),
    ("{original_extension}/x", {"original_filename": "README"}, "''"),
    (".{original_extension}", {"original_filename": "README"}, "'.'"),
]


@pytest.mark.parametrize(("pattern", "changes", "named"), NO_VALUE)
def test_a_missing_value_fails_the_render_naming_it(pattern, changes, named):
    with pytest.raises(PatternError) as caught:
        parse(pattern).render(values(**changes))
    assert named in str(caught.value)


def test_a_name_longer_than_file_systems_take_fails_the_render():
    with pytest.raises(PatternError, match="longer than 255 bytes"):
        parse("{original_filename}").render(values(original_filename="é" * 128))
    assert parse("{original_filename}").render(values(original_filename="é" * 127))


REFUSED = [
    ("", "empty"),
    ("/srv/out/{message_id}", "absolute"),
    ("//{message_id}", "absolute"),
    ("out//{message_id}", "empty element"),
    ("out/{message_id}/", "empty element"),
    ("../{message_id}", "'..' element"),
    ("out/../{message_id}", "'..' element"),
    ("./{message_id}", "'.' element"),
    ("out/./{message_id}", "'.' element"),
    ("{nope}", "unknown placeholder {nope}"),
    ("{original_filename|filename}", "unknown placeholder {filename}"),
    ("{To}", "unknown placeholder {To}"),
    ("{}", "empty placeholder"),
    ("{to|}", "empty placeholder"),
    ("x{message_id", "unmatched '{'"),
    ("x{message_id/y}", "unmatched '{'"),
    ("x}y", "unmatched '}'"),
    ("{{message_id}}", "unmatched '{'"),
    ("out\\{message_id}", "'\\\\'"),
    ("C:/out/{message_id}", "':'"),
    ("a|b", "'|'"),
    ("a*.xml", "'*'"),
    ("a?.xml", "'?'"),
    ("a<b>", "'<'"),
    ('a"b', "'\"'"),
    ("a\x00b", "'\\x00'"),
    ("a\nb", "'\\n'"),
    ("a\x7fb", "'\\x7f'"),
    ("x" * 256, "longer than 255 bytes"),
]


@pytest.mark.parametrize(("pattern", "reason"), REFUSED)
def test_refused_at_parse_time(pattern, reason):
    with pytest.raises(PatternError) as caught:
        parse(pattern)
    assert reason in str(caught.value)


def test_every_placeholder_is_known_documented_and_given_a_value():
    doc = fp.__doc__
    assert all(f"``{name}``" in doc for name in fp.PLACEHOLDERS)
    assert set(values()) == set(fp.PLACEHOLDERS)
    every = "_".join("{" + name + "}" for name in fp.PLACEHOLDERS)
    assert parse(every).placeholders == frozenset(fp.PLACEHOLDERS)


SAFE = [
    ("order1.xml", "order1.xml"),
    ("a/b", "a_b"),
    ("a\\b", "a_b"),
    ("C:\\temp\\x", "C__temp_x"),
    ("12:30", "12_30"),
    ("/", "_"),
    (".", "_"),
    ("..", "__"),
    ("...", "___"),
    ("..a", "..a"),
    (".hidden", ".hidden"),
    ("a\x00b", "a_b"),
    ("line\r\nbreak", "line__break"),
    ("\x1b[31mred", "_[31mred"),
    ("tab\there", "tab_here"),
    ("del\x7f", "del_"),
    ("c1\x85", "c1_"),
    ('<>"|?*', "______"),
    ("bad\udcffbyte", "bad_byte"),
    ("Bestellung-ä€.xml", "Bestellung-ä€.xml"),
]


@pytest.mark.parametrize(("value", "expected"), SAFE)
def test_safe_value(value, expected):
    assert safe_value(value) == expected


HOSTILE = ["../../../etc/passwd", "..", ".", "/", "/etc/passwd", "a/../../b", "..\\..\\x",
           "C:\\Windows\\x", "c:", "\x00", "\n..", "../\x00/..", "....//....//",
           "\\\\server\\share\\x"]


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("placeholder", ["to", "from", "original_filename", "external_id",
                                         "correlation_id", "original_basename"])
def test_hostile_values_stay_one_name_below_the_base_directory(tmp_path, hostile,
                                                                placeholder):
    pattern = parse("in/{" + placeholder + "}/{message_id}.dat")
    relative = pattern.render(values(**{placeholder: hostile}))
    _assert_below(tmp_path, relative, elements=3)


@given(st.text(min_size=1, max_size=80))
def test_any_value_is_one_clean_element(text):
    relative = parse("{to}/{original_filename}").render(values(original_filename=text))
    head, name = relative.split("/")
    assert head == "mycompany"
    assert name not in ("", ".", "..")
    assert not any(ch in name for ch in '/\\:<>"|?*')
    assert all(ord(ch) >= 32 and not 0x7f <= ord(ch) <= 0x9f for ch in name)
    base = "/srv/base"
    assert os.path.normpath(os.path.join(base, relative)).startswith(base + "/mycompany/")


def _assert_below(base, relative: str, elements: int) -> None:
    parts = relative.split("/")
    assert len(parts) == elements
    assert not any(p in ("", ".", "..") for p in parts)
    real = os.path.realpath(os.path.join(base, relative))
    assert os.path.commonpath([os.path.realpath(base), real]) == os.path.realpath(base)
