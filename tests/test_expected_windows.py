"""Expected-message windows and matching, plain Python (b2bhub/domain/expected.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from b2bhub.domain.expected import (
    Criteria,
    Facts,
    check_schedule,
    describe_window,
    matches,
    minutes_late,
    next_window,
    schedule_windows,
    to_utc,
    triggers,
)

BERLIN = ZoneInfo("Europe/Berlin")


def test_a_daily_0600_berlin_window_ends_at_0500_utc_in_winter_and_0400_in_summer():
    winter = schedule_windows("0 6 * * 1-5", "Europe/Berlin", datetime(2026, 12, 7),
                              datetime(2026, 12, 8, 12))
    summer = schedule_windows("0 6 * * 1-5", "Europe/Berlin", datetime(2027, 6, 7),
                              datetime(2027, 6, 8, 12))
    assert [end for _start, end in winter] == [datetime(2026, 12, 7, 5), datetime(2026, 12, 8, 5)]
    assert [end for _start, end in summer] == [datetime(2027, 6, 7, 4), datetime(2027, 6, 8, 4)]
    # each window opens at the schedule's previous time: Monday's at Friday's
    monday = schedule_windows("0 6 * * 1-5", "Europe/Berlin", datetime(2026, 12, 6),
                              datetime(2026, 12, 7, 6))
    assert monday == [(datetime(2026, 12, 4, 5), datetime(2026, 12, 7, 5))]


def test_a_window_across_the_spring_change_is_23_hours_and_across_autumn_25():
    spring = schedule_windows("0 6 * * *", "Europe/Berlin", datetime(2027, 3, 28),
                              datetime(2027, 3, 28, 12))
    autumn = schedule_windows("0 6 * * *", "Europe/Berlin", datetime(2027, 10, 31),
                              datetime(2027, 10, 31, 12))
    assert spring == [(datetime(2027, 3, 27, 5), datetime(2027, 3, 28, 4))]
    assert autumn == [(datetime(2027, 10, 30, 4), datetime(2027, 10, 31, 5))]


def test_a_time_in_the_spring_gap_is_the_gaps_end_and_a_doubled_time_its_first():
    assert to_utc(datetime(2027, 3, 28, 2, 30), BERLIN) == datetime(2027, 3, 28, 1, 0)
    assert to_utc(datetime(2027, 10, 31, 2, 30), BERLIN) == datetime(2027, 10, 31, 0, 30)
    spring = schedule_windows("30 * * * *", "Europe/Berlin", datetime(2027, 3, 27, 23),
                              datetime(2027, 3, 28, 2))
    assert [end for _s, end in spring] == [datetime(2027, 3, 27, 23, 30),
                                           datetime(2027, 3, 28, 0, 30),
                                           datetime(2027, 3, 28, 1, 0),
                                           datetime(2027, 3, 28, 1, 30)]
    autumn = schedule_windows("30 * * * *", "Europe/Berlin", datetime(2027, 10, 30, 23),
                              datetime(2027, 10, 31, 3))
    # 02:30 happens twice on the wall clock; its window ends once, at the first
    assert [end for _s, end in autumn] == [datetime(2027, 10, 30, 23, 30),
                                           datetime(2027, 10, 31, 0, 30),
                                           datetime(2027, 10, 31, 2, 30)]


def test_the_open_window_and_how_it_is_named():
    start, end = next_window("0 6 * * *", "Europe/Berlin", datetime(2026, 12, 7, 4, 59))
    assert (start, end) == (datetime(2026, 12, 6, 5), datetime(2026, 12, 7, 5))
    assert next_window("0 6 * * *", "Europe/Berlin", datetime(2026, 12, 7, 5),
                       opens_minutes=60)[1] == datetime(2026, 12, 8, 5)
    assert next_window("0 6 * * *", "UTC", datetime(2026, 12, 7, 5), opens_minutes=30)[0] \
        == datetime(2026, 12, 7, 5, 30)
    assert describe_window(start, end, "Europe/Berlin") == \
        "2026-12-06 06:00 to 2026-12-07 06:00 Europe/Berlin"


def test_bad_schedules_and_zones_are_named():
    assert check_schedule("0 6 * * 1-5", "Europe/Berlin") is None
    assert "five fields" in check_schedule("0 6 * *", "UTC")
    assert "five fields" in check_schedule("0 25 * * *", "UTC")
    assert "time zone" in check_schedule("0 6 * * *", "Mars/Olympus")


def test_matching_a_message_to_a_rule():
    facts = Facts(direction="inbound", from_party="acme", to_party="mycompany",
                  source="inbox", filename="INV-001.csv", targets=frozenset({"outbox"}),
                  document_types=frozenset({"846"}))
    assert matches(Criteria(from_party="acme", filename="INV-*.csv"), facts)
    assert matches(Criteria(direction="inbound", document_type="846", target="outbox"), facts)
    assert not matches(Criteria(direction="outbound"), facts)
    assert not matches(Criteria(to_party="acme"), facts)
    assert not matches(Criteria(filename="inv-*.csv"), facts)  # globs match case
    assert not matches(Criteria(document_type="850"), facts)
    assert not matches(Criteria(source="other"), facts)


def test_a_relation_is_triggered_by_a_request_between_its_parties_reversed():
    rule = Criteria(direction="inbound", from_party="acme", document_type="997")
    after = Criteria(direction="outbound", document_type="850")
    sent = Facts(direction="outbound", from_party="mycompany", to_party="acme",
                 source="api", document_types=frozenset({"850"}))
    assert triggers(rule, after, sent)
    assert not triggers(rule, after, Facts(direction="outbound", from_party="mycompany",
                                           to_party="globex", source="api",
                                           document_types=frozenset({"850"})))


def test_minutes_late_rounds_up():
    end = datetime(2026, 12, 7, 5)
    assert minutes_late(end, datetime(2026, 12, 7, 5, 0, 1)) == 1
    assert minutes_late(end, datetime(2026, 12, 7, 5, 20)) == 20
    assert minutes_late(end, datetime(2026, 12, 7, 5, 20, 30)) == 21


def test_a_hub_down_for_years_gets_the_last_windows_only():
    found = schedule_windows("* * * * *", "UTC", datetime(2020, 1, 1), datetime(2026, 12, 7))
    assert len(found) == 500
    assert found[-1] == (datetime(2026, 12, 6, 23, 59), datetime(2026, 12, 7))
    assert found[0][1] == datetime(2026, 12, 7) - timedelta(minutes=499)
    # times that all fall in the spring gap end one window, at the gap's end
    gap = schedule_windows("0,15,30,45 2 * * *", "Europe/Berlin", datetime(2027, 3, 27, 12),
                           datetime(2027, 3, 28, 12))
    assert gap == [(datetime(2027, 3, 27, 1, 45), datetime(2027, 3, 28, 1, 0))]
