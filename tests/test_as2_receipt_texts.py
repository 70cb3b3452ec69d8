"""Every receipt refusal says what happened and, where a switch of the partner's AS2
profile answers it, names that switch (issue 42, item 5): the operator reading a failed
delivery learns how to proceed without reading the code. Receipts as ``read_mdn`` gives
them; the wire cases are in tests/test_as2.py and tests/test_as2_interop.py."""

from __future__ import annotations

import re

import pytest

from plugins.as2 import presets
from plugins.as2.mdn_in import Receipt, judge
from plugins.as2.profiles import CHOICES

CASES = [
    # (receipt, delivered, words the text must hold, the switch it names or None)
    (Receipt("processed", None, "<1@hub>", signed=True, mic=None), False,
     "signed MDN without Received-Content-MIC: nothing to compare, the MIC is not "
     "verified (RFC 4130 7.4.3)", "accept_mdn_without_mic"),
    (Receipt("failed/Failure", "Expected signed MDN but unsigned MDN returned", "<1@hub>"),
     False, "unsigned MDN, although a signed one was asked for", "mdn_signed"),
    (Receipt("processed/warning", "Message Integrity check failed.", "<1@hub>",
             signed=True, mic="abc=, sha256"), False,
     "MIC mismatch: the MDN confirms abc=, sha256", "canonicalize_as_binary"),
    (Receipt("processed", None, "<1@hub>", signed=True, signature_error="bad digest"),
     False, "MDN signature failed our verification: bad digest", None),
    (Receipt("failed/Failure", "Failed to parse received MDN: junk", "<1@hub>"), False,
     "MDN could not be read", None),
    (Receipt("processed/error", "decryption-failed", "<1@hub>"), False,
     "negative MDN from the partner: processed/error: decryption-failed", None),
    (Receipt("processed/warning", "duplicate-document", "<1@hub>"), False,
     "MDN with a warning from the partner: duplicate-document", None),
]


@pytest.mark.parametrize("receipt, delivered, words, switch", CASES,
                         ids=[c[3] or c[2].split(":")[0] for c in CASES])
def test_each_refusal_names_the_switch_that_answers_it(receipt, delivered, words, switch):
    ok, text = judge(receipt)
    assert ok is delivered
    assert words in text
    switches = [name for name in CHOICES if re.search(rf"\b{name}\b", text)]
    if switch is None:
        assert switches == [], text  # nothing to switch: a partner's or a key's matter
    else:
        assert switches == [switch], text
        assert "AS2 profile" in text


def test_the_switch_named_for_a_missing_mic_then_accepts_it_with_a_warning():
    receipt = Receipt("processed", None, "<1@hub>", signed=True, mic=None)
    ok, text = judge(receipt, accept_without_mic=True)
    assert ok and text.startswith("MDN processed; warning: signed MDN without "
                                  "Received-Content-MIC, accepted")


@pytest.mark.parametrize("receipt, delivered, words, switch",
                         [c for c in CASES if c[3]], ids=[c[3] for c in CASES if c[3]])
def test_each_hint_names_the_presets_that_set_its_switch(receipt, delivered, words, switch):
    """From the presets' table (plugins.as2.presets), never written twice: a refusal
    names every preset that sets the switch it names to the value it asks for, and no
    other."""
    _ok, text = judge(receipt)
    value = "switch off" not in text  # the hints say "switch on" or "switch off"
    wanted = presets.setting(switch, value)
    named = [name for name in presets.NAMES if re.search(rf"\b{re.escape(name)}\b", text)
             and "preset" in text]
    assert named == list(wanted), text
    if not wanted:
        assert "preset" not in text


def test_the_missing_mic_refusal_names_the_django_pyas2_preset():
    _ok, text = judge(Receipt("processed", None, "<1@hub>", signed=True, mic=None))
    assert text.endswith("switch on accept_mdn_without_mic in its AS2 profile (pyas2lib and "
                         "django-pyas2 leave the MIC out of their receipts for unsigned "
                         "messages); the preset django-pyas2 sets it")
