"""Retry policies: delay sequences, rules, jitter, JSON storage and resolution."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b2bhub.domain.retry import (
    FILE_WRITER_DEFAULT,
    RetryDecision,
    RetryPolicy,
    RetryRule,
    Strategy,
    merge,
)

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def delays(policy, n):
    return [policy.delay(f) for f in range(1, n + 1)]


# --- strategies --------------------------------------------------------------------------

def test_fixed():
    assert delays(RetryPolicy(Strategy.FIXED, base_delay=10), 4) == [10, 10, 10, 10]


def test_linear():
    assert delays(RetryPolicy(Strategy.LINEAR, base_delay=10), 4) == [10, 20, 30, 40]


def test_exponential():
    assert delays(RetryPolicy(Strategy.EXPONENTIAL, base_delay=5), 4) == [5, 10, 20, 40]


def test_exponential_is_capped():
    policy = RetryPolicy(Strategy.EXPONENTIAL, base_delay=5, max_delay=15)
    assert delays(policy, 5) == [5, 10, 15, 15, 15]


def test_no_cap_and_many_failures_do_not_overflow():
    assert RetryPolicy(max_delay=None).delay(5000) > 1e300


def test_linear_is_capped():
    assert delays(RetryPolicy(Strategy.LINEAR, base_delay=10, max_delay=25), 3) == [10, 20, 25]


def test_schedule():
    assert delays(FILE_WRITER_DEFAULT, 3) == [30, 120, 600]


def test_delay_needs_at_least_one_failure():
    with pytest.raises(ValueError, match="failures"):
        RetryPolicy().delay(0)


def test_defaults():
    policy = RetryPolicy()
    assert (policy.strategy, policy.base_delay, policy.max_delay, policy.max_attempts,
            policy.jitter) == (Strategy.EXPONENTIAL, 30, 3600, 5, 0.0)


# --- decide ------------------------------------------------------------------------------

def test_file_writer_retries_after_30s_2min_10min_then_fails():
    decisions = [FILE_WRITER_DEFAULT.decide("storage", n, NOW) for n in (1, 2, 3, 4)]
    assert [d.at for d in decisions[:3]] == [NOW + timedelta(seconds=s) for s in (30, 120, 600)]
    assert all(d.retry for d in decisions[:3])
    assert decisions[3] == RetryDecision(False, None, "attempts used up (4)")
    assert FILE_WRITER_DEFAULT.attempts_allowed == 4


def test_max_attempts_counts_every_attempt():
    policy = RetryPolicy(Strategy.FIXED, base_delay=1, max_attempts=3)
    assert [policy.decide("timeout", n, NOW).retry for n in (1, 2, 3)] == [True, True, False]
    assert policy.decide("timeout", 3, NOW).reason == "attempts used up (3)"


def test_single_attempt_never_retries():
    assert not RetryPolicy(max_attempts=1).decide("connection", 1, NOW).retry


def test_retry_reason_says_which_retry_and_when():
    decision = RetryPolicy(Strategy.FIXED, base_delay=60).decide("timeout", 2, NOW)
    assert decision.reason == "retry 2 of 4 in 60 s"


def test_fail_rule_beats_attempts_left():
    policy = RetryPolicy(rules=(RetryRule("http_404", "fail"),))
    decision = policy.decide("http_404", 1, NOW)
    assert decision == RetryDecision(False, None, "error class http_404 is not retried")
    assert policy.decide("http_500", 1, NOW).retry


def test_http_family_rule_matches_each_status():
    policy = RetryPolicy(rules=(RetryRule("http_4xx", "fail"),))
    assert not policy.decide("http_404", 1, NOW).retry
    assert not policy.decide("http_400", 1, NOW).retry
    assert policy.decide("http_503", 1, NOW).retry
    assert policy.decide("http_4041", 1, NOW).retry  # not a three-digit status


def test_retry_rule_for_5xx_within_attempts():
    policy = RetryPolicy(Strategy.FIXED, base_delay=10, max_attempts=3,
                         rules=(RetryRule("http_5xx", "retry"), RetryRule("http_503", "fail")))
    assert policy.rule_for("http_503") == RetryRule("http_5xx", "retry")  # first rule wins
    assert policy.decide("http_503", 1, NOW) == RetryDecision(
        True, NOW + timedelta(seconds=10), "retry 1 of 2 in 10 s")
    assert not policy.decide("http_503", 3, NOW).retry  # a retry rule does not add attempts


def test_first_matching_rule_wins():
    policy = RetryPolicy(rules=(RetryRule("http_429", "retry"), RetryRule("http_4xx", "fail")))
    assert policy.decide("http_429", 1, NOW).retry
    assert not policy.decide("http_401", 1, NOW).retry


def test_rules_match_exception_names_exactly():
    policy = RetryPolicy(rules=(RetryRule("ConnectionResetError", "fail"),))
    assert not policy.decide("ConnectionResetError", 1, NOW).retry
    assert policy.decide("connectionreseterror", 1, NOW).retry
    assert policy.decide(None, 1, NOW).retry


# --- jitter ------------------------------------------------------------------------------

@pytest.mark.parametrize(("rand", "expected"), [(0.0, 80), (0.5, 100), (1.0, 120)])
def test_jitter_with_fixed_rand(rand, expected):
    policy = RetryPolicy(Strategy.FIXED, base_delay=100, jitter=0.2)
    assert policy.delay(1, rand=lambda: rand) == pytest.approx(expected)


def test_jitter_is_capped_again():
    policy = RetryPolicy(Strategy.FIXED, base_delay=100, max_delay=100, jitter=0.5)
    assert policy.delay(1, rand=lambda: 1.0) == 100


def test_full_jitter_never_goes_negative():
    policy = RetryPolicy(Strategy.FIXED, base_delay=100, jitter=1.0)
    assert policy.delay(1, rand=lambda: 0.0) == 0


@given(st.floats(0, 1), st.floats(0, 1), st.integers(1, 50))
def test_jitter_bounds(jitter, r, failures):
    policy = RetryPolicy(base_delay=7, max_delay=500, jitter=jitter)
    plain = RetryPolicy(base_delay=7, max_delay=500).delay(failures)
    got = policy.delay(failures, rand=lambda: r)
    assert 0 <= got <= 500
    assert plain * (1 - jitter) - 1e-9 <= got <= plain * (1 + jitter) + 1e-9


def test_decide_passes_rand_on():
    policy = RetryPolicy(Strategy.FIXED, base_delay=100, jitter=0.5)
    assert policy.decide("timeout", 1, NOW, rand=lambda: 0.0).at == NOW + timedelta(seconds=50)


# --- storage -----------------------------------------------------------------------------

@pytest.mark.parametrize(("data", "message"), [
    ({"strategy": "random"}, "unknown retry strategy 'random'"),
    ({"base_delay": -1}, "base_delay must be a number of seconds >= 0"),
    ({"base_delay": "30"}, "base_delay"),
    ({"base_delay": True}, "base_delay"),
    ({"max_delay": -5}, "max_delay"),
    ({"max_attempts": 0}, "max_attempts must be a whole number >= 1"),
    ({"max_attempts": 2.5}, "max_attempts"),
    ({"jitter": 1.5}, "jitter must be a fraction between 0 and 1"),
    ({"jitter": -0.1}, "jitter"),
    ({"schedule": [30, -1]}, "each schedule delay"),
    ({"schedule": "30"}, "schedule must be a list"),
    ({"strategy": "schedule", "schedule": []}, "at least one delay"),
    ({"rules": [{"match": "http_404", "action": "maybe"}]}, "rule action must be 'retry' or"),
    ({"rules": [{"match": "", "action": "fail"}]}, "rule match"),
    ({"rules": [{"match": "x"}]}, "rule 1 must be an object"),
    ({"rules": "http_404"}, "rules must be a list"),
    ({"max_attemps": 3}, "unknown retry policy key"),
])
def test_from_dict_refuses_bad_input(data, message):
    with pytest.raises(ValueError, match=message):
        RetryPolicy.from_dict(data, RetryPolicy())


def test_from_dict_refuses_a_non_object():
    with pytest.raises(ValueError, match="must be an object"):
        RetryPolicy.from_dict([1, 2], RetryPolicy())


def test_round_trip():
    policy = RetryPolicy(Strategy.LINEAR, base_delay=12.5, max_delay=None, max_attempts=7,
                         jitter=0.25, schedule=(1, 2),
                         rules=(RetryRule("http_404", "fail"), RetryRule("timeout", "retry")))
    data = policy.to_dict()
    assert data["strategy"] == "linear"
    assert data["rules"] == [{"match": "http_404", "action": "fail"},
                             {"match": "timeout", "action": "retry"}]
    assert RetryPolicy.from_dict(data, RetryPolicy()) == policy


def test_round_trip_of_the_file_writer_default():
    assert RetryPolicy.from_dict(FILE_WRITER_DEFAULT.to_dict(), RetryPolicy()) == (
        FILE_WRITER_DEFAULT)


def test_missing_keys_come_from_the_default():
    policy = RetryPolicy.from_dict({"max_attempts": 2}, RetryPolicy(base_delay=9, jitter=0.1))
    assert (policy.max_attempts, policy.base_delay, policy.jitter) == (2, 9, 0.1)


def test_none_means_the_default():
    assert RetryPolicy.from_dict(None, FILE_WRITER_DEFAULT) is FILE_WRITER_DEFAULT
    assert RetryPolicy.from_dict(None) == RetryPolicy()


def test_constructor_validates_too():
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=2)
    assert RetryPolicy(strategy="fixed").strategy is Strategy.FIXED


# --- resolution (SPEC 6) -----------------------------------------------------------------

def test_merge_falls_back_to_the_plugin_type_default():
    assert merge(None, FILE_WRITER_DEFAULT) == FILE_WRITER_DEFAULT
    assert merge({}, FILE_WRITER_DEFAULT) == FILE_WRITER_DEFAULT


def test_merge_instance_settings_override_the_type_default():
    policy = merge({"strategy": "fixed", "base_delay": 5, "max_attempts": 2},
                   FILE_WRITER_DEFAULT)
    assert [policy.decide("storage", n, NOW).retry for n in (1, 2)] == [True, False]
    assert policy.delay(1) == 5


def test_merge_rules_come_first():
    policy = merge({"rules": [{"match": "storage", "action": "fail"}]}, FILE_WRITER_DEFAULT)
    assert not policy.decide("storage", 1, NOW).retry
    assert policy.decide("timeout", 1, NOW).at == NOW + timedelta(seconds=30)


@given(st.sampled_from(list(Strategy)), st.floats(0, 1e4), st.integers(1, 20),
       st.lists(st.floats(0, 1e4), min_size=1, max_size=5))
def test_round_trip_property(strategy, base, attempts, schedule):
    policy = RetryPolicy(strategy, base_delay=base, max_attempts=attempts,
                         schedule=tuple(schedule))
    assert RetryPolicy.from_dict(policy.to_dict(), FILE_WRITER_DEFAULT) == policy
