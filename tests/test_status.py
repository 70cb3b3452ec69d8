"""Message status derivation: examples and implementation-independent properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b2bhub.domain.states import DeliveryState as D
from b2bhub.domain.states import FailureKind as K
from b2bhub.domain.states import MessageStatus as S
from b2bhub.domain.status import ALERTING_STATUSES, derive_status

EXAMPLES = [
    ([], S.NOT_ROUTED),
    ([(D.QUEUED, None)], S.RECEIVED),
    ([(D.QUEUED, None), (D.QUEUED, None)], S.RECEIVED),
    ([(D.AWAITING_RECEIPT, None), (D.QUEUED, None)], S.IN_PROGRESS),
    ([(D.RETRYING, None), (D.IN_PROGRESS, None)], S.IN_PROGRESS),
    ([(D.RETRYING, None), (D.AWAITING_RECEIPT, None)], S.RETRYING),
    ([(D.DELIVERED, None), (D.AWAITING_RECEIPT, None)], S.AWAITING_RECEIPT),
    ([(D.DELIVERED, None), (D.FAILED, K.TECHNICAL)], S.ERROR),
    ([(D.DELIVERED, None), (D.FAILED, None)], S.ERROR),
    ([(D.FAILED, K.BUSINESS), (D.FAILED, K.TECHNICAL)], S.ERROR),
    ([(D.FAILED, K.BUSINESS), (D.STALLED, None)], S.BUSINESS_ERROR),
    ([(D.STALLED, None), (D.DEFERRED, None)], S.STALLED),
    ([(D.DEFERRED, None), (D.QUEUED, None)], S.DEFERRED),
    ([(D.DELIVERED, None), (D.SKIPPED, None)], S.DELIVERED),
    ([(D.DELIVERED, None), (D.CANCELLED, None)], S.DELIVERED),
    ([(D.SKIPPED, None)], S.DELIVERED),
    ([(D.CANCELLED, None), (D.CANCELLED, None)], S.CANCELLED),
    ([(D.QUEUED, None), (D.CANCELLED, None)], S.IN_PROGRESS),
    ([(D.DELIVERED, K.BUSINESS)], S.DELIVERED),  # a kind on a non-failed state is ignored
    ([("failed", "business"), ("delivered", None)], S.BUSINESS_ERROR),  # stored strings
    ([("queued", "")], S.RECEIVED),
]


@pytest.mark.parametrize(("deliveries", "expected"), EXAMPLES)
def test_examples(deliveries, expected):
    assert derive_status(deliveries) is expected


def test_accepts_a_generator():
    assert derive_status((d, None) for d in [D.DELIVERED, D.RETRYING]) is S.RETRYING


def test_unknown_state_is_refused():
    with pytest.raises(ValueError):
        derive_status([("sent", None)])


def test_alerting_statuses():
    assert ALERTING_STATUSES == {S.ERROR, S.BUSINESS_ERROR}


# --- properties --------------------------------------------------------------------------

def _failed_technical(ds):
    return any(D(s) is D.FAILED and (not k or K(k) is K.TECHNICAL) for s, k in ds)


def _any(*states):
    return lambda ds: any(D(s) in states for s, _ in ds)


def _all(*states):
    return lambda ds: all(D(s) in states for s, _ in ds)


#: SPEC 11 precedence written out independently of the implementation: first match wins.
PRECEDENCE = [
    (S.NOT_ROUTED, lambda ds: not ds),
    (S.ERROR, _failed_technical),
    (S.BUSINESS_ERROR, _any(D.FAILED)),  # every failure left here is a business one
    (S.STALLED, _any(D.STALLED)),
    (S.DEFERRED, _any(D.DEFERRED)),
    (S.RECEIVED, _all(D.QUEUED)),
    (S.IN_PROGRESS, _any(D.IN_PROGRESS, D.QUEUED)),
    (S.RETRYING, _any(D.RETRYING)),
    (S.AWAITING_RECEIPT, _any(D.AWAITING_RECEIPT)),
    (S.DELIVERED, _any(D.DELIVERED, D.SKIPPED)),
    (S.CANCELLED, _all(D.CANCELLED)),
]


def _as_stored(member):
    """Either the enum member or its plain string, as the database would hand it back."""
    return st.sampled_from([member, member.value])


kinds = st.one_of(st.none(), st.sampled_from(list(K)).flatmap(_as_stored))
states = st.sampled_from(list(D)).flatmap(_as_stored)
deliveries = st.lists(st.tuples(states, kinds), max_size=8)


@given(deliveries, st.randoms())
def test_order_does_not_matter(ds, rnd):
    shuffled = list(ds)
    rnd.shuffle(shuffled)
    assert derive_status(shuffled) is derive_status(ds)


@given(deliveries, kinds.filter(lambda k: k is None or K(k) is K.TECHNICAL))
def test_a_technical_failure_always_means_error(ds, kind):
    assert derive_status([*ds, (D.FAILED, kind)]) is S.ERROR


@given(deliveries)
def test_highest_ranked_status_present_wins(ds):
    expected = next(status for status, applies in PRECEDENCE if applies(ds))
    assert derive_status(ds) is expected


@given(deliveries)
def test_intake_statuses_are_never_derived(ds):
    assert derive_status(ds) not in {S.REFUSED, S.COLLECTION_ERROR}


@given(st.lists(st.tuples(st.sampled_from([D.DELIVERED, D.SKIPPED]), kinds), min_size=1))
def test_all_delivered_or_skipped_is_delivered(ds):
    assert derive_status(ds) is S.DELIVERED


@given(deliveries)
def test_result_is_a_message_status(ds):
    assert isinstance(derive_status(ds), S)
