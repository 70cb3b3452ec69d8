"""The ``as2`` profile kind the AS2 types register: the profile functions of
:mod:`.profiles` behind the plugin API's :class:`ProfileKind`, and the page of :mod:`.ui`.
Neither of those imports this module, so the three make no circle."""

from __future__ import annotations

from sqlalchemy.orm import Session

from b2bhub.plugin import ProfileKind, utcnow
from plugins.as2 import presets, profiles


class _Saved(dict):
    """A saved profile as the API answers it, with the words of a preset chosen in the
    same request for :meth:`As2Profiles.describe` (not part of the answer)."""

    preset_text = ""


class As2Profiles(ProfileKind):
    """The ``as2`` profile kind: ``/{organizations,partners}/<name>/profiles/as2`` and
    its UI page (:mod:`.ui`: certificates are uploaded as files there)."""

    kind = profiles.PROTOCOL
    label = "AS2"
    can_test = True
    #: certificate exchange with a partner (:mod:`.cem`): send our new certificate,
    #: accept or reject one the partner sent
    actions = ("cem_request", "cem_accept", "cem_reject")
    action_parties = ("partner",)  # we send our certificate to a partner, not to us
    has_presets = True

    def fields(self) -> tuple[str, ...]:
        return tuple(profiles.FIELDS)

    def get(self, session: Session, party_kind: str, name: str) -> dict:
        return profiles.profile_json(profiles.get_profile(session, party_kind, name), utcnow())

    def save(self, session: Session, party_kind: str, name: str, body: dict) -> dict:
        saved = profiles.save_profile(session, party_kind, name, body)
        shown = _Saved(profiles.profile_json(saved, utcnow()))
        if body.get(profiles.PRESET) is not None:  # the history line names its switches
            shown.preset_text = presets.applied_text(body[profiles.PRESET], set(body))
        return shown

    def delete(self, session: Session, party_kind: str, name: str) -> None:
        profiles.delete_profile(session, party_kind, name)

    def json_schemas(self) -> dict[str, dict]:
        return profiles.json_schemas()

    def describe(self, profile: dict) -> str:
        return f"AS2 ID {profile['as2_id']}" + (
            f"; {profile.preset_text}" if getattr(profile, "preset_text", "") else "")

    def presets(self) -> list[dict]:
        return [preset.as_json() for preset in presets.PRESETS.values()]

    def preset_schema(self) -> dict:
        source = {"type": "object", "required": ["url", "says"], "properties": {
            "url": {"type": "string"}, "says": {"type": "string"}}}
        return {"type": "object", "required": ["name", "label", "switches", "sources", "notes"],
                "properties": {
                    "name": {"type": "string", "enum": list(presets.NAMES)},
                    "label": {"type": "string"},
                    "switches": {"type": "object", "description": "switch: value, as a "
                                 "PUT of the profile takes them"},
                    "sources": {"type": "object", "additionalProperties": source,
                                "description": "switch: where it is known from"},
                    "notes": {"type": "array", "items": {
                        "type": "object", "required": ["text", "url", "says"],
                        "properties": {"text": {"type": "string"}, **source["properties"]}}}}}

    def test_connection(self, session: Session, name: str, actor: str, options: dict):
        """A partner's connection test (:mod:`.selftest`)."""
        from b2bhub.plugin import payload_store
        from plugins.as2 import selftest
        return selftest.run(session, payload_store(), name, actor,
                            options.get("organization"), float(options.get("wait", 20)))

    def action_schemas(self) -> dict[str, dict]:
        """Each CEM action's body (the API's document)."""
        upload = profiles.UPLOAD_SCHEMA
        which = {"type": "string", "minLength": 1, "maxLength": 300,
                 "description": "the request's RequestID (or its id on the partner page)"}
        return {
            "cem_request": {"type": "object", "additionalProperties": False,
                            "required": ["certificate"], "properties": {
                                "certificate": upload,
                                "organization": {"type": "string", "maxLength": 64},
                                "usages": {"type": "array", "minItems": 1, "items": {
                                    "type": "string", "enum": ["signing", "encryption", "tls"]}},
                                "respond_by": {"type": "string", "format": "date-time"}}},
            "cem_accept": {"type": "object", "additionalProperties": False,
                           "required": ["request_id"], "properties": {"request_id": which}},
            "cem_reject": {"type": "object", "additionalProperties": False,
                           "required": ["request_id"], "properties": {
                               "request_id": which,
                               "reason": {"type": "string", "maxLength": 500}}},
        }

    def run_action(self, session: Session, party_kind: str, name: str, action: str,
                   body: dict, actor: str) -> dict:
        """A CEM step of a partner's profile (:mod:`.cem`; the core offers the actions
        on partners alone, :attr:`action_parties`), its history line naming ``actor``."""
        from b2bhub.plugin import N_, ServiceError, payload_store
        from plugins.as2 import cem
        unknown = set(body) - set(self.action_schemas()[action]["properties"])
        if unknown:
            raise ServiceError(N_("unknown fields: %(fields)s",
                                  fields=", ".join(sorted(unknown))),
                               {f: "unknown" for f in unknown})
        if action == "cem_request":
            return cem.send_request(session, payload_store(), name, body, actor)
        return cem.answer(session, payload_store(), name, action, body, actor)

    def ui_page(self, party, shown: dict | None):
        from plugins.as2.ui import profile_page  # the UI's libraries: in the web only
        return profile_page(self, party, shown)


AS2_PROFILES = As2Profiles()
