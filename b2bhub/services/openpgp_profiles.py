"""The ``openpgp`` party profile (docs/openpgp.md): a partner's public key; an
organization's key pair (private key and passphrase, never shown again).

The core's own profile kind, served like the kinds plugins add
(``/{organizations,partners}/<name>/profiles/openpgp``, ``/ui/parties/<kind>/<name>/
openpgp``). Each key is read by ``gpg`` when it is saved: one that is not a key, a
private key where a public one belongs (or the other way round), an expired key, a key
that cannot encrypt, or a passphrase that does not unlock the private key is refused
with the reason. Stored in ``protocol_profiles`` (protocol ``openpgp``, the address is
the key's fingerprint), with the key's validity as a certificate row, so that a key
about to expire is flagged as an AS2 certificate is (``certificate_expiring``).
"""

from __future__ import annotations

import re

from sqlalchemy.orm import Session

from b2bhub.domain.i18n import N_
from b2bhub.engine import openpgp
from b2bhub.engine.openpgp_stages import PROTOCOL
from b2bhub.models import ORGANIZATION, PARTNER, utcnow
from b2bhub.plugin import ProfileKind
from b2bhub.plugin.schema import Field
from b2bhub.services.config import SECRET_MASK, no_profile
from b2bhub.services.errors import NotFound, ServiceError
from b2bhub.services.profiles import certificate_alert
from b2bhub.services.protocol import (
    NewCertificate,
    delete_protocol_profile,
    get_protocol_profile,
    save_protocol_profile,
)

_ARMOR = re.compile(r"(-----BEGIN PGP (?:PUBLIC|PRIVATE) KEY BLOCK-----)(.*?)"
                    r"(-----END PGP (?:PUBLIC|PRIVATE) KEY BLOCK-----)", re.S)


def normalize_armor(text: str) -> str:
    """An armored key as gpg reads it. A key pasted into a one-line field (a browser
    drops its line breaks) is laid out again: header, blank line, the base64 in lines
    of 64, its checksum line (``=XXXX``) and footer."""
    text = text.strip().replace("\r\n", "\n")
    found = _ARMOR.search(text)
    if found is None or "\n" in found.group(2).strip():
        return text + "\n" if text else text
    body = re.sub(r"\s+", "", found.group(2))
    checksum = ""
    if len(body) > 5 and body[-5] == "=" and "=" not in body[-4:]:
        body, checksum = body[:-5], body[-5:]
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return "\n".join([found.group(1), "", *lines, *([checksum] if checksum else []),
                      found.group(3)]) + "\n"


class OpenPGPProfiles(ProfileKind):
    """The ``openpgp`` profile kind (module docstring)."""

    kind = PROTOCOL
    label = "OpenPGP"
    certificate_name = "OpenPGP key"
    shown = (("Fingerprint", "fingerprint"), ("User IDs", "user_ids"),
             ("Expires", "expires"), ("Key and subkeys", "fingerprints"))
    schema = [
        Field("public_key", "string", label="Public key (partner, armored)",
              help="The partner's public key as `gpg --armor --export` gives it"),
        Field("private_key", "secret", label="Private key (organization, armored)",
              help="Our key pair as `gpg --armor --export-secret-keys` gives it; never "
                   "shown again"),
        Field("passphrase", "secret", label="Passphrase (organization)",
              help="The private key's passphrase (empty for none); never shown again"),
    ]

    def get(self, session: Session, party_kind: str, name: str) -> dict:
        stored = get_protocol_profile(session, PROTOCOL, party_kind, name)
        if stored is None:
            raise NotFound(no_profile(party_kind, name, "OpenPGP"))
        return _shown(party_kind, name, stored.settings)

    def save(self, session: Session, party_kind: str, name: str, body: dict) -> dict:
        stored = get_protocol_profile(session, PROTOCOL, party_kind, name)
        before = dict(stored.settings) if stored is not None else {}
        settings = (_partner_key(body, before) if party_kind == PARTNER
                    else _key_pair(body, before))
        info = settings.pop("_info")
        settings.update(fingerprint=info.fingerprint, fingerprints=list(info.fingerprints),
                        user_ids=list(info.user_ids),
                        expires=info.expires.isoformat() if info.expires else None)
        saved = save_protocol_profile(
            session, PROTOCOL, party_kind, name, info.fingerprint, settings,
            remove=[c.id for c in stored.certificates] if stored is not None else (),
            add=[NewCertificate("openpgp", settings["public_key"], None,
                                ", ".join(info.user_ids) or info.fingerprint,
                                info.fingerprint, None,
                                info.expires.replace(tzinfo=None) if info.expires
                                else None)])
        session.flush()
        for cert in saved.certificates:  # the one just saved: flagged at once
            certificate_alert(session, name, self.certificate_name, cert, utcnow())
        return _shown(party_kind, name, settings)

    def delete(self, session: Session, party_kind: str, name: str) -> None:
        delete_protocol_profile(session, PROTOCOL, party_kind, name)

    def describe(self, profile: dict) -> str:
        return f"key {profile['fingerprint']}"

    def json_schemas(self) -> dict[str, dict]:
        secret = {"type": "string", "description": f"never shown again; {SECRET_MASK} "
                                                   "keeps the stored one"}
        return {
            "body": {"type": "object", "additionalProperties": False,
                     "properties": {
                         "public_key": {"type": "string", "description":
                                        "a partner's armored public key"},
                         "private_key": {**secret, "description": "an organization's "
                                         "armored private key; " + secret["description"]},
                         "passphrase": secret}},
            "answer": {"type": "object", "properties": {
                "party": {"type": "string"}, "fingerprint": {"type": "string"},
                "fingerprints": {"type": "array", "items": {"type": "string"}},
                "user_ids": {"type": "array", "items": {"type": "string"}},
                "expires": {"type": "string", "nullable": True}, "public_key": {"type": "string"},
                "private_key": {"type": "string"}, "passphrase": {"type": "string"}}},
            "server_checks": ["public_key", "private_key", "passphrase"],
        }


def _refuse(field: str, text: str):
    raise ServiceError(N_("%(field)s: %(problem)s", field=field, problem=text), {field: text})


def _partner_key(body: dict, before: dict) -> dict:
    if body.get("private_key") not in (None, "", SECRET_MASK) or body.get("passphrase"):
        _refuse("private_key", N_("a partner's profile holds its public key only; our key "
                                  "pair belongs to an organization's profile"))
    given = body.get("public_key")
    if given is None and before:
        return {**before, "_info": _read("public_key", before["public_key"], False, "")}
    if not isinstance(given, str):
        _refuse("public_key", N_("required: the partner's armored public key"))
    key = normalize_armor(given)
    return {"public_key": key, "_info": _read("public_key", key, False, "")}


def _key_pair(body: dict, before: dict) -> dict:
    if body.get("public_key"):
        _refuse("public_key", N_("an organization's public key is the one of its private "
                                 "key; give the private key"))
    given, phrase = body.get("private_key"), body.get("passphrase")
    key = before.get("private_key") if given in (None, "", SECRET_MASK) else given
    if phrase in (None, SECRET_MASK):
        phrase = before.get("passphrase", "")
    if not isinstance(key, str) or not key:
        _refuse("private_key", N_("required: our armored private key (and its passphrase)"))
    if not isinstance(phrase, str):
        _refuse("passphrase", N_("must be text"))
    key = normalize_armor(key)
    info = _read("private_key", key, True, phrase)
    with openpgp.keyring(key) as gpg:
        public = gpg.export_keys(info.fingerprint)
    return {"private_key": key, "passphrase": phrase, "public_key": public, "_info": info}


def _read(field: str, key: str, secret: bool, passphrase: str) -> openpgp.KeyInfo:
    try:
        return openpgp.inspect_key(key, secret=secret, passphrase=passphrase)
    except openpgp.KeyProblem as exc:
        problem = exc.args[0]  # a Text: shown in the reader's language
        if "passphrase" in problem:
            _refuse("passphrase", problem)
        _refuse(field, problem)


def _shown(party_kind: str, name: str, settings: dict) -> dict:
    """The profile as the API and the UI show it: secrets masked."""
    shown = {"party": name, "fingerprint": settings.get("fingerprint"),
             "fingerprints": settings.get("fingerprints", []),
             "user_ids": settings.get("user_ids", []), "expires": settings.get("expires"),
             "public_key": settings.get("public_key", "")}
    if party_kind == ORGANIZATION:
        shown["private_key"] = SECRET_MASK if settings.get("private_key") else ""
        shown["passphrase"] = SECRET_MASK if settings.get("passphrase") else ""
    return shown


OPENPGP_PROFILES = OpenPGPProfiles()
