"""The core's intake fast path (``b2bhub.engine.endpoint_lookup``), as any source
declares and runs it through ``b2bhub.plugin``: one statement for the instance, the
parties, the settings rows and the endpoint's own values."""

from __future__ import annotations

from sqlalchemy import bindparam, select

from b2bhub.models import Party, PluginInstance, Setting
from b2bhub.plugin import EndpointLookup, Looked
from tests.enginekit import counted_statements

LOOKUP = EndpointLookup(
    "lookup_probe", settings=("probe.a", "probe.missing"), parties=("from_party", "to_party"),
    extra={"same_name": select(PluginInstance.id).where(
        PluginInstance.name == bindparam("instance"),
        PluginInstance.type == bindparam("other_type")).scalar_subquery()})


def _set_up(session) -> None:
    session.add_all([
        Party(name="acme", kind="partner"), Party(name="mycompany", kind="organization"),
        PluginInstance(name="probe", type="lookup_probe", enabled=True,
                       config={"from_party": "acme", "to_party": "", "n": 1}),
        PluginInstance(name="off", type="lookup_probe", enabled=False, config={}),
        PluginInstance(name="alien", type="something_else", config={}),
        Setting(key="probe.a", value={"x": 1})])
    session.commit()


def test_the_instance_its_configured_parties_and_the_settings_in_one_statement(session):
    _set_up(session)
    with counted_statements(session.get_bind()) as counted:
        looked = LOOKUP.run(session, "probe", other_type="lookup_probe")
    assert sum(counted.values()) == 1
    assert looked == Looked(
        enabled=True, config={"from_party": "acme", "to_party": "", "n": 1},
        parties={"from_party": "acme", "to_party": None}, kinds={"acme": "partner"},
        settings={"probe.a": {"x": 1}, "probe.missing": None},
        extra={"same_name": looked.extra["same_name"]})
    assert looked.extra["same_name"] is not None


def test_given_parties_win_over_the_configured_ones_and_unknown_ones_have_no_kind(session):
    _set_up(session)
    looked = LOOKUP.run(session, "probe", parties={"to_party": "mycompany",
                                                   "from_party": "nobody"},
                        other_type="x")
    assert looked.parties == {"from_party": "nobody", "to_party": "mycompany"}
    assert looked.kinds == {"mycompany": "organization"}
    assert looked.extra == {"same_name": None}


def test_a_missing_disabled_or_foreign_instance(session):
    _set_up(session)
    for name, enabled in (("nothing", None), ("off", False), ("alien", None)):
        looked = LOOKUP.run(session, name, extra=())
        assert (looked.enabled, looked.config is None) == (enabled, enabled is None), name


def test_without_the_instance_only_what_was_given_is_read(session):
    _set_up(session)
    looked = LOOKUP.run(session, "probe", look_up_instance=False,
                        parties={"from_party": "acme", "to_party": "mycompany"}, extra=())
    assert (looked.enabled, looked.config) == (None, None)
    assert looked.kinds == {"acme": "partner", "mycompany": "organization"}
    assert looked.extra == {"same_name": None}
    assert LOOKUP.statement(False, ()) is LOOKUP.statement(False, ())  # built once a shape


def test_an_envelope_s_identities_and_the_instance_s_parties_from_in_the_same_statement(
        session):
    """docs/edi.md: a receiver reads the parties of a preread body's envelope with the rest."""
    from b2bhub.models import PartyIdentity

    _set_up(session)
    acme = session.query(Party).filter_by(name="acme").one()
    session.add(PartyIdentity(party_id=acme.id, qualifier="ZZ", identifier="ACME"))
    session.commit()
    lookup = EndpointLookup("lookup_probe", settings=("probe.a",),
                            identities=("sender", "receiver"))
    with counted_statements(session.get_bind()) as counted:
        looked = lookup.run(session, "probe", identities={"sender": "ZZ:ACME",
                                                          "receiver": "ZZ:NOBODY"})
    assert sum(counted.values()) == 1
    assert looked.identities == {"ZZ:ACME": ("acme", "partner")}
    assert looked.parties_from == "source" and looked.enabled is True
    # none given: the statement has no part for them
    assert lookup.run(session, "probe").identities == {}
