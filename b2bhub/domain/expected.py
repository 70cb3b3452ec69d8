"""Expected-message rules: their windows and which messages they expect
(docs/expected-messages.md). Plain Python: no Flask, no SQLAlchemy.

A rule expects a message of a direction, a party pair (either may be ``*``), optionally
a source or target instance, a file name glob and a document type, in a window:

- **schedule**: a cron expression (five fields) read on the wall clock of a named time
  zone; each time it names ends a window, which opens at the previous one (or
  ``opens_minutes`` before its end). "by 06:00 Mon-Fri Europe/Berlin" is
  ``0 6 * * 1-5`` in ``Europe/Berlin``.
- **relation**: each message matching ``after`` (a direction, a document type, a file
  name glob; its parties those of the expected message reversed) opens a window of
  ``within_minutes``: "a 997 within 4 h of each 850 we send".

Daylight saving: a wall-clock time that does not exist (spring forward: 02:30 in
Berlin on the last Sunday of March) falls on the first instant after the gap (03:00
summer time); a time that exists twice (autumn: 02:30 on the last Sunday of October)
is its first occurrence (summer time), once. Times here are naive UTC, as the database
keeps them.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from b2bhub.domain.i18n import N_

ANY = "*"
DIRECTIONS = ("inbound", "outbound", "internal", ANY)
#: windows a schedule may produce in one call: a hub down for a year is judged for
#: its last windows, not made to write a million rows
MAX_WINDOWS = 500


@dataclass(frozen=True)
class Criteria:
    """What a message must be: every field ``*`` (or empty for the optional ones)
    matches anything."""

    direction: str = ANY
    from_party: str = ANY
    to_party: str = ANY
    source: str = ""
    target: str = ""
    filename: str = ANY
    document_type: str = ANY


@dataclass(frozen=True)
class Facts:
    """What a message is, as the rules look at it."""

    direction: str
    from_party: str
    to_party: str
    source: str
    filename: str = ""
    targets: frozenset[str] = field(default_factory=frozenset)
    document_types: frozenset[str] = field(default_factory=frozenset)


def matches(rule: Criteria, msg: Facts) -> bool:
    """Whether ``msg`` is a message ``rule`` expects (its parties included)."""
    return (rule.from_party in (ANY, msg.from_party)
            and rule.to_party in (ANY, msg.to_party)
            and kind_matches(rule, msg))


def kind_matches(rule: Criteria, msg: Facts) -> bool:
    """``matches`` without the parties: a relation's response is paired to its
    request's parties instead."""
    return (rule.direction in (ANY, msg.direction)
            and (not rule.source or rule.source == msg.source)
            and (not rule.target or rule.target in msg.targets)
            and (rule.filename in (ANY, "") or fnmatch.fnmatchcase(msg.filename or "",
                                                                  rule.filename))
            and (rule.document_type in (ANY, "") or rule.document_type in msg.document_types))


def triggers(rule: Criteria, after: Criteria, msg: Facts) -> bool:
    """Whether ``msg`` opens a window of a relation rule: it is what ``after`` names,
    between the rule's parties reversed (the request goes the other way)."""
    return (rule.to_party in (ANY, msg.from_party) and rule.from_party in (ANY, msg.to_party)
            and kind_matches(after, msg))


# --- schedules --------------------------------------------------------------------

def check_schedule(cron: str, tz: str) -> str | None:
    """An error message for a schedule that cannot be used, else None."""
    if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
        return N_("schedule %(cron)r is not a cron expression of five fields (minute hour "
                  "day-of-month month day-of-week)", cron=cron)
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        return N_("unknown time zone %(tz)r (an IANA name such as Europe/Berlin)", tz=tz)
    return None


def to_utc(wall: datetime, zone: ZoneInfo) -> datetime:
    """A wall-clock time of ``zone`` as naive UTC, by the rule of the module docstring:
    a time in a spring-forward gap is the gap's end, a doubled time its first."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first.replace(tzinfo=None)  # exists (its first occurrence when doubled)
    # in a gap: fold=1 reads it with the offset after the jump (earlier in UTC), fold=0
    # with the one before; the jump lies between, on a whole minute
    low = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    return _gap_end(wall, zone, low, first)


def _gap_end(wall: datetime, zone: ZoneInfo, low: datetime, high: datetime) -> datetime:
    """The first whole minute in [low, high] whose wall clock is past ``wall``."""
    moment = low
    while moment < high and moment.astimezone(zone).replace(tzinfo=None) < wall:
        moment += timedelta(minutes=1)
    return moment.replace(tzinfo=None)


def _fires(cron: str, zone: ZoneInfo, after_wall: datetime) -> Iterator[datetime]:
    """The schedule's times after the wall-clock time ``after_wall``, as naive UTC,
    strictly increasing (times in one spring gap fall on one instant, yielded once)."""
    last = None
    for wall in croniter(cron, after_wall, ret_type=datetime):
        moment = to_utc(wall, zone)
        if last is None or moment > last:
            last = moment
            yield moment


def _wall(moment: datetime, zone: ZoneInfo) -> datetime:
    return moment.replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None)


def schedule_windows(cron: str, tz: str, after: datetime, until: datetime,
                     opens_minutes: int | None = None) -> list[tuple[datetime, datetime]]:
    """The (start, end) of the windows ending after ``after`` and at or before
    ``until`` (naive UTC), oldest first, at most the latest :data:`MAX_WINDOWS`: read
    backwards from ``until``, so a hub long down costs no more than that."""
    zone = ZoneInfo(tz)
    times = croniter(cron, _wall(until, zone) + timedelta(seconds=1), ret_type=datetime)
    ends: list[datetime] = []  # newest first, down to the first at or before ``after``
    while len(ends) <= MAX_WINDOWS and (not ends or ends[-1] > after):
        moment = to_utc(times.get_prev(datetime), zone)
        if not ends or moment < ends[-1]:  # times in one spring gap fall on one instant
            ends.append(moment)
    windows = [(_opens(older, end, opens_minutes), end)
               for end, older in zip(ends, [*ends[1:], None], strict=True) if end > after]
    return windows[:MAX_WINDOWS][::-1]


def next_window(cron: str, tz: str, now: datetime, opens_minutes: int | None = None
                ) -> tuple[datetime, datetime]:
    """The window open at ``now`` (naive UTC): the first whose end is after it."""
    zone = ZoneInfo(tz)
    wall = _wall(now, zone)
    end = next(_fires(cron, zone, wall))
    if end <= now:  # a doubled hour: the wall clock repeats a time already passed
        end = next(m for m in _fires(cron, zone, wall + timedelta(hours=2)) if m > now)
    start = _previous_fire(cron, zone, _wall(end, zone)) or end - timedelta(days=1)
    return _opens(start, end, opens_minutes), end


def _previous_fire(cron: str, zone: ZoneInfo, wall: datetime) -> datetime | None:
    prev = croniter(cron, wall, ret_type=datetime).get_prev(datetime)
    return to_utc(prev, zone) if prev is not None else None


def _opens(start: datetime | None, end: datetime, opens_minutes: int | None) -> datetime:
    if opens_minutes:
        return end - timedelta(minutes=opens_minutes)
    return start if start is not None else end - timedelta(days=1)


def describe_window(start: datetime, end: datetime, tz: str) -> str:
    """A window as the alert names it: on the rule's wall clock, and its zone."""
    zone = ZoneInfo(tz)
    first, last = _wall(start, zone), _wall(end, zone)
    shown = "%Y-%m-%d %H:%M"
    until = last.strftime("%H:%M" if first.date() == last.date() else shown)
    return f"{first.strftime(shown)} to {until} {tz}"


def minutes_late(end: datetime, arrived: datetime) -> int:
    """Whole minutes past the window's end, at least 1 once past it."""
    seconds = (arrived - end).total_seconds()
    return max(1, int(-(-seconds // 60))) if seconds > 0 else 0
