"""Business-error rules (SPEC 10, seed 003 "Technical error vs. business error").

A destination may answer normally (HTTP 200 even) and still refuse the message in its
content: ``{"status": "ERR", "message": "unknown article"}``. Retrying returns the same
error, so a target instance carries rules that recognise such answers. A rule is::

    {"name": "rejected",          # required, unique on the instance
     "status": 200 | "2xx",       # optional: an exact HTTP status or a class
     "body_regex": "ERR-\\d+",    # optional: searched in the decoded body
     "json_path": "$.status",     # optional: RFC 9535 JSONPath over the JSON body
     "json_value": "ERR",         # optional: the value expected there; without it the
                                  #   path merely having a value matches
     "block": "none"}             # none (default) | sequence | instance

Every condition a rule gives must hold; a rule must give at least one. The rules are
checked in their order on every answer a target attaches to its outcome (a 2xx
included), before the status decides anything else; the first that matches wins and
the delivery fails as a business error, with the rule's name and the matched text in
its history, and is not retried. ``block: "sequence"`` parks the rest of its sequence,
``block: "instance"`` holds back every further delivery of the target instance until an
operator resubmits or skips the blocking delivery.

Bounds: the body is read up to :data:`b2bhub.domain.outcome.ANSWER_BODY_LIMIT` (1 MiB);
a regular expression gets :data:`REGEX_TIMEOUT` seconds on it (the ``regex`` module's
timeout: a catastrophic pattern cannot hang a worker) and counts as not matching when
it runs out. A body that is not JSON never matches a ``json_path`` rule. JSONPath is
``python-jsonpath`` (RFC 9535), not a parser of our own.

:func:`parse_rules` validates what the API, the UI and fixtures are given;
:func:`check` is a pure function of the rules and an answer, so the synchronous HTTP
intake can use it as the worker does. Plain Python: no Flask, no Celery.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from b2bhub.domain.i18n import N_, joined
from b2bhub.domain.outcome import ANSWER_BODY_LIMIT, Answer, Outcome

log = logging.getLogger(__name__)

BLOCKS = ("none", "sequence", "instance")
FIELDS = ("name", "status", "body_regex", "json_path", "json_value", "block")
CONDITIONS = ("status", "body_regex", "json_path")
#: seconds a rule's regular expression may search one body
REGEX_TIMEOUT = 1.0
#: the matched text kept for the history line, at most
MATCH_TEXT_LIMIT = 200
_STATUS_CLASS = re.compile(r"^[1-5]xx$", re.IGNORECASE)
_MISSING = object()
_NOT_JSON = object()


class RulesError(ValueError):
    """The rules are not valid; ``errors`` maps each bad rule's position (from 1) and
    name, e.g. ``"rule 2 (rejected)"``, to the reason: texts of ours (:func:`N_`), in
    English as the API answers them and in the reader's language on a page."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__(joined(N_("%(where)s: %(why)s", where=where, why=why)
                                for where, why in errors.items()))


@dataclass(frozen=True)
class Rule:
    name: str
    status: int | str | None = None  # 404, or a class "4xx" (lower case)
    body_regex: Any = None  # compiled ``regex`` pattern
    json_path: Any = None  # compiled JSONPath
    json_path_text: str = ""  # as written (the compiled one prints canonically)
    json_value: Any = _MISSING
    block: str = "none"

    def matches_status(self, status: int | None) -> bool:
        if self.status is None:
            return True
        if status is None:
            return False
        if isinstance(self.status, int):
            return status == self.status
        return str(status)[:1] == self.status[0]


@dataclass(frozen=True)
class Match:
    """The rule that matched an answer and what in the answer made it match."""

    rule: Rule
    text: str

    def outcome(self, answer: Answer | None = None) -> Outcome:
        """The business-error outcome this match turns an attempt into."""
        block = None if self.rule.block == "none" else self.rule.block
        return Outcome.business_error(self.rule.name, self.text, block=block,
                                      business_rule=self.rule.name,
                                      blocks=self.rule.block).with_answer(answer)


def parse_rules(data: Any) -> list[Rule]:
    """The rules of ``data`` (a list of rule objects, or None for none); raises
    :class:`RulesError` naming every bad rule and why."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise RulesError({"business_rules": N_("must be a list of rule objects")})
    errors: dict[str, str] = {}
    rules: list[Rule] = []
    seen: set[str] = set()
    for n, item in enumerate(data, 1):
        name = item.get("name") if isinstance(item, dict) else None
        where = (N_("rule %(n)s (%(name)s)", n=n, name=name)
                 if isinstance(name, str) and name else N_("rule %(n)s", n=n))
        try:
            rule = _parse_rule(item)
        except ValueError as exc:
            errors[where] = exc.args[0] if exc.args else str(exc)  # a Text, as a rule
            continue
        if rule.name in seen:
            errors[where] = N_("the name %(name)r is used by an earlier rule", name=rule.name)
            continue
        seen.add(rule.name)
        rules.append(rule)
    if errors:
        raise RulesError(errors)
    return rules


def _parse_rule(item: Any) -> Rule:
    if not isinstance(item, dict):
        raise ValueError(N_("must be an object with a name and at least one condition"))
    unknown = set(item) - set(FIELDS)
    if unknown:
        raise ValueError(N_("unknown field(s) %(unknown)s (known: %(known)s)",
                            unknown=", ".join(sorted(unknown)), known=", ".join(FIELDS)))
    name = item.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        raise ValueError(N_("name is required: text of at most 100 characters"))
    if not any(item.get(key) not in (None, "") for key in CONDITIONS):
        raise ValueError(N_("give at least one condition: status, body_regex or json_path"))
    if "json_value" in item and item.get("json_path") in (None, ""):
        raise ValueError(N_("json_value needs a json_path"))
    block = item.get("block")
    if block in (None, ""):  # left out (a form's empty choice): the default
        block = "none"
    if block not in BLOCKS:
        raise ValueError(N_("block must be one of %(blocks)s, not %(block)r",
                            blocks=", ".join(BLOCKS), block=block))
    return Rule(name=name.strip(), status=_status(item.get("status")),
                body_regex=_regex(item.get("body_regex")),
                json_path=_json_path(item.get("json_path")),
                json_path_text=str(item.get("json_path") or "").strip(),
                json_value=item.get("json_value", _MISSING), block=block)


def _status(value: Any) -> int | str | None:
    if value in (None, ""):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return _status(int(value.strip()))
    if isinstance(value, str) and _STATUS_CLASS.match(value.strip()):
        return value.strip().lower()
    raise ValueError(N_("status must be an HTTP status (100-599) or a class such as "
                        "'2xx', not %(value)r", value=value))


def _regex(value: Any):
    # imported when a rule needs it: every worker loads this module, few have rules
    import regex
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise ValueError(N_("body_regex must be text"))
    try:
        return regex.compile(value)
    except regex.error as exc:
        raise ValueError(N_("body_regex is not a valid regular expression: %(why)s",
                            why=str(exc))) from None


def _json_path(value: Any):
    import jsonpath
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise ValueError(N_("json_path must be text"))
    try:
        return jsonpath.compile(value)
    except jsonpath.JSONPathError as exc:
        reason = str(exc).splitlines()[0]
        raise ValueError(N_("json_path is not a valid JSONPath: %(why)s",
                            why=reason)) from None


def normalize(data: Any) -> list[dict] | None:
    """Rules validated and put the way they are stored (None: no rules): each as given,
    its status as a number or a lower-case class and its block spelled out."""
    rules = parse_rules(data)
    if not rules:
        return None
    out = []
    for rule, item in zip(rules, data, strict=True):
        stored = {key: item[key] for key in FIELDS if item.get(key) not in (None, "")}
        stored["name"], stored["block"] = rule.name, rule.block
        if rule.status is not None:
            stored["status"] = rule.status
        if "json_value" in item:
            stored["json_value"] = item["json_value"]
        out.append(stored)
    return out


# --- checking an answer ----------------------------------------------------------------

def check(rules: list[Rule], answer: Answer | None) -> Match | None:
    """The first rule that matches ``answer``, with the text that made it match."""
    if not rules or answer is None:
        return None
    body = _Body(answer)
    for rule in rules:
        found = _match(rule, answer, body)
        if found is not None:
            return Match(rule, found)
    return None


def apply(rules: list[Rule], outcome: Outcome) -> Outcome:
    """``outcome``, or the business error it is when a rule matches its answer."""
    match = check(rules, outcome.answer)
    return outcome if match is None else match.outcome(outcome.answer)


def _match(rule: Rule, answer: Answer, body: _Body) -> str | None:
    """The matched text when every condition of ``rule`` holds, else None."""
    if not rule.matches_status(answer.status):
        return None
    parts = [f"HTTP {answer.status}"] if rule.status is not None else []
    if rule.body_regex is not None:
        found = body.search(rule.body_regex)
        if found is None:
            return None
        parts.append(f"body matched {_clip(found)!r}")
    if rule.json_path is not None:
        found = body.json_match(rule.json_path, rule.json_path_text, rule.json_value)
        if found is None:
            return None
        parts.append(found)
    return "; ".join(parts)


class _Body:
    """An answer's body, decoded and parsed at most once for all the rules."""

    def __init__(self, answer: Answer):
        self._raw = (answer.body or b"")[:ANSWER_BODY_LIMIT]
        self._charset = _charset(answer.content_type)
        self._text: str | None = None
        self._json: Any = _MISSING  # not parsed yet; _NOT_JSON when it is not JSON

    @property
    def text(self) -> str:
        if self._text is None:
            try:
                self._text = self._raw.decode(self._charset, errors="replace")
            except LookupError:  # an unknown charset named by the destination
                self._text = self._raw.decode("utf-8", errors="replace")
        return self._text

    def search(self, pattern) -> str | None:
        try:
            found = pattern.search(self.text, timeout=REGEX_TIMEOUT)
        except TimeoutError:
            log.warning("business rule regex %r ran out of time (%s s); not a match",
                        pattern.pattern, REGEX_TIMEOUT)
            return None
        return found.group(0) if found is not None else None

    def json_match(self, path, written: str, expected: Any) -> str | None:
        if self._json is _MISSING:
            try:
                self._json = json.loads(self.text)
            except ValueError:
                self._json = _NOT_JSON
        if self._json is _NOT_JSON:
            return None
        import jsonpath
        try:
            values = path.findall(self._json)
        except jsonpath.JSONPathError:
            return None
        for value in values:
            if expected is _MISSING or _same(value, expected):
                return f"{written} = {_clip(json.dumps(value, ensure_ascii=False))}"
        return None


def _same(value: Any, expected: Any) -> bool:
    """JSON equality: 1 and 1.0 alike, but true is not 1."""
    if isinstance(value, bool) or isinstance(expected, bool):
        return value is expected
    return value == expected


def _charset(content_type: str) -> str:
    for part in (content_type or "").split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            return value.strip('"')
    return "utf-8"


def _clip(text: str) -> str:
    return text if len(text) <= MATCH_TEXT_LIMIT else text[:MATCH_TEXT_LIMIT] + "…"
