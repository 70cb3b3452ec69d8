"""AS2 profiles of organizations and partners (SPEC 2): validation, storage, lookup.

A profile is a ``protocol_profiles`` row (protocol ``as2``, ``address`` the AS2 ID, the
choices in ``settings``) with its certificates. An organization's certificate is ours and
comes with its private key (signing what we send and our MDNs, decrypting what we get);
a partner's certificate verifies its signatures and encrypts what we send it. AS2 IDs are
unique across all AS2 profiles. Choices left out of a PUT keep their stored values; a
certificate left out keeps the stored one.

Certificate lifecycle: a profile holds several certificates, each with its validity
window (from the certificate) and a role (``usage``: ``both``, ``signing`` or
``encryption``; whose it is follows from the profile: an organization's are ours, a
partner's are the partner's; the older values ``own`` and ``partner`` mean both). PUT
``certificate`` replaces them all with one (as before), ``certificates`` replaces them
all with a list, ``add_certificate`` adds one (a rollover: the new certificate uploaded
before its ``not_before``, nothing to change on the day). Inbound, every certificate of
the role valid now is tried (signatures of the partner, decryption with our keys);
outbound, the newest valid one is used (latest ``not_before``); of an organization's,
one offered to partners by CEM signs only for those that accepted it, each from its own
date (:func:`choose_certs`, :mod:`.cem`). When no certificate of
a role is valid now, the message is refused with a reason naming the certificate and
its window, unless the partner's ``accept_expired_certificates`` is on: then the newest
one is used, with a warning line. Saving a certificate that has expired or ends within
30 days raises ``certificate_expiring`` at once.

Outbound TLS (:mod:`.tls`): ``tls_ca_bundle`` (PEM) verifies the partner's server with or
instead of the system store (``tls_system_trust``); ``tls_client_certificate`` (an upload
as ``certificate``, with its key) is kept as a certificate of the role ``tls_client``,
shown without its key; ``null`` removes it. Replacing the AS2 certificates leaves it.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from b2bhub.plugin import (
    CERTIFICATE_WARNING,
    N_,
    ORGANIZATION,
    PARTNER,
    PROFILES_VERSION_KEY,
    Conflict,
    NewCertificate,
    NotFound,
    ServiceError,
    StoredCertificate,
    StoredProfile,
    address_holder,
    bump_version,
    certificate_alert,
    delete_protocol_profile,
    find_protocol_profile,
    get_protocol_profile,
    joined,
    no_profile,
    save_protocol_profile,
    utcnow,
)
from plugins.as2 import presets
from plugins.as2.certs import CertificateError, read_upload
from plugins.as2.tls import TLS_CLIENT, bundle_problem

PROTOCOL = "as2"
MDN_MODES = ("none", "sync", "async")
DIGESTS = ("sha1", "sha224", "sha256", "sha384", "sha512")
CIPHERS = ("tripledes_192_cbc", "rc2_128_cbc", "rc4_128_cbc", "aes_128_cbc",
           "aes_192_cbc", "aes_256_cbc")
#: how the content key of what we encrypt is wrapped for the partner (plugins.as2.keywrap)
KEY_ENCRYPTIONS = ("rsa_pkcs1v15", "rsaes_oaep_sha1", "rsaes_oaep_sha256", "rsaes_oaep_sha512")
EXPIRY_WARNING = CERTIFICATE_WARNING  # the core's flag on the Parties page and dashboard
DEFAULT_RECEIPT_TIMEOUT = 24 * 3600

#: choice -> (default, check); the check returns an error text or None
def _bool(v):
    return None if isinstance(v, bool) else "must be true or false"


def _one_of(options):
    return lambda v: None if v in options else N_("must be one of %(choices)s",
                                                  choices=", ".join(options))


def _url(v):
    if v is None or (isinstance(v, str) and v.startswith(("http://", "https://"))
                     and len(v) < 2000):
        return None
    return N_("must be an http:// or https:// URL")


def _seconds(v):
    return None if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 90 * 86400 \
        else N_("must be whole seconds from 1 to 90 days")


def _text(v):
    return None if isinstance(v, str) and len(v) <= 200 else N_("must be text (200 at most)")


def _optional_text(limit, lines=True):
    def check(v):
        bad = "\x00" if lines else "\x00\r\n"
        if v is None or (isinstance(v, str) and len(v) <= limit
                         and not any(c in v for c in bad)):
            return None
        if lines:
            return N_("must be text (%(most)s at most) or null", most=limit)
        return N_("must be text (%(most)s at most, one line) or null", most=limit)
    return check


def _domain(v):
    if v is None or (isinstance(v, str) and 0 < len(v) <= 200 and v.isascii() and all(
            part and all(c.isalnum() or c == "-" for c in part) for part in v.split("."))):
        return None
    return N_("must be a domain name (letters, digits, hyphens and dots) or null")


CHOICES: dict[str, tuple[Any, Any]] = {
    "url": (None, _url),  # a partner's AS2 endpoint
    "mdn_url": (None, _url),  # an organization's: where partners post asynchronous MDNs
    "sign": (True, _bool),
    "digest_alg": ("sha256", _one_of(DIGESTS)),
    "encrypt": (True, _bool),
    "encryption_alg": ("aes_256_cbc", _one_of(CIPHERS)),
    "key_encryption": ("rsa_pkcs1v15", _one_of(KEY_ENCRYPTIONS)),
    "compress": (False, _bool),
    "mdn_mode": ("sync", _one_of(MDN_MODES)),
    "mdn_signed": (True, _bool),
    "mdn_digest_alg": ("sha256", _one_of(DIGESTS)),
    "receipt_timeout": (DEFAULT_RECEIPT_TIMEOUT, _seconds),
    "canonicalize_as_binary": (False, _bool),
    # True: Transfer-Encoding chunked (some partners' web stacks read by Content-Length
    # only, or answer 411); the default sends Content-Length (README "AS2 defaults")
    "chunked": (False, _bool),
    "accept_expired_certificates": (False, _bool),
    "content_type": ("application/edi-consent", _text),
    "subject": ("AS2 Message", _text),
    # an organization's identity (README "AS2 identity"): the domain of its Message-IDs
    # (None: the host's name, see lib.default_domain), the Disposition-Notification-To of
    # its messages (None: as2@<domain>), the human-readable part of its MDNs (None: the
    # hub's own words, lib.MDN_TEXT / lib.MDN_FAILED_TEXT)
    "message_id_domain": (None, _domain),
    "disposition_notification_to": (None, _optional_text(200, lines=False)),
    "mdn_text": (None, _optional_text(2000)),
    "mdn_failed_text": (None, _optional_text(2000)),
    # a partner's: a signed MDN without Received-Content-MIC settles Delivered with a
    # warning instead of failing (RFC 4130 7.4.3 requires the MIC)
    "accept_mdn_without_mic": (False, _bool),
    # a partner's outbound TLS (plugins.as2.tls): CAs trusted for its server certificate,
    # with the system's store or alone
    "tls_ca_bundle": (None, bundle_problem),
    "tls_system_trust": (True, _bool),
    # a partner's CEM requests (plugins.as2.cem) are accepted without an operator
    "cem_auto_accept": (False, _bool),
}
FIELDS = {"as2_id", "certificate", "certificates", "add_certificate", "tls_client_certificate",
          "preset", *CHOICES}
#: the settings key of the preset a profile started from (:mod:`.presets`)
PRESET = "preset"
#: an organization's settings key of its certificates offered by CEM (:mod:`.cem`):
#: certificate id -> {"fingerprint", "signs_for": {partner: ISO date}, "open": [partner]}
GATES = "cem_offered"
ROLES = ("both", "signing", "encryption")

# --- the same rules as JSON Schema, for the API's document ---------------------------

#: RFC 4130 5.1: an AS2 ID is 1 to 128 printable ASCII characters (spaces inside only)
AS2_ID_PATTERN = "^[!-~]([ -~]*[!-~])?$"
_BOOL = {"type": "boolean"}


def _nullable(schema: dict) -> dict:
    return {**schema, "nullable": True}


def _texts(limit: int, lines: bool = True) -> dict:
    return _nullable({"type": "string", "maxLength": limit,
                      "pattern": "^[^\\x00]*$" if lines else "^[^\\x00\\r\\n]*$"})


#: choice -> its JSON Schema; each states what the choice's check in CHOICES accepts
CHOICE_SCHEMAS: dict[str, dict] = {
    "url": _nullable({"type": "string", "pattern": "^https?://", "maxLength": 1999}),
    "mdn_url": _nullable({"type": "string", "pattern": "^https?://", "maxLength": 1999}),
    "sign": _BOOL, "digest_alg": {"type": "string", "enum": list(DIGESTS)},
    "encrypt": _BOOL, "encryption_alg": {"type": "string", "enum": list(CIPHERS)},
    "key_encryption": {"type": "string", "enum": list(KEY_ENCRYPTIONS)},
    "compress": _BOOL, "mdn_mode": {"type": "string", "enum": list(MDN_MODES)},
    "mdn_signed": _BOOL, "mdn_digest_alg": {"type": "string", "enum": list(DIGESTS)},
    "receipt_timeout": {"type": "integer", "minimum": 1, "maximum": 90 * 86400},
    "canonicalize_as_binary": _BOOL, "chunked": _BOOL,
    "accept_expired_certificates": _BOOL,
    "content_type": {"type": "string", "maxLength": 200},
    "subject": {"type": "string", "maxLength": 200},
    "message_id_domain": _nullable({"type": "string", "minLength": 1, "maxLength": 200,
                                    "pattern": "^[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)*$"}),
    "disposition_notification_to": _texts(200, lines=False),
    "mdn_text": _texts(2000), "mdn_failed_text": _texts(2000),
    "accept_mdn_without_mic": _BOOL, "cem_auto_accept": _BOOL,
}
#: a certificate as a PUT takes it; whether it is one (and its key belongs to it) only
#: reading it tells: such a refusal is a 400 naming the certificate field
UPLOAD_SCHEMA = {"type": "object", "description": "a PEM certificate (with its private key "
                 "for an organization) or a base64 PKCS#12; role: both (default), signing or "
                 "encryption", "properties": {
                     "pem": {"type": "string"}, "private_key_pem": {"type": "string"},
                     "pkcs12": {"type": "string", "format": "byte"},
                     "password": _nullable({"type": "string"}),
                     "role": {"type": "string", "enum": list(ROLES)}}}
CERTIFICATE_SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer"}, "usage": {"type": "string"},
    "role": {"type": "string", "enum": list(ROLES)}, "subject": {"type": "string"},
    "issuer": {"type": "string"},
    "not_before": _nullable({"type": "string", "format": "date-time"}),
    "not_after": _nullable({"type": "string", "format": "date-time"}),
    "valid": _BOOL, "days_left": _nullable({"type": "integer"}), "expiring": _BOOL,
    "has_private_key": _BOOL,
    "signs_for": _nullable({
        "type": "object", "additionalProperties": {"type": "string", "format": "date-time"},
        "description": "our certificate offered by CEM: the partners that accepted it, "
        "each with the date it signs for it from (null: it signs for every partner)"})}}


def json_schemas() -> dict[str, dict]:
    """What PUT takes and what GET and PUT answer (see ``ProfileKind.json_schemas``)."""
    body = {"type": "object", "additionalProperties": False, "properties": {
        "as2_id": {"type": "string", "minLength": 1, "maxLength": 128,
                   "pattern": AS2_ID_PATTERN},
        **CHOICE_SCHEMAS,
        "preset": _nullable({"type": "string", "enum": list(presets.NAMES),
                             "description": "a vendor preset (GET /as2/presets): its "
                             "switches first, this body's choices on top; null forgets "
                             "the name, keeping the switches"}),
        "certificate": _nullable(UPLOAD_SCHEMA),
        "certificates": _nullable({"type": "array", "items": UPLOAD_SCHEMA, "minItems": 1}),
        "add_certificate": _nullable(UPLOAD_SCHEMA)},
        "description": "Choices left out keep their stored values; a new profile needs "
                       "as2_id and a certificate (a partner's its url too)."}
    answer = {"type": "object", "required": ["party", "kind", "as2_id", *CHOICES,
                                             "certificates"], "properties": {
        "party": {"type": "string"},
        "kind": {"type": "string", "enum": ["organization", "partner"]},
        "as2_id": {"type": "string"},
        **{name: {k: v for k, v in schema.items() if k not in ("pattern", "maxLength")}
           for name, schema in CHOICE_SCHEMAS.items()},
        "preset": _nullable({"type": "string", "enum": list(presets.NAMES)}),
        "certificates": {"type": "array", "items": CERTIFICATE_SCHEMA},
        "peer_features": _nullable({
            "type": "object", "description": "what the partner said it is, in the "
            "AS2-Version and EDIINT-Features headers of its last message or receipt "
            "(null: not heard yet)", "properties": {
                "as2_version": _nullable({"type": "string"}),
                "features": {"type": "array", "items": {"type": "string"}},
                "seen_at": {"type": "string", "format": "date-time"},
                "seen_in": {"type": "string", "enum": ["message", "receipt"]}}})}}
    # a certificate's content, what a new profile needs, an AS2 ID another profile has,
    # a preset in an organization's profile (one body schema serves both kinds)
    return {"body": body, "answer": answer, "server_checks": [
        "certificate", "certificates", "add_certificate", "as2_id", "url", "preset"]}
_LEGACY_BOTH = ("own", "partner")


@dataclass(frozen=True)
class CertInfo:
    """One certificate of a profile, as the AS2 code uses it."""

    id: int
    pem: str
    key_pem: str | None
    role: str
    subject: str
    not_before: datetime | None
    not_after: datetime | None

    def serves(self, role: str) -> bool:
        return self.role in ("both", role)

    def valid_at(self, now: datetime) -> bool:
        return (self.not_before is None or self.not_before <= now) and (
            self.not_after is None or now <= self.not_after)

    def window(self) -> str:
        def day(moment):
            return f"{moment:%Y-%m-%d %H:%M} UTC" if moment else "?"
        return f"{self.subject}, valid {day(self.not_before)} to {day(self.not_after)}"


class CertificateRefused(Exception):
    """No certificate of a role is valid now (and expired ones are not accepted)."""


@dataclass(frozen=True)
class CertChoice:
    """The certificates of one role to use now: ``use`` newest first; ``warning`` when
    they are outside their window and accepted all the same."""

    use: tuple[CertInfo, ...]
    warning: str | None = None


def choose_certs(profile_certs, role: str, now: datetime, accept_expired: bool,
                 whose: str, partner: str | None = None,
                 gates: dict | None = None) -> CertChoice:
    """The certificates of ``role`` valid at ``now``, newest first; when none is, the
    newest of the others if ``accept_expired`` (with a warning), else
    :class:`CertificateRefused` naming why.

    ``gates`` (an organization's :attr:`As2Profile.gates`): our certificates offered by
    CEM, which sign only for the partners that accepted them, each from its own date.
    For ``partner`` (None: no partner in view) the signing certificates are the ungated
    ones and those it accepted, from that date, the latest start first (a gated one by
    its date for this partner). When none of them is valid now (the old certificate
    ended), a gated one valid now signs for every partner, with a warning: a partner
    that has not accepted it may not verify it, but the old one would fail everywhere."""
    if role == "signing" and gates:
        gated = _gated_choice(profile_certs, now, whose, partner, gates)
        if gated is not None:
            return gated
    of_role = sorted((c for c in profile_certs if c.serves(role)),
                     key=lambda c: (c.not_before or datetime.min, c.id), reverse=True)
    valid = tuple(c for c in of_role if c.valid_at(now))
    if valid or not of_role:
        return CertChoice(valid)
    newest = of_role[0]
    when = ("expired" if newest.not_after and newest.not_after < now
            else "is not valid yet")
    text = f"the {role} certificate of {whose} {when} ({newest.window()})"
    if accept_expired:
        return CertChoice((newest,), f"warning: {text}; used because "
                                     "accept_expired_certificates is on")
    raise CertificateRefused(f"{text}; refused (accept_expired_certificates is off)")


def _gated_choice(profile_certs, now: datetime, whose: str, partner: str | None,
                  gates: dict) -> CertChoice | None:
    """:func:`choose_certs` of the signing role with CEM gates; None when no
    certificate of the role is valid now (the rule without gates then says why)."""
    valid = [c for c in profile_certs if c.serves("signing") and c.valid_at(now)]
    mine = []
    for cert in valid:
        start = cert.not_before or datetime.min
        if cert.id in gates:
            accepted = gates[cert.id].get(partner) if partner else None
            if accepted is None or accepted > now:
                continue
            start = max(start, accepted)
        mine.append((start, cert.id, cert))
    if mine:
        return CertChoice(tuple(c for _s, _i, c in sorted(mine, key=lambda m: m[:2],
                                                             reverse=True)))
    others = sorted((c for c in valid if c.id in gates),
                    key=lambda c: (c.not_before or datetime.min, c.id), reverse=True)
    if not others:
        return None
    return CertChoice(tuple(others), N_(
        "warning: no signing certificate of %(org)s that %(partner)s accepted is valid "
        "now; signed with %(cert)s, offered to other partners by CEM",
        org=whose, partner=partner or "?", cert=others[0].subject))


def gates_of(settings: dict, certs) -> dict[int, dict[str, datetime]]:
    """An organization's CEM gates (:data:`GATES`) as :func:`choose_certs` takes them:
    certificate id -> {partner: from when it signs for it}, for the certificates the
    profile has (an entry whose fingerprint differs from the row's is an old one)."""
    kept = settings.get(GATES)
    if not kept:
        return {}
    by_id = {c.id: c for c in certs}
    found = {}
    for key, gate in kept.items():
        cert = by_id.get(int(key))
        if cert is not None and gate.get("fingerprint") == fingerprint(cert.pem):
            found[cert.id] = {name: datetime.fromisoformat(when.rstrip("Z"))
                              for name, when in (gate.get("signs_for") or {}).items()}
    return found


def fingerprint(pem: str) -> str:
    """A certificate's short fingerprint (of its PEM as stored)."""
    return hashlib.sha256(pem.strip().encode()).hexdigest()[:32]
#: an organization's identity choices (optional texts)
IDENTITY = ("message_id_domain", "disposition_notification_to", "mdn_text", "mdn_failed_text")


@dataclass(frozen=True)
class As2Profile:
    """What the AS2 code needs of a profile, read in one go (plain values)."""

    party: str
    kind: str
    as2_id: str
    settings: dict
    cert_pem: str | None
    key_pem: str | None
    updated_at: datetime
    #: every certificate of the profile (:class:`CertInfo`); ``cert_pem``/``key_pem`` are
    #: the newest one's as stored, for callers that need only one
    certs: tuple = ()
    #: our TLS client certificate for this partner (a :class:`CertInfo` with its key)
    tls_client: CertInfo | None = None
    #: an organization's certificates offered by CEM that sign only for the partners
    #: that accepted them (:func:`gates_of`): id -> {partner: from when}
    gates: dict = field(default_factory=dict, compare=False)
    #: pyas2lib objects built from this profile, kept with it (see :mod:`.lib`)
    loaded: dict = field(default_factory=dict, compare=False, repr=False)

    def get(self, choice: str):
        return self.settings.get(choice, CHOICES[choice][0])


def _check_as2_id(value: Any) -> str:
    if (not isinstance(value, str) or not 1 <= len(value) <= 128 or not value.isascii()
            or not value.isprintable() or value != value.strip()):
        raise ServiceError(N_("as2_id must be 1 to 128 printable ASCII characters without "
                              "leading or trailing spaces (RFC 4130)"), {"as2_id": "invalid"})
    return value


def get_profile(session: Session, kind: str, name: str) -> StoredProfile:
    profile = get_protocol_profile(session, PROTOCOL, kind, name)
    if profile is None:
        raise NotFound(no_profile(kind, name, "AS2"))
    return profile


def save_profile(session: Session, kind: str, name: str, body: dict) -> StoredProfile:
    """Create or update the AS2 profile of a party from the API shape; all or nothing."""
    unknown = set(body) - FIELDS
    if unknown:
        raise ServiceError(N_("unknown fields: %(fields)s", fields=", ".join(sorted(unknown))),
                           {f: "unknown" for f in unknown})
    profile = get_protocol_profile(session, PROTOCOL, kind, name)  # NotFound: no party
    as2_id = _check_as2_id(body.get("as2_id", profile.address if profile else None))
    holder = address_holder(session, PROTOCOL, as2_id)
    if holder is not None and holder != name:
        raise Conflict(N_("AS2 ID '%(as2_id)s' belongs to '%(holder)s' already",
                          as2_id=as2_id, holder=holder),
                       {"as2_id": "taken"})
    settings = dict(profile.settings) if profile else {}
    if body.get(PRESET) is not None and kind == ORGANIZATION:
        raise ServiceError(N_("a vendor preset is a partner's (it names the partner's "
                              "product)"),
                           {PRESET: "only for a partner"})
    if body.get(PRESET) is not None:  # its switches first, the body's choices on top
        try:
            settings.update(presets.get(body[PRESET]).switches)
        except presets.UnknownPreset as exc:
            raise ServiceError(exc.args[0], {PRESET: exc.args[0]}) from None
        settings[PRESET] = body[PRESET]
    elif PRESET in body:
        settings.pop(PRESET, None)
    problems = {}
    for choice, (_default, check) in CHOICES.items():
        if choice in body:
            problem = check(body[choice])
            if problem:
                problems[choice] = problem
            else:
                settings[choice] = body[choice]
    if problems:
        raise ServiceError(N_("invalid AS2 profile: %(problems)s", problems=joined(
            N_("%(field)s %(problem)s", field=k, problem=v) for k, v in problems.items())),
            problems)
    own = kind == ORGANIZATION
    replace, added, tls_client = None, [], None
    try:
        if body.get("certificates") is not None:
            if not isinstance(body["certificates"], list) or not body["certificates"]:
                raise CertificateError(N_("certificates must be a list of one or more"))
            replace = [_read_cert(u, own) for u in body["certificates"]]
        elif body.get("certificate") is not None:
            replace = [_read_cert(body["certificate"], own)]
        if body.get("add_certificate") is not None:
            added = [_read_cert(body["add_certificate"], own)]
        if body.get("tls_client_certificate") is not None:
            tls_client = (read_upload(body["tls_client_certificate"], need_key=True),
                          TLS_CLIENT)
    except CertificateError as exc:
        field_name = next(f for f in ("certificates", "certificate", "add_certificate",
                                      "tls_client_certificate") if body.get(f) is not None)
        problem = exc.args[0]  # a Text: shown in the reader's language
        raise ServiceError(problem, {field_name: problem}) from None
    if not replace and not added and (profile is None or not as2_certs(profile)):
        raise ServiceError(N_("an AS2 profile needs a certificate"),
                           {"certificate": "required"})
    if kind != ORGANIZATION and settings.get("url") is None and profile is None:
        raise ServiceError(N_("a partner's AS2 profile needs its url"), {"url": "required"})
    remove = set()
    if profile is not None and replace is not None:
        remove |= {cert.id for cert in as2_certs(profile)}
    if profile is not None and "tls_client_certificate" in body:  # a new one, or null
        remove |= {cert.id for cert in profile.certificates if cert.usage == TLS_CLIENT}
    if settings.get(GATES) and remove:  # a replaced certificate offered by CEM: forgotten
        settings[GATES] = {k: v for k, v in settings[GATES].items() if int(k) not in remove}
    new = [NewCertificate(usage=role, pem=pair.pem, private_key_pem=pair.private_key_pem,
                          subject=pair.subject[:500], issuer=pair.issuer[:500],
                          not_before=pair.not_before, not_after=pair.not_after)
           for pair, role in (replace or []) + added + ([tls_client] if tls_client else [])]
    before = {cert.id for cert in profile.certificates} if profile else set()
    saved = save_protocol_profile(session, PROTOCOL, kind, name, as2_id, settings,
                                  remove=remove, add=new)
    if new:
        now = utcnow()
        for cert in saved.certificates:
            if cert.id not in before:
                certificate_alert(session, name, "AS2 certificate", cert, now)
    bump_profiles_version(session)
    session.flush()
    return saved


def as2_certs(profile: StoredProfile) -> list[StoredCertificate]:
    """The profile's AS2 certificates (signing, encryption), not its TLS client one."""
    return [c for c in profile.certificates if c.usage != TLS_CLIENT]


def _read_cert(upload, own: bool):
    """(key pair, role) of one uploaded certificate (``role`` optional: both)."""
    role = upload.get("role", "both") if isinstance(upload, dict) else "both"
    if role not in ROLES:
        raise CertificateError(N_("a certificate's role must be one of %(roles)s",
                                  roles=", ".join(ROLES)))
    upload = {k: v for k, v in upload.items() if k != "role"} if isinstance(upload, dict) \
        else upload
    return read_upload(upload, need_key=own), role


def delete_profile(session: Session, kind: str, name: str) -> None:
    get_profile(session, kind, name)  # NotFound, in the AS2 profile's words
    delete_protocol_profile(session, PROTOCOL, kind, name)
    bump_profiles_version(session)
    session.flush()


def profile_json(profile: StoredProfile, now: datetime) -> dict:
    """The API shape: choices with their defaults filled in, certificates without keys."""
    settings = {choice: profile.settings.get(choice, default)
                for choice, (default, _c) in CHOICES.items()}
    tls = next((c for c in profile.certificates if c.usage == TLS_CLIENT), None)
    gates = gates_of(profile.settings, profile.certificates)
    return {"party": profile.party, "kind": profile.kind, "as2_id": profile.address,
            **settings, PRESET: profile.settings.get(PRESET),
            "certificates": [_cert_json(c, now, gates.get(c.id))
                             for c in as2_certs(profile)],
            "tls_client_certificate": _cert_json(tls, now) if tls is not None else None,
            "peer_features": profile.settings.get(PEER_KEY)}


def _cert_json(cert: StoredCertificate, now: datetime, gate: dict | None = None) -> dict:
    left = (cert.not_after - now) if cert.not_after else None
    return {"id": cert.id, "usage": cert.usage,
            "role": "both" if cert.usage in _LEGACY_BOTH else cert.usage,
            "subject": cert.subject, "issuer": cert.issuer,
            "not_before": _iso(cert.not_before), "not_after": _iso(cert.not_after),
            "valid": bool(cert.not_before and cert.not_after
                          and cert.not_before <= now <= cert.not_after),
            "days_left": left.days if left is not None else None,
            "expiring": left is not None and left <= EXPIRY_WARNING,
            "has_private_key": cert.private_key_pem is not None,
            "signs_for": None if gate is None else {
                name: _iso(when) for name, when in sorted(gate.items())}}


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() + "Z" if moment else None


# --- lookup for receiving and sending ----------------------------------------------

def _lookup(session: Session, **where) -> As2Profile | None:
    """One statement per lookup (the core's, a row per certificate): each AS2 request
    looks up two profiles."""
    found = find_protocol_profile(session, PROTOCOL, **where)
    if found is None:
        return None
    every = [CertInfo(c.id, c.pem, c.private_key_pem,
                      "both" if c.usage in _LEGACY_BOTH else c.usage, c.subject,
                      c.not_before, c.not_after)
             for c in sorted(found.certificates, key=lambda c: c.id, reverse=True)]
    certs = tuple(c for c in every if c.role != TLS_CLIENT)
    newest = certs[0] if certs else None
    return As2Profile(party=found.party, kind=found.kind, as2_id=found.address,
                      settings=dict(found.settings),
                      cert_pem=newest.pem if newest else None,
                      key_pem=newest.key_pem if newest else None,
                      updated_at=found.updated_at, certs=certs,
                      gates=gates_of(found.settings, certs),
                      tls_client=next((c for c in every if c.role == TLS_CLIENT), None))


def by_as2_id(session: Session, as2_id: str, kind: str) -> As2Profile | None:
    return _lookup(session, address=as2_id, kind=kind)


def by_party(session: Session, name: str | None) -> As2Profile | None:
    return None if name is None else _lookup(session, party=name)


# --- the per-process cache of the AS2 receiver ------------------------------------------

#: a setting replaced by every transaction that saves or deletes a profile, a certificate
#: or a party (:func:`bump_profiles_version`)
VERSION_KEY = PROFILES_VERSION_KEY


def bump_profiles_version(session: Session) -> None:
    """Call in the transaction that changes a profile, its certificates or its party."""
    bump_version(session, VERSION_KEY)


class ProfileCache:
    """The profiles this process looked up, with the pyas2lib objects built from them
    (keys and certificates loaded), valid while the profiles version read in the
    request's transaction is the one they were read under. Reading the version costs
    one row, which the receiver reads with the routes version in one statement; a save
    in any process is seen by the next request of every process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version: object = None
        self._profiles: dict[tuple[str, str], As2Profile | None] = {}

    def by_as2_id(self, session: Session, version, as2_id: str, kind: str
                  ) -> As2Profile | None:
        """:func:`by_as2_id` through the cache; ``version`` is the VERSION_KEY value read
        in ``session``'s transaction before this call (None when no profile was ever
        saved)."""
        key = (as2_id, kind)
        with self._lock:
            if version is not None and version == self._version and key in self._profiles:
                return self._profiles[key]
        profile = by_as2_id(session, as2_id, kind)  # read after the version: as new
        with self._lock:
            if version != self._version:
                self._version, self._profiles = version, {}
            if version is not None:
                self._profiles[key] = profile
        return profile

    def peek(self, as2_id: str, kind: str) -> As2Profile | None:
        """The profile cached for ``as2_id`` under the version this process last read,
        if any: a guess to look things up by in the statement that reads the version
        (:meth:`by_as2_id` then says what holds)."""
        with self._lock:
            return self._profiles.get((as2_id, kind))

    def clear(self) -> None:
        with self._lock:
            self._version, self._profiles = None, {}


profile_cache = ProfileCache()


# --- what the partner says it is (AS2-Version, EDIINT-Features) ----------------------

#: the settings key of what the partner said of itself (not a choice: PUT cannot set it)
PEER_KEY = "peer_features"


def peer_features(headers) -> dict:
    """The AS2-Version and the EDIINT-Features (RFC 6017: a comma-separated list) of a
    partner's request or answer, ``headers`` any mapping with ``get`` of lower- or
    mixed-case names."""
    def get(name: str) -> str | None:
        value = headers.get(name) or headers.get(name.lower())
        return str(value).strip() if value else None
    features = get("EDIINT-Features")
    return {"as2_version": get("AS2-Version"),
            "features": [f.strip() for f in features.split(",") if f.strip()]
            if features else []}


#: (party, seen_in) -> what this process last found kept for it: a partner says the same
#: on every message, so the profile is read at most once per process until it changes
_PEER_SAID: dict[tuple[str, str], dict] = {}


def note_peer_features(session: Session, partner: As2Profile, headers, seen_in: str,
                       now: datetime) -> bool:
    """Keep on the partner's profile what its ``headers`` say of it when that differs
    from what is kept. A partner says the same on every message: this process
    remembers what it found kept, so the steady state costs no statement; a change
    costs a read and a write of the profile's settings (not of its version: nothing the
    AS2 code caches depends on them). What its messages say is kept over what its
    receipts say (a partner sending us nothing is known by its receipts). In the
    caller's transaction; True when it changed."""
    said = peer_features(headers)
    if seen_in == "receipt" and not (said["as2_version"] or said["features"]):
        return False  # an answer without the headers says nothing
    if _PEER_SAID.get((partner.party, seen_in)) == said:
        return False
    stored = get_protocol_profile(session, PROTOCOL, PARTNER, partner.party)
    if stored is None:
        return False
    kept = stored.settings.get(PEER_KEY) or {}
    if ({k: kept.get(k) for k in said} == said
            or (seen_in == "receipt" and kept.get("seen_in") == "message")):
        _PEER_SAID[(partner.party, seen_in)] = said
        return False
    save_protocol_profile(session, PROTOCOL, PARTNER, partner.party, stored.address, {
        **stored.settings, PEER_KEY: {**said, "seen_at": _iso(now), "seen_in": seen_in}})
    # remembered now: should the caller's transaction roll back (a duplicate raced it),
    # the display waits for the partner's next change or this process's restart
    _PEER_SAID[(partner.party, seen_in)] = said
    return True
