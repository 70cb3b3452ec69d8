"""The ``sftp`` party profile kind: a partner's SFTP server and how we log in there
(docs/sftp.md).

A ``protocol_profiles`` row (protocol ``sftp``, ``address`` ``user@host:port``) whose
settings hold the connection fields of :data:`.connection.CONNECTION_FIELDS`. Secrets
(password, private key, passphrase) are taken by a PUT and shown as ``********`` from
then on; a PUT that leaves one out, or sends ``********`` back, keeps it; ``null`` or
``""`` removes it.

The host key is never part of a PUT: it is pinned only by an operator's action
(:meth:`SftpProfiles.run_action`), each of which writes a ``config_changed`` line
naming the operator:

* ``fetch_host_key``: connects, reads the key the server offers and answers it with its
  fingerprint (``SHA256:...``) for the operator to compare with what the partner said;
  nothing is pinned.
* ``pin_host_key`` with ``fingerprint`` (what the operator confirmed) and optionally
  ``key`` (a pasted ``ssh-ed25519 AAAA...`` or known_hosts line): without a key, the
  server's key is fetched again and pinned only when its fingerprint is the confirmed
  one; with one, the pasted key is pinned when its fingerprint is the confirmed one
  (``fingerprint`` may then be left out).
* ``unpin_host_key``: removes the pinned key (no connection until one is pinned again).
"""

from __future__ import annotations

from typing import Any

from b2bhub.plugin import (
    N_,
    NotFound,
    ProfileKind,
    ServiceError,
    add_line,
    bump_version,
    delete_protocol_profile,
    find_protocol_profile,
    get_protocol_profile,
    joined,
    new_session,
    no_profile,
    save_protocol_profile,
)
from b2bhub.plugin.schema import ConfigError, schema_to_json, validate_config
from plugins.sftp.connection import (
    CONNECTION_FIELDS,
    SECRET_FIELDS,
    Endpoint,
    HostKey,
    SftpError,
    fetch_host_key,
)

PROTOCOL = "sftp"
MASK = "********"
VERSION_KEY = "sftp_profiles_version"
#: the fields a PUT takes: the connection's, without the host key (pinned by actions)
SCHEMA = [f for f in CONNECTION_FIELDS if f.name != "host_key"]
ACTIONS = ("fetch_host_key", "pin_host_key", "unpin_host_key")


def _stored(session, kind: str, name: str):
    return get_protocol_profile(session, PROTOCOL, kind, name)  # NotFound: no party


def profile_json(profile) -> dict:
    """The API shape: settings with defaults, secrets masked, the pinned key and its
    fingerprint."""
    settings = dict(profile.settings)
    shown: dict[str, Any] = {"party": profile.party, "kind": profile.kind}
    for field in SCHEMA:
        value = settings.get(field.name, field.default)
        shown[field.name] = (MASK if value else None) if field.type == "secret" else value
    key = settings.get("host_key")
    shown["host_key"] = key
    shown["host_key_fingerprint"] = HostKey.parse(key).fingerprint if key else None
    return shown


class SftpProfiles(ProfileKind):
    """The ``sftp`` profile kind (module docstring)."""

    kind = PROTOCOL
    label = "SFTP"
    schema = SCHEMA
    actions = ACTIONS

    def fields(self) -> tuple[str, ...]:
        return tuple(f.name for f in SCHEMA)

    def get(self, session, party_kind: str, name: str) -> dict:
        profile = _stored(session, party_kind, name)
        if profile is None:
            raise NotFound(no_profile(party_kind, name, "SFTP"))
        return profile_json(profile)

    def save(self, session, party_kind: str, name: str, body: dict) -> dict:
        unknown = set(body) - set(self.fields())
        if unknown:
            raise ServiceError(N_("unknown fields: %(fields)s",
                                  fields=", ".join(sorted(unknown))),
                               {f: "unknown" for f in unknown})
        profile = _stored(session, party_kind, name)
        settings = dict(profile.settings) if profile else {}
        given = {k: v for k, v in body.items()
                 if not (k in SECRET_FIELDS and v == MASK)}
        merged = {f.name: settings.get(f.name) for f in SCHEMA}
        merged.update(given)
        try:
            clean = validate_config(SCHEMA, merged, strict=False)
        except ConfigError as exc:
            raise ServiceError(N_("invalid SFTP profile: %(problems)s", problems=joined(
                N_("%(field)s %(problem)s", field=k, problem=v)
                for k, v in exc.errors.items())), dict(exc.errors)) from None
        for secret in SECRET_FIELDS:
            if secret in body and body[secret] in (None, ""):
                clean[secret] = None
            elif secret not in given:
                clean[secret] = settings.get(secret)
        problems = {k: v for k, v in Endpoint.from_config(clean).problems().items()
                    if k != "host_key"}
        if clean.get("private_key"):
            from plugins.sftp.connection import load_private_key
            try:
                load_private_key(clean["private_key"], clean.get("passphrase"))
            except ValueError as exc:
                problems["private_key"] = exc.args[0]  # a Text: the reader's language
        if problems:
            raise ServiceError(N_("invalid SFTP profile: %(problems)s", problems=joined(
                N_("%(field)s %(problem)s", field=k, problem=v)
                for k, v in problems.items())), problems)
        clean["host_key"] = settings.get("host_key")
        saved = save_protocol_profile(session, PROTOCOL, party_kind, name,
                                      _address(clean), clean)
        bump_version(session, VERSION_KEY)
        session.flush()
        return profile_json(saved)

    def delete(self, session, party_kind: str, name: str) -> None:
        if _stored(session, party_kind, name) is None:
            raise NotFound(no_profile(party_kind, name, "SFTP"))
        delete_protocol_profile(session, PROTOCOL, party_kind, name)
        bump_version(session, VERSION_KEY)
        session.flush()

    def describe(self, profile: dict) -> str:
        return f"{profile['username']}@{profile['host']}:{profile['port']}"

    def json_schemas(self) -> dict[str, dict]:
        body = {**schema_to_json(SCHEMA), "required": []}
        body["description"] = ("Fields left out keep their stored values; a secret sent "
                               f"back as {MASK} keeps it. The host key is pinned by the "
                               "profile's actions (fetch_host_key, pin_host_key).")
        return {"body": body, "answer": {"type": "object"},
                "server_checks": ["private_key", "host", "username", "password"]}

    def ui_page(self, party, shown: dict | None):
        from plugins.sftp.ui import profile_page  # the UI's libraries: in the web only
        return profile_page(self, party, shown)

    # --- the operator's actions on the host key ----------------------------------------
    def action_schemas(self) -> dict[str, dict]:
        """Each action's body as JSON Schema (the API's document)."""
        fingerprint = {"type": "string", "pattern": "^SHA256:[A-Za-z0-9+/]{43}$"}
        return {
            "fetch_host_key": {"type": "object", "additionalProperties": False,
                               "properties": {}},
            "pin_host_key": {"type": "object", "additionalProperties": False,
                             "properties": {"fingerprint": fingerprint,
                                            "key": {"type": "string", "maxLength": 16384}}},
            "unpin_host_key": {"type": "object", "additionalProperties": False,
                               "properties": {}},
        }

    def run_action(self, session, party_kind: str, name: str, action: str, body: dict,
                   actor: str) -> dict:
        """One of :data:`ACTIONS` (module docstring); the answer as JSON."""
        profile = _stored(session, party_kind, name)
        if profile is None:
            raise NotFound(N_("%(missing)s: save its host and user first",
                              missing=no_profile(party_kind, name, "SFTP")))
        settings = dict(profile.settings)
        where = f"{settings.get('host')}:{settings.get('port') or 22}"
        whose = f"the SFTP profile of {party_kind} {name}"
        unknown = set(body) - set(self.action_schemas()[action]["properties"])
        if unknown:
            raise ServiceError(N_("unknown fields: %(fields)s",
                                  fields=", ".join(sorted(unknown))),
                               {f: "unknown" for f in unknown})
        if action == "fetch_host_key":
            offered = fetch(settings)
            _line(session, actor, f"fetched the host key of {where} for {whose}: "
                  f"{offered.type} {offered.fingerprint} (not pinned)")
            return {"host": settings.get("host"), "port": settings.get("port") or 22,
                    "key": offered.line, "key_type": offered.type,
                    "fingerprint": offered.fingerprint, "pinned": False}
        if action == "unpin_host_key":
            settings["host_key"] = None
            _save_settings(session, party_kind, name, profile, settings)
            _line(session, actor, f"removed the pinned host key of {whose}")
            return profile_json(_stored(session, party_kind, name))
        key, how = key_to_pin(settings, body)
        settings["host_key"] = key.line
        _save_settings(session, party_kind, name, profile, settings)
        _line(session, actor, f"pinned the {how} host key {key.type} {key.fingerprint} "
              f"of {where} for {whose}")
        return profile_json(_stored(session, party_kind, name))


def key_to_pin(settings: dict, body: dict) -> tuple[HostKey, str]:
    """The key a ``pin_host_key`` body confirms, and how it came ("pasted" or
    "fetched"): a pasted ``key`` (its fingerprint must be ``fingerprint`` when that is
    given too), or the server's key fetched again now, pinned only when its fingerprint
    is the confirmed one."""
    confirmed = body.get("fingerprint")
    if body.get("key"):
        try:
            key = HostKey.parse(body["key"])
        except ValueError as exc:
            raise ServiceError(N_("key: %(problem)s", problem=exc.args[0]),
                               {"key": exc.args[0]}) from None
        how = "pasted"
    else:
        if not confirmed:
            raise ServiceError(N_("give the fingerprint you confirmed (or a key)"),
                               {"fingerprint": "required"})
        key = fetch(settings)
        how = "fetched"
    if confirmed and confirmed != key.fingerprint:
        said = (N_("the pasted key's fingerprint is %(found)s, not the confirmed "
                   "%(confirmed)s; nothing pinned") if how == "pasted" else
                N_("the fetched key's fingerprint is %(found)s, not the confirmed "
                   "%(confirmed)s; nothing pinned"))
        raise ServiceError(N_(said, found=key.fingerprint, confirmed=confirmed),
                           {"fingerprint": "does not match"})
    return key, how


def fetch(settings: dict) -> HostKey:
    try:
        return fetch_host_key(settings.get("host") or "", int(settings.get("port") or 22),
                              float(settings.get("connect_timeout") or 15))
    except SftpError as exc:
        raise ServiceError(N_("could not fetch the host key: %(why)s", why=exc.text),
                           {"host": exc.error_class}) from None


def _save_settings(session, party_kind, name, profile, settings) -> None:
    save_protocol_profile(session, PROTOCOL, party_kind, name, profile.address, settings)
    bump_version(session, VERSION_KEY)
    session.flush()


def _line(session, actor: str, text: str) -> None:
    add_line(session, None, "config_changed", f"{actor}: {text}", actor=actor)


def _address(settings: dict) -> str:
    return f"{settings.get('username')}@{settings.get('host')}:{settings.get('port') or 22}"


def endpoint_of_partner(name: str) -> Endpoint:
    """The connection of party ``name``'s ``sftp`` profile, read now; SftpError
    (``remote``) when it has none."""
    session = new_session()
    try:
        found = find_protocol_profile(session, PROTOCOL, party=name)
    finally:
        session.close()
    if found is None:
        raise SftpError("remote", f"{name} has no SFTP profile")
    return Endpoint.from_config(found.settings)


PROFILE_KIND = SftpProfiles()
