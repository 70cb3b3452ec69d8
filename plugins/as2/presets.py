"""Vendor presets of a partner's AS2 profile (issue 42, item 3): the switches known to
be needed with a product, each with where that is known from.

A preset is a starting point, not a mode: choosing one (``preset`` in a PUT, the select
on the partner's AS2 page) sets its switches first and the request's own choices on top;
the profile keeps the preset's name to show where it started. Only sourced knowledge is
here: a vendor without a sourced quirk sets nothing and says so, and a quirk that needs a
switch b2bhub does not have is a note, never a faked switch. The receipt refusals name
the presets that set their switch (:func:`naming`, used by :mod:`.mdn_in`), so this table
is the one place that knowledge is written.

This module imports nothing of the profile code (which imports it); tests check every
switch here against ``profiles.CHOICES``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from b2bhub.plugin import N_

#: where a claim comes from: a public page and what it says there, in a few words
DJANGO_PYAS2_100 = "https://github.com/abhishek-ram/django-pyas2/issues/100"
NO_DEVIATION = "no known deviation from the defaults"


@dataclass(frozen=True)
class Source:
    url: str
    says: str


@dataclass(frozen=True)
class Preset:
    name: str
    label: str
    #: switch -> value, each with its entry in :attr:`sources`
    switches: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    #: what is known without a switch to set (or why nothing is set), each with a source
    notes: tuple = ()

    def summary(self) -> str:
        """``canonicalize_as_binary=true, ...`` or the words for none."""
        return ", ".join(f"{k}={_word(v)}" for k, v in self.switches.items()) or NO_DEVIATION

    def as_json(self) -> dict:
        return {"name": self.name, "label": self.label, "switches": dict(self.switches),
                "sources": {k: {"url": s.url, "says": s.says}
                            for k, s in self.sources.items()},
                "notes": [{"text": text, "url": s.url, "says": s.says}
                          for text, s in self.notes]}


def _word(value) -> str:
    return {True: "true", False: "false"}.get(value, str(value)) \
        if isinstance(value, bool) else str(value)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        "sterling", "IBM Sterling B2B Integrator",
        {"canonicalize_as_binary": True},
        {"canonicalize_as_binary": Source(
            DJANGO_PYAS2_100, "Sterling: signature validation often requires the binary "
            "canonicalisation setting on this side (pyas2-lib PR #55)")}),
    Preset(
        "biztalk", "Microsoft BizTalk Server",
        {"encryption_alg": "tripledes_192_cbc"},
        {"encryption_alg": Source(
            DJANGO_PYAS2_100, "BizTalk: if 3DES is used, no issues")},
        ((("BizTalk wraps the content key of what it sends with RSAES-OAEP; b2bhub "
           "reads every key encryption it receives, so nothing is set for it"),
          Source("https://github.com/abhishek-ram/pyas2-lib/issues/62",
                 "MS BizTalk is using OAEP instead of PKCS#1 v1.5")),)),
    Preset(
        "cleo", "Cleo",
        notes=(((f"{NO_DEVIATION}: the Cleo side had to change its signing algorithm "
                 "value from sha256_rsa to rsassa_pkcs1v15; b2bhub has no switch for the "
                 "signature algorithm and always signs with rsassa_pkcs1v15"),
                Source(DJANGO_PYAS2_100, "Cleo: partner had to adjust signing algorithm "
                       "value from sha256_rsa to rsassa_pkcs1v15")),)),
    Preset(
        "mendelson", "Mendelson AS2",
        notes=(((f"{NO_DEVIATION}: Mendelson refused a body sent with "
                 "Content-Transfer-Encoding base64; b2bhub always sends binary"),
                Source("https://github.com/OpenAS2/OpenAs2App/issues/120",
                       "Mendelson: the defined content transfer encoding base64 is "
                       "unknown")),)),
    Preset(
        "openas2", "OpenAS2",
        notes=((NO_DEVIATION, Source(DJANGO_PYAS2_100, "OpenAS2: no known issues")),)),
    Preset(
        "django-pyas2", "django-pyas2",
        {"accept_mdn_without_mic": True},
        {"accept_mdn_without_mic": Source(
            "https://github.com/abhishek-ram/pyas2-lib/issues/19",
            "sending a plain file without signature but requesting a signed MDN: "
            "pyas2-lib keeps no MIC for it (seen with django-pyas2 1.2.3: its signed "
            "receipt of an unsigned message has no Received-Content-MIC)")}),
    Preset(
        "axway", "Axway B2Bi",
        notes=(((f"{NO_DEVIATION}: one unresolved report of Axway not reading another "
                 "product's signed MDN names no setting"),
                Source("https://github.com/phax/phase2/issues/156",
                       "Axway: Unable to get multipart/signed data content")),)),
    Preset(
        "sap", "SAP PI/PO (AS2 adapter of the B2B add-on)",
        notes=(((f"{NO_DEVIATION}: none found in the trackers of django-pyas2, OpenAS2 "
                 "and pyas2-lib"),
                Source("https://github.com/abhishek-ram/django-pyas2/issues",
                       "no report naming SAP")),)),
)}
NAMES = tuple(PRESETS)


class UnknownPreset(ValueError):
    pass


def get(name: str) -> Preset:
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise UnknownPreset(N_("preset must be one of %(names)s",
                               names=", ".join(NAMES))) from None


def setting(switch: str, value) -> tuple[str, ...]:
    """The presets that set ``switch`` to ``value``."""
    return tuple(p.name for p in PRESETS.values()
                 if switch in p.switches and p.switches[switch] == value)


def naming(switch: str, value) -> str:
    """What a refusal adds after naming ``switch``: the presets that set it, if any."""
    names = setting(switch, value)
    if not names:
        return ""
    return (f"; the preset {names[0]} sets it" if len(names) == 1 else
            f"; the presets {', '.join(names)} set it")


def applied_text(name: str, overridden=()) -> str:
    """The history words of a preset applied: its switches, those the request's own
    choices replaced marked so."""
    preset = get(name)
    if not preset.switches:
        return f"preset {name} applied: no switch set ({NO_DEVIATION})"
    parts = [f"{k}={_word(v)}" + (" (replaced by the request)" if k in overridden else "")
             for k, v in preset.switches.items()]
    return f"preset {name} applied: {', '.join(parts)}"
