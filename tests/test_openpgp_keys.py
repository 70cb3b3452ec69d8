"""The ``openpgp`` party profile through the REST API and the UI: keys read by gpg on
save, each wrong key refused with its reason, secrets never shown again, fingerprints
shown, a change named in the history by the operator (UI)."""

from __future__ import annotations

import subprocess

import pytest
from sqlalchemy import select

from b2bhub.models import HistoryLine
from tests.openpgp_kit import ORG_PASSPHRASE, keys_in

ORG = "/api/v1/organizations/mycompany/profiles/openpgp"
PARTNER = "/api/v1/partners/acme/profiles/openpgp"


@pytest.fixture(scope="module")
def keys(tmp_path_factory, openpgp_keys):
    yield from keys_in(tmp_path_factory.mktemp("gpg"), openpgp_keys)


@pytest.fixture
def parties(hub):
    hub.parties(organizations=("mycompany",), partners=("acme",))


def test_a_partners_public_key_is_read_and_its_fingerprint_shown(api, parties, keys):
    answer = api.put(PARTNER, json={"public_key": keys.partner.public})
    assert answer.status_code == 200, answer.json
    assert answer.json["fingerprint"] == keys.partner.fingerprint
    assert answer.json["user_ids"] == ["ACME EDI <edi@acme.example>"]
    assert answer.json["expires"] is not None
    got = api.get(PARTNER).json
    assert got["fingerprint"] == keys.partner.fingerprint
    assert "BEGIN PGP PUBLIC KEY BLOCK" in got["public_key"]
    assert "private_key" not in got


def test_our_key_pair_is_kept_and_its_secrets_never_shown_again(api, session, parties,
                                                                keys):
    answer = api.put(ORG, json={"private_key": keys.org.private,
                                "passphrase": ORG_PASSPHRASE})
    assert answer.status_code == 200, answer.json
    for shown in (answer.json, api.get(ORG).json):
        assert shown["fingerprint"] == keys.org.fingerprint
        assert shown["private_key"] == "********" and shown["passphrase"] == "********"
        assert "PRIVATE" not in str(shown) and ORG_PASSPHRASE not in str(shown)
        # the public key of the pair, for the partner to encrypt to
        assert "BEGIN PGP PUBLIC KEY BLOCK" in shown["public_key"]
    # sent back masked, the stored secrets stay (the passphrase is checked again)
    again = api.put(ORG, json={"private_key": "********", "passphrase": "********"})
    assert again.status_code == 200, again.json
    # a wrong passphrase for the stored key is refused, and changes nothing
    wrong = api.put(ORG, json={"passphrase": "not it"})
    assert wrong.status_code == 422  # valid in shape; only gpg can judge it
    assert wrong.json["error"]["details"] == {
        "passphrase": "the passphrase does not unlock the private key"}
    assert api.get(ORG).json["fingerprint"] == keys.org.fingerprint
    # each change a history line naming the token's user, never a secret
    said = [(line.actor, line.text) for line in session.scalars(select(HistoryLine).where(
        HistoryLine.type == "config_changed").order_by(HistoryLine.id))]
    assert said == [("tests", f"tests: {done} the OpenPGP profile of organization mycompany "
                              f"(key {keys.org.fingerprint})") for done in ("created", "changed")]
    assert api.delete(ORG).status_code == 204
    assert session.scalars(select(HistoryLine.text).order_by(HistoryLine.id.desc())).first() \
        == "tests: deleted the OpenPGP profile of organization mycompany"


@pytest.mark.parametrize("where, body, field, words", [
    ("partner", {"public_key": "hello"}, "public_key", "not an armored OpenPGP public key"),
    ("partner", {"public_key": "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nAAAA\n"
                               "-----END PGP PUBLIC KEY BLOCK-----\n"},
     "public_key", "gpg read no key"),
    ("partner", "private", "public_key", "this is a private key"),
    ("partner", "expired", "public_key", "expired on"),
    ("organization", "public", "private_key", "not an armored private key"),
    ("organization", "wrong passphrase", "passphrase",
     "the passphrase does not unlock the private key"),
    ("organization", {"private_key": ""}, "private_key", "required"),
])
def test_a_wrong_key_is_refused_with_its_reason(api, parties, keys, where, body, field,
                                                words):
    body = {"private": {"public_key": keys.partner.private},
            "expired": {"public_key": keys.expired_public},
            "public": {"private_key": keys.partner.public},
            "wrong passphrase": {"private_key": keys.org.private, "passphrase": "nope"},
            }.get(body, body) if isinstance(body, str) else body
    answer = api.put(PARTNER if where == "partner" else ORG, json=body)
    assert answer.status_code == 422, answer.json  # a key only gpg can judge
    assert words in answer.json["error"]["details"][field]
    assert api.get(PARTNER if where == "partner" else ORG).status_code == 404


def test_the_ui_form_takes_a_key_pasted_on_one_line_and_names_the_operator(
        app, client, session, parties, keys):
    from b2bhub.services.users import create_user
    create_user(session, "olivia", "pw-pw-pw-pw-1", "admin")
    session.commit()
    assert client.post("/ui/login", data={"name": "olivia",
                                          "password": "pw-pw-pw-pw-1"}).status_code == 302
    one_line = keys.org.private.replace("\n", "")  # as a browser's one-line field sends it
    page = client.post("/ui/parties/organization/mycompany/openpgp", data={
        "private_key": one_line, "passphrase": ORG_PASSPHRASE, "public_key": ""})
    assert page.status_code == 302, page.text
    shown = client.get("/ui/parties/organization/mycompany/openpgp").text
    assert f"<dt>Fingerprint</dt><dd>{keys.org.fingerprint}</dd>" in shown
    assert "<dt>User IDs</dt><dd>My Company &lt;b2b@mycompany.example&gt;</dd>" in shown
    assert ORG_PASSPHRASE not in shown
    assert "PRIVATE KEY" not in shown
    line = session.scalars(select(HistoryLine).where(
        HistoryLine.type == "config_changed").order_by(HistoryLine.id.desc())).first()
    assert line.actor == "olivia" and "OpenPGP profile of organization mycompany" in line.text
    assert keys.org.fingerprint in line.text


def test_every_target_and_every_source_that_applies_them_have_the_openpgp_fields():
    from b2bhub.plugin.registry import PluginRegistry
    registry = PluginRegistry()
    registry.load()
    fields = {name: {f.name for f in cls.config_schema if f.name.startswith("openpgp_")}
              for name, cls in registry.types().items()}
    for name in registry.targets():
        assert {"openpgp_encrypt", "openpgp_sign"} <= fields[name], name
    for name in ("file_poller", "http_collector", "http_receiver"):
        assert {"openpgp_decrypt", "openpgp_verify"} <= fields[name], name
    # the AS2 receiver stores its messages itself and does not apply them: not offered
    assert fields["as2_receiver"] == set()


def test_the_instance_form_and_the_api_schema_show_the_openpgp_fields(registry, client,
                                                                     api, session):
    from b2bhub.services.users import create_user
    from plugins.file_writer import FileWriter
    registry.register(FileWriter)
    answer = api.get("/api/v1/plugins/types").json
    [writer] = [t for t in answer["items"] if t["name"] == "file_writer"]
    assert {"openpgp_encrypt", "openpgp_sign"} <= set(writer["schema"]["properties"])
    create_user(session, "olivia", "pw-pw-pw-pw-1", "admin")
    session.commit()
    client.post("/ui/login", data={"name": "olivia", "password": "pw-pw-pw-pw-1"})
    page = client.get("/ui/plugins/new/file_writer").text
    assert "OpenPGP: encrypt" in page and "OpenPGP: sign" in page


def test_a_key_ending_within_30_days_raises_certificate_expiring_named_as_a_key(
        api, session, parties, keys, hub):
    """The hourly check (beat's ``b2bhub.check_certificates``) covers every profile
    kind: an OpenPGP key ending within 30 days is flagged as an AS2 certificate is, and
    named as what it is; the alert goes once the key no longer ends soon."""
    from datetime import timedelta

    from b2bhub.models import Alert, utcnow
    from b2bhub.services.profiles import check_certificates

    def open_alerts() -> list[str]:
        session.expire_all()
        return [a.text for a in session.scalars(select(Alert).where(
            Alert.kind == "certificate_expiring", Alert.resolved_at.is_(None)))]

    assert api.put(PARTNER, json={"public_key": keys.partner.public}).status_code == 200
    assert open_alerts() == []  # a year left: nothing said on save
    later = utcnow() + timedelta(days=350)
    assert check_certificates(session, hub.registry, later) == 1
    session.commit()
    [text] = open_alerts()
    assert text.startswith("the OpenPGP key of acme (ACME EDI <edi@acme.example>) "
                           "expires "), text
    assert check_certificates(session, hub.registry, utcnow()) == 0  # renewed, say
    session.commit()
    assert open_alerts() == []


def test_saving_a_key_that_ends_soon_raises_the_alert_at_once(api, session, parties,
                                                              tmp_path):
    from b2bhub.models import Alert
    from tests.openpgp_kit import Party
    soon = Party(tmp_path / "soon", "", "", "", "")
    soon.home.mkdir(mode=0o700)
    soon.gpg("--quick-gen-key", "Soon <soon@acme.example>", "ed25519", "sign,cert", "10d")
    fingerprint = next(line.split(":")[9] for line in soon.gpg(
        "--list-keys", "--with-colons").stdout.decode().splitlines()
        if line.startswith("fpr:"))
    soon.gpg("--quick-add-key", fingerprint, "cv25519", "encr", "10d")
    public = soon.gpg("--armor", "--export").stdout.decode()
    try:
        answer = api.put(PARTNER, json={"public_key": public})
        assert answer.status_code == 200, answer.json
    finally:
        subprocess.run(["gpgconf", "--homedir", str(soon.home), "--kill", "gpg-agent"],
                       capture_output=True, timeout=30, check=False)
    session.expire_all()
    [alert] = session.scalars(select(Alert).where(Alert.kind == "certificate_expiring"))
    assert alert.text.startswith("the OpenPGP key of acme (Soon <soon@acme.example>) "
                                 "expires "), alert.text


def test_a_wrong_key_is_refused_in_the_readers_language(keys):
    """The key's refusal is one text: English as the API answers it (above), and the
    same text shown through the catalog on a page read in Portuguese."""
    from pathlib import Path

    from babel.support import Translations

    from b2bhub.domain.i18n import shown
    from b2bhub.engine import openpgp
    with pytest.raises(openpgp.KeyProblem) as refused:
        openpgp.inspect_key(keys.org.public, secret=True, passphrase="")
    problem = refused.value.args[0]
    assert problem == ("not an armored private key (-----BEGIN PGP PRIVATE KEY "
                       "BLOCK-----); our key pair needs the private key (this is a public "
                       "key)")
    portuguese = Translations.load(str(Path(__file__).resolve().parent.parent / "b2bhub"
                                       / "translations"), ["pt_BR"])
    assert shown(problem, portuguese.gettext) == (
        "não é uma chave privada em formato armored (-----BEGIN PGP PRIVATE KEY "
        "BLOCK-----); o nosso par de chaves precisa da chave privada (esta é uma chave "
        "pública)")
