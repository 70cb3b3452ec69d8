"""The file poller's path pattern (seed 002 "Path pattern"), parsed and matched.

A pattern is matched against a file's path relative to the poller's base directory:
elements separated by ``/``, each either literal text or one whole-element placeholder,
``{from}``, ``{to}`` or ``{filename}``. What a placeholder captures is only ever compared
with party names, never used to build a path. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from b2bhub.domain.i18n import N_

__all__ = ["MAX_ELEMENTS", "PLACEHOLDERS", "UNROUTABLE", "Match", "PathPattern",
           "PatternError", "parse", "parse_shape"]

PLACEHOLDERS = ("from", "to", "filename")
MAX_ELEMENTS = 6
UNROUTABLE = "unroutable"
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class PatternError(ValueError):
    """The pattern breaks a rule; the message says which and how to fix it."""


@dataclass(frozen=True)
class Match:
    """What a file's relative path says: the captured parties (None when the pattern
    does not capture them) and the bare file name."""

    from_party: str | None
    to_party: str | None
    filename: str


@dataclass(frozen=True)
class PathPattern:
    """A parsed pattern: ``elements`` hold literal text, or a placeholder's name in
    ``placeholders`` at the same index."""

    text: str
    elements: tuple[str, ...]
    placeholders: tuple[str | None, ...]

    @property
    def depth(self) -> int:
        """How many elements a matching relative path has (the scan goes this deep)."""
        return len(self.elements)

    def captures(self, name: str) -> bool:
        return name in self.placeholders

    def literal(self, index: int) -> str | None:
        """The literal text of element ``index``, or None where a placeholder stands."""
        return None if self.placeholders[index] else self.elements[index]

    def match(self, parts: Sequence[str]) -> Match | None:
        """Match a relative path given as its elements; None unless it has exactly the
        pattern's depth, every literal element equal and every part a plain name."""
        if len(parts) != self.depth or not all(_plain_element(p) for p in parts):
            return None
        captured: dict[str, str] = {}
        for part, element, placeholder in zip(parts, self.elements, self.placeholders,
                                              strict=True):
            if placeholder:
                captured[placeholder] = part
            elif part != element:
                return None
        return Match(captured.get("from"), captured.get("to"), parts[-1])


def _plain_element(part: object) -> bool:
    """A single path element as a directory listing gives it: no separator, no NUL,
    not empty, not ``.`` or ``..``."""
    return (isinstance(part, str) and part not in ("", ".", "..")
            and "/" not in part and "\0" not in part)


def parse(text: str, fixed_from: bool = False, fixed_to: bool = False) -> PathPattern:
    """Parse and check a path pattern; ``fixed_from``/``fixed_to`` say whether the
    poller sets that party itself. Raise :class:`PatternError` on the first broken rule."""
    pattern = parse_shape(text)
    _check_parties(pattern, fixed_from, fixed_to)
    return pattern


def parse_shape(text: str) -> PathPattern:
    """Parse and check the pattern's own rules, leaving out how from and to are set."""
    if not isinstance(text, str) or text == "":
        raise PatternError(N_("the path pattern is empty; {filename} takes the files "
                              "directly in the base directory"))
    if text.startswith("/"):
        raise PatternError(N_("%(text)r is absolute; give a path relative to the base "
                              "directory", text=text))
    if "\\" in text:
        raise PatternError(N_("%(text)r holds a backslash; separate elements with /",
                              text=text))
    elements = tuple(text.split("/"))
    if len(elements) > MAX_ELEMENTS:
        raise PatternError(N_("%(text)r has %(count)d elements; at most %(most)d are "
                              "allowed", text=text, count=len(elements), most=MAX_ELEMENTS))
    placeholders = tuple(_element(text, e) for e in elements)
    pattern = PathPattern(text, elements, placeholders)
    _check_structure(pattern)
    return pattern


def _element(text: str, element: str) -> str | None:
    """The placeholder name of one element, or None if it is literal text."""
    if element == "":
        raise PatternError(N_("%(text)r has an empty element (// or a / at an end)",
                              text=text))
    if element in (".", ".."):
        raise PatternError(N_("%(text)r holds %(element)r; elements . and .. are not "
                              "allowed", text=text, element=element))
    if _CONTROL.search(element):
        raise PatternError(N_("%(text)r holds a control character", text=text))
    whole = _PLACEHOLDER.fullmatch(element)
    if whole:
        name = whole.group(1)
        if name not in PLACEHOLDERS:
            raise PatternError(N_("unknown placeholder %(element)r; use {from}, {to} or "
                                  "{filename}", element=element))
        return name
    if "{" in element or "}" in element:
        raise PatternError(N_("%(element)r: a placeholder must be a whole path element "
                              "(e.g. outbox/{to}/{filename})", element=element))
    return None


def _check_structure(pattern: PathPattern) -> None:
    names = [p for p in pattern.placeholders if p]
    for name in PLACEHOLDERS:
        if names.count(name) > 1:
            raise PatternError(N_("%(text)r: {%(name)s} occurs more than once",
                                  text=pattern.text, name=name))
    if pattern.elements[0].lower() == UNROUTABLE and not pattern.placeholders[0]:
        raise PatternError(N_("%(text)r starts with %(folder)s, the folder unroutable "
                              "files are moved to", text=pattern.text, folder=UNROUTABLE))
    if "filename" in names and pattern.placeholders[-1] != "filename":
        raise PatternError(N_("%(text)r: {filename} must be the last element",
                              text=pattern.text))
    if pattern.placeholders[-1] in ("from", "to"):
        raise PatternError(N_("%(text)r: the last element names the file; end the "
                              "pattern with {filename} or a literal file name",
                              text=pattern.text))


def _check_parties(pattern: PathPattern, fixed_from: bool, fixed_to: bool) -> None:
    if fixed_to and pattern.captures("to"):
        raise PatternError(N_("to is set on the poller and captured by {to}; keep one"))
    if not fixed_to and not pattern.captures("to"):
        raise PatternError(N_("to is neither set on the poller nor captured by {to}"))
    if fixed_from and pattern.captures("from"):
        raise PatternError(N_("from is set on the poller and captured by {from}; keep "
                              "one"))
