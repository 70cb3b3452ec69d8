"""The file writer's filename pattern: parsed when saved, rendered for each message.

A pattern is literal text with placeholders, e.g. ``{to}/{original_filename|message_id}``:

* ``{name}`` is replaced by a value of the message; ``{a|b}`` takes the first
  alternative that has a value (``{original_filename|message_id}`` uses the original
  file name and falls back to the message ID).
* A placeholder without a value fails the render (:class:`PatternError` naming it)
  rather than producing a name like ``report_.dat``; only ``{original_extension}`` may
  be empty.
* ``/`` makes subdirectories. The pattern may not be absolute, hold an empty element,
  ``.`` or ``..``; its literal text may not hold ``\\``, control characters or
  characters file systems reject (``: < > " | ? *``).
* A value from a message never adds a directory: :func:`safe_value` turns separators
  (``/`` and ``\\``), ``:``, control characters and characters file systems reject into
  ``_``, and a value made only of dots (``.``, ``..``) into underscores. A rendered
  element that is empty, ``.`` or ``..`` (``{original_extension}`` alone, say) or
  longer than 255 bytes fails the render.
* An unknown placeholder is refused by :func:`parse`, i.e. when the configuration is
  saved.

Placeholders (:data:`PLACEHOLDERS`):

=====================  ============================================================
``message_id``         the message's id
``delivery_id``        the delivery's id
``from``, ``to``       the sending and receiving party names
``source``             the source instance the message came from
``target``             the target instance writing it
``original_filename``  the bare name of the file the message came from
``original_basename``  that name without its extension (``order1`` of ``order1.xml``)
``original_extension`` its extension without the dot (``xml``); may be empty
``external_id``        the id the message had outside (e.g. the AS2 Message-ID)
``correlation_id``     the message's correlation id
``date``               the message's creation date in UTC, ``YYYYMMDD``
``time``               its creation time in UTC, ``HHMMSS``
``timestamp``          both, ``YYYYMMDDTHHMMSS``
``attempt``            the delivery attempt number
=====================  ============================================================

Keeping the rendered path below the base directory on disk (symbolic links) is the
writer's part; this module guarantees a relative path of clean elements. Plain Python:
no Flask, no Celery, no SQLAlchemy.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from b2bhub.domain.i18n import N_

__all__ = ["PLACEHOLDERS", "FilenamePattern", "PatternError", "parse", "placeholder_values",
           "safe_value", "split_filename"]

PLACEHOLDERS: tuple[str, ...] = (
    "message_id", "delivery_id", "from", "to", "source", "target", "original_filename",
    "original_basename", "original_extension", "external_id", "correlation_id", "date",
    "time", "timestamp", "attempt",
)
#: the one placeholder that may render empty
MAY_BE_EMPTY = frozenset({"original_extension"})
#: the longest file name most file systems take, in bytes
MAX_ELEMENT_BYTES = 255

# Separators, ':', what Windows and SMB shares refuse, control characters (C0, DEL, C1)
# and lone surrogates (undecodable bytes); literal text may hold '/' (a subdirectory).
_UNSAFE = re.compile(r'[/\\:<>"|?*\x00-\x1f\x7f-\x9f\ud800-\udfff]')
_LITERAL_UNSAFE = re.compile(r'[\\:<>"|?*\x00-\x1f\x7f-\x9f\ud800-\udfff]')


class PatternError(ValueError):
    """A pattern that cannot be saved, or a name that cannot be made for a message."""


# A part of an element: literal text, or a placeholder's alternatives.
Part = str | tuple[str, ...]


@dataclass(frozen=True)
class FilenamePattern:
    """A parsed pattern: one tuple of parts per path element."""

    text: str
    elements: tuple[tuple[Part, ...], ...]

    @property
    def placeholders(self) -> frozenset[str]:
        """Every placeholder name the pattern uses."""
        return frozenset(name for element in self.elements for part in element
                         if isinstance(part, tuple) for name in part)

    def render(self, values: dict[str, Any]) -> str:
        """The relative path for a message's ``values`` (None or '' means no value).

        Raises :class:`PatternError` naming the placeholder without a value, or the
        element that came out empty, ``.``/``..`` or too long."""
        return "/".join(_render_element(element, values) for element in self.elements)


def parse(pattern: str) -> FilenamePattern:
    """Parse and check a pattern; :class:`PatternError` says what is wrong with it."""
    if not isinstance(pattern, str) or not pattern:
        raise PatternError(N_("the filename pattern is empty"))
    if pattern.startswith("/"):
        raise PatternError(N_("the filename pattern %(pattern)r is absolute; it must be "
                              "relative to the base directory", pattern=pattern))
    elements = tuple(_parse_element(text, pattern) for text in pattern.split("/"))
    return FilenamePattern(pattern, elements)


def problem(value: str) -> str | None:
    """What is wrong with a pattern (a configuration field's check), or None."""
    try:
        parse(value)
    except PatternError as exc:
        return exc.args[0]  # the Text: shown in the reader's language
    return None


def _parse_element(text: str, pattern: str) -> tuple[Part, ...]:
    """One element between slashes: literal runs and ``{a|b}`` placeholders."""
    if text == "":
        raise PatternError(N_("the filename pattern %(pattern)r holds an empty element "
                              "(two slashes together, or a slash at the end)",
                              pattern=pattern))
    if text in (".", ".."):
        raise PatternError(N_("the filename pattern %(pattern)r holds a %(text)r element",
                              pattern=pattern, text=text))
    parts: list[Part] = []
    for literal, group in re.findall(r"([^{}]*)(\{[^{}/]*\}|[{}]?)", text):
        if literal:
            parts.append(_check_literal(literal, pattern))
        if group in ("{", "}"):
            raise PatternError(N_("the filename pattern %(pattern)r has an unmatched "
                                  "%(group)r in %(text)r", pattern=pattern, group=group,
                                  text=text))
        if group:
            parts.append(_parse_placeholder(group[1:-1], pattern))
    return tuple(parts)


def _check_literal(literal: str, pattern: str) -> str:
    bad = _LITERAL_UNSAFE.search(literal)
    if bad:
        raise PatternError(N_("the filename pattern %(pattern)r holds the character "
                              "%(char)r, which file systems reject or read as a separator "
                              "(use / for subdirectories)", pattern=pattern,
                              char=bad.group()))
    if len(literal.encode("utf-8")) > MAX_ELEMENT_BYTES:
        raise PatternError(N_("the filename pattern %(pattern)r has an element longer "
                              "than %(most)d bytes", pattern=pattern, most=MAX_ELEMENT_BYTES))
    return literal


def _parse_placeholder(body: str, pattern: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in body.split("|"))
    if "" in names:
        raise PatternError(N_("the filename pattern %(pattern)r has an empty placeholder "
                              "{%(body)s}", pattern=pattern, body=body))
    for name in names:
        if name not in PLACEHOLDERS:
            raise PatternError(N_("unknown placeholder {%(name)s} in the filename "
                                  "pattern; known: %(known)s", name=name,
                                  known=", ".join(PLACEHOLDERS)))
    return names


def _render_element(element: tuple[Part, ...], values: dict[str, Any]) -> str:
    text = "".join(part if isinstance(part, str) else _render_placeholder(part, values)
                   for part in element)
    if text in ("", ".", ".."):
        raise PatternError(f"the filename pattern gives the directory or file name "
                           f"{text!r} for this message")
    if len(text.encode("utf-8")) > MAX_ELEMENT_BYTES:
        raise PatternError(f"the filename pattern gives a name longer than "
                           f"{MAX_ELEMENT_BYTES} bytes for this message: {text[:60]}...")
    return text


def _render_placeholder(names: tuple[str, ...], values: dict[str, Any]) -> str:
    """The first alternative with a value, made safe; empty only where allowed."""
    for name in names:
        value = values.get(name)
        if value is not None and value != "":
            return safe_value(str(value))
    if MAY_BE_EMPTY.intersection(names):
        return ""
    if len(names) == 1:
        raise PatternError(f"placeholder {{{names[0]}}} has no value for this message")
    raise PatternError(f"none of the placeholders {{{'|'.join(names)}}} has a value for "
                       "this message")


def safe_value(value: str) -> str:
    """``value`` made into part of one file name: separators, ``:``, control characters
    and characters file systems reject become ``_``; only dots become underscores."""
    text = _UNSAFE.sub("_", value)
    if text and set(text) == {"."}:
        return "_" * len(text)
    return text


def split_filename(filename: str | None) -> tuple[str | None, str | None]:
    """``order1.xml`` -> (``order1``, ``xml``); no extension gives ``''``; a leading
    dot is part of the name (``.profile`` has no extension)."""
    if not filename:
        return None, None
    base, ext = os.path.splitext(filename)
    return base, ext[1:]


def placeholder_values(*, message_id: int, delivery_id: int, from_party: str,
                       to_party: str, source: str, target: str,
                       original_filename: str | None, external_id: str | None,
                       correlation_id: str | None, created_at: datetime,
                       attempt: int) -> dict[str, Any]:
    """Every placeholder's value for one delivery; dates in UTC (naive means UTC)."""
    basename, extension = split_filename(original_filename)
    created = created_at.astimezone(UTC) if created_at.tzinfo else created_at
    return {
        "message_id": message_id, "delivery_id": delivery_id, "from": from_party,
        "to": to_party, "source": source, "target": target,
        "original_filename": original_filename, "original_basename": basename,
        "original_extension": extension, "external_id": external_id,
        "correlation_id": correlation_id, "date": created.strftime("%Y%m%d"),
        "time": created.strftime("%H%M%S"), "timestamp": created.strftime("%Y%m%dT%H%M%S"),
        "attempt": attempt,
    }
