"""Retry policies: when a failed attempt is tried again, and when it fails (SPEC 6).

A target instance's policy is stored as JSON (:meth:`RetryPolicy.to_dict`) and resolved
with :func:`merge`: error-class rules first, then the instance's own settings, then the
plugin type's default for anything the instance leaves out. The state machine asks
:meth:`RetryPolicy.decide` what to do with an ``Outcome.error``. Plain Python: no Flask,
no SQLAlchemy, no Celery.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from b2bhub.domain.i18n import N_

Rand = Callable[[], float]

#: What a rule may say about an error class.
ACTIONS = ("retry", "fail")

_HTTP_FAMILY = re.compile(r"http_([1-5])xx")
_HTTP_STATUS = re.compile(r"http_([1-5])\d\d")


class Strategy(StrEnum):
    """How the delay grows with the number of failed attempts."""

    FIXED = "fixed"
    LINEAR = "linear"
    EXPONENTIAL = "exponential"
    SCHEDULE = "schedule"


@dataclass(frozen=True)
class RetryRule:
    """Retry or fail one error class (``connection``, ``http_5xx``, ``http_404``, ...).

    ``match`` is compared exactly and case-sensitively, so exception type names such as
    ``ConnectionResetError`` work; ``http_4xx``/``http_5xx`` also match each status of
    their family (``http_404``, ``http_503``).
    """

    match: str
    action: str  # 'retry' | 'fail'

    def __post_init__(self) -> None:
        """Refuse rules that could never apply or whose action means nothing."""
        if not isinstance(self.match, str) or not self.match:
            raise ValueError(N_("rule match must be a non-empty error class, got %(got)r",
                                got=self.match))
        if self.action not in ACTIONS:
            raise ValueError(N_("rule action must be 'retry' or 'fail', got %(got)r",
                                got=self.action))

    def applies_to(self, error_class: str | None) -> bool:
        """True when this rule decides about ``error_class``."""
        if error_class is None:
            return False
        if self.match == error_class:
            return True
        family, status = _HTTP_FAMILY.fullmatch(self.match), _HTTP_STATUS.fullmatch(error_class)
        return bool(family and status and family[1] == status[1])

    def to_dict(self) -> dict[str, str]:
        """The rule as stored in the policy's JSON."""
        return {"match": self.match, "action": self.action}


@dataclass(frozen=True)
class RetryDecision:
    """Whether to retry, when (``at``), and why, for the history line."""

    retry: bool
    at: datetime | None
    reason: str


@dataclass(frozen=True)
class RetryPolicy:
    """A target's retry policy; delays are in seconds.

    ``SCHEDULE`` waits ``schedule[n-1]`` before retry *n* and allows ``len(schedule)``
    retries, i.e. ``len(schedule) + 1`` attempts in all (``max_attempts`` is then unused).
    """

    strategy: Strategy = Strategy.EXPONENTIAL
    base_delay: float = 30
    max_delay: float | None = 3600
    max_attempts: int = 5
    jitter: float = 0.0
    schedule: tuple[float, ...] = ()
    rules: tuple[RetryRule, ...] = ()

    def __post_init__(self) -> None:
        """Validate every field so a bad policy is refused when saved, not when used."""
        object.__setattr__(self, "strategy", _strategy(self.strategy))
        object.__setattr__(self, "schedule", _schedule(self.schedule))
        object.__setattr__(self, "rules", _rules(self.rules))
        _check_seconds("base_delay", self.base_delay)
        if self.max_delay is not None:
            _check_seconds("max_delay", self.max_delay)
        _check_attempts(self.max_attempts)
        _check_jitter(self.jitter)
        if self.strategy is Strategy.SCHEDULE and not self.schedule:
            raise ValueError(N_("the schedule strategy needs at least one delay in schedule"))

    @property
    def attempts_allowed(self) -> int:
        """How many attempts in all before a delivery fails."""
        if self.strategy is Strategy.SCHEDULE:
            return len(self.schedule) + 1
        return self.max_attempts

    def delay(self, failures: int, rand: Rand = random.random) -> float:
        """Seconds to wait after the ``failures``-th failed attempt (``failures >= 1``).

        The raw delay is capped at ``max_delay``; jitter then spreads it by up to
        ``±jitter`` of itself (so retries of many deliveries do not all land at once),
        and the result is capped again and never negative.
        """
        if failures < 1:
            raise ValueError(f"failures must be >= 1, got {failures}")
        seconds = self._cap(self._raw_delay(failures))
        if self.jitter:
            seconds = self._cap(seconds * (1 + self.jitter * (2 * rand() - 1)))
        return max(0.0, seconds)

    def rule_for(self, error_class: str | None) -> RetryRule | None:
        """The first rule that applies to ``error_class``, or None."""
        return next((rule for rule in self.rules if rule.applies_to(error_class)), None)

    def decide(self, error_class: str | None, failures: int, now: datetime,
               rand: Rand = random.random) -> RetryDecision:
        """Retry or fail after ``failures`` failed attempts, the last with ``error_class``.

        Rules come first (a 'fail' rule fails at once, whatever attempts are left; a
        'retry' rule lets the attempt count decide), then the attempts left.
        """
        rule = self.rule_for(error_class)
        if rule is not None and rule.action == "fail":
            return RetryDecision(False, None, f"error class {error_class} is not retried")
        if failures >= self.attempts_allowed:
            return RetryDecision(False, None, f"attempts used up ({self.attempts_allowed})")
        seconds = self.delay(failures, rand)
        reason = f"retry {failures} of {self.attempts_allowed - 1} in {seconds:.0f} s"
        return RetryDecision(True, now + timedelta(seconds=seconds), reason)

    def to_dict(self) -> dict[str, Any]:
        """The policy as JSON-ready values, for the instance's database column."""
        return {"strategy": self.strategy.value, "base_delay": self.base_delay,
                "max_delay": self.max_delay, "max_attempts": self.max_attempts,
                "jitter": self.jitter, "schedule": list(self.schedule),
                "rules": [rule.to_dict() for rule in self.rules]}

    @classmethod
    def from_dict(cls, d: dict | None, default: RetryPolicy | None = None) -> RetryPolicy:
        """Read a stored or submitted policy; keys it leaves out come from ``default``.

        Raises ``ValueError`` naming the problem (unknown key or strategy, negative
        delay, ``max_attempts < 1``, jitter outside 0..1, a rule that is not retry/fail).
        ``rules`` and ``schedule``, when given, replace the default's, not extend them.
        """
        base = cls() if default is None else default
        if d is None:
            return base
        if not isinstance(d, dict):
            raise ValueError(N_("a retry policy must be an object, got %(got)s",
                                got=type(d).__name__))
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(N_("unknown retry policy key(s): %(keys)s", keys=", ".join(unknown)))
        changes = dict(d)
        if "rules" in changes:
            changes["rules"] = _rules_from_json(changes["rules"])
        return replace(base, **changes)

    def _raw_delay(self, failures: int) -> float:
        """The strategy's delay before the cap and jitter."""
        if self.strategy is Strategy.FIXED:
            return float(self.base_delay)
        if self.strategy is Strategy.LINEAR:
            return float(self.base_delay * failures)
        if self.strategy is Strategy.EXPONENTIAL:
            return self.base_delay * 2.0 ** min(failures - 1, 1000)  # no float overflow
        return float(self.schedule[min(failures, len(self.schedule)) - 1])

    def _cap(self, seconds: float) -> float:
        """Apply ``max_delay`` (None means no cap)."""
        return seconds if self.max_delay is None else min(seconds, self.max_delay)


def merge(instance_policy: dict | None, type_default: RetryPolicy) -> RetryPolicy:
    """Resolve an instance's stored policy over its plugin type's default (SPEC 6)."""
    return RetryPolicy.from_dict(instance_policy, type_default)


def _is_seconds(value: object) -> bool:
    """A finite, non-negative number that is not a bool (JSON ``true`` is no delay)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def _check_seconds(name: str, value: object) -> None:
    if not _is_seconds(value):
        raise ValueError(N_("%(name)s must be a number of seconds >= 0, got %(got)r", name=name,
                            got=value))


def _check_attempts(value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(N_("max_attempts must be a whole number >= 1, got %(got)r", got=value))


def _check_jitter(value: object) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1
    if not ok:
        raise ValueError(N_("jitter must be a fraction between 0 and 1, got %(got)r", got=value))


def _strategy(value: object) -> Strategy:
    """Accept a member or its stored string; name the choices when it is neither."""
    try:
        return Strategy(value)
    except ValueError:
        choices = ", ".join(s.value for s in Strategy)
        raise ValueError(N_("unknown retry strategy %(got)r; use one of %(choices)s", got=value,
                            choices=choices)) from None


def _schedule(value: object) -> tuple[float, ...]:
    """A list or tuple of delays, each a number of seconds >= 0."""
    if not isinstance(value, list | tuple):
        raise ValueError(N_("schedule must be a list of delays in seconds, got %(got)r",
                            got=value))
    for seconds in value:
        _check_seconds("each schedule delay", seconds)
    return tuple(value)


def _rules(value: object) -> tuple[RetryRule, ...]:
    """A list or tuple of :class:`RetryRule`."""
    if not isinstance(value, list | tuple) or not all(isinstance(r, RetryRule) for r in value):
        raise ValueError(f"rules must be a list of retry rules, got {value!r}")
    return tuple(value)


def _rules_from_json(value: object) -> tuple[RetryRule, ...]:
    """Rules as stored: a list of ``{"match": ..., "action": ...}`` objects."""
    if not isinstance(value, list | tuple):
        raise ValueError(N_("rules must be a list, got %(got)r", got=value))
    for n, item in enumerate(value, 1):
        if not isinstance(item, dict) or set(item) != {"match", "action"}:
            raise ValueError(N_("rule %(n)d must be an object with 'match' and 'action' only",
                                n=n))
    return tuple(RetryRule(item["match"], item["action"]) for item in value)


#: The file writer's default: retried after 30 s, 2 min and 10 min, then failed.
FILE_WRITER_DEFAULT = RetryPolicy(strategy=Strategy.SCHEDULE, schedule=(30, 120, 600))

#: No retry: one attempt. A scheduled source's default for its failed fetches (the first
#: is recorded as a Collection error, b2bhub.engine.collection).
RECORD_AT_ONCE = RetryPolicy(max_attempts=1)
