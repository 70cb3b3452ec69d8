"""The ``as2`` profile kind the AS2 types register: the profile functions of
:mod:`.profiles` behind the plugin API's :class:`ProfileKind`, and the page of :mod:`.ui`.
Neither of those imports this module, so the three make no circle."""

from __future__ import annotations

from sqlalchemy.orm import Session

from b2bhub.plugin import ProfileKind, utcnow
from plugins.as2 import profiles


class As2Profiles(ProfileKind):
    """The ``as2`` profile kind: ``/{organizations,partners}/<name>/profiles/as2`` and
    its UI page (:mod:`.ui`: certificates are uploaded as files there)."""

    kind = profiles.PROTOCOL
    label = "AS2"
    can_test = True

    def fields(self) -> tuple[str, ...]:
        return tuple(profiles.FIELDS)

    def get(self, session: Session, party_kind: str, name: str) -> dict:
        return profiles.profile_json(profiles.get_profile(session, party_kind, name), utcnow())

    def save(self, session: Session, party_kind: str, name: str, body: dict) -> dict:
        saved = profiles.save_profile(session, party_kind, name, body)
        return profiles.profile_json(saved, utcnow())

    def delete(self, session: Session, party_kind: str, name: str) -> None:
        profiles.delete_profile(session, party_kind, name)

    def json_schemas(self) -> dict[str, dict]:
        return profiles.json_schemas()

    def describe(self, profile: dict) -> str:
        return f"AS2 ID {profile['as2_id']}"

    def test_connection(self, session: Session, name: str, actor: str, options: dict):
        """A partner's connection test (:mod:`.selftest`)."""
        from b2bhub.plugin import payload_store
        from plugins.as2 import selftest
        return selftest.run(session, payload_store(), name, actor,
                            options.get("organization"), float(options.get("wait", 20)))

    def ui_page(self, party, shown: dict | None):
        from plugins.as2.ui import profile_page  # the UI's libraries: in the web only
        return profile_page(self, party, shown)


AS2_PROFILES = As2Profiles()
