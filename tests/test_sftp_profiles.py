"""The ``sftp`` party profile through the API against a real OpenSSH server: secrets
shown as ``********`` once saved, and the host key pinned only by an operator's action
(fetch, compare the SHA256 fingerprint, confirm; or a pasted key), each action in the
history with the operator's name."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from b2bhub.models import HistoryLine
from plugins.sftp.connection import POOL, Connection, Endpoint, HostKey, SftpError
from plugins.sftp.writer import SftpWriter
from tests.sshd_server import PASSWORD, USER, SshServer, keygen

PROFILE = "/api/v1/partners/acme/profiles/sftp"


@pytest.fixture(autouse=True)
def _sftp(registry, hub):
    registry.register(SftpWriter)
    hub.parties()
    yield
    POOL.close_all()


def config_lines(session) -> list[tuple[str, str]]:
    return session.execute(select(HistoryLine.actor, HistoryLine.text).where(
        HistoryLine.type == "config_changed").order_by(HistoryLine.id)).all()


def save(api, sshd, **more):
    answer = api.put(PROFILE, json={"host": "127.0.0.1", "port": sshd.port,
                                    "username": USER, "password": PASSWORD, **more})
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()


def test_secrets_are_shown_masked_and_kept_when_sent_back(api, sshd, tmp_path):
    key = keygen(tmp_path / "id", "ed25519")
    shown = save(api, sshd, private_key=key.read_text())
    assert shown["password"] == shown["private_key"] == "********"
    assert shown["passphrase"] is None
    assert PASSWORD not in api.get(PROFILE).get_data(as_text=True)
    assert "PRIVATE KEY" not in api.get(PROFILE).get_data(as_text=True)
    # the mask sent back keeps the secret; a change of another field keeps them too
    again = api.put(PROFILE, json={"password": "********", "port": sshd.port})
    assert again.status_code == 200
    assert again.get_json()["password"] == "********"
    from b2bhub.plugin import find_protocol_profile
    from b2bhub.runtime.hub import new_session
    with new_session() as session:
        stored = find_protocol_profile(session, "sftp", party="acme").settings
    assert stored["password"] == PASSWORD and stored["private_key"] == key.read_text()
    # null removes one
    assert api.put(PROFILE, json={"private_key": None}).get_json()["private_key"] is None


def test_saves_and_deletes_through_the_api_are_in_the_history_with_the_caller(
        api, sshd, session):
    save(api, sshd)
    save(api, sshd, port=sshd.port)
    assert api.delete(PROFILE).status_code == 204
    where = f"{USER}@127.0.0.1:{sshd.port}"
    assert config_lines(session)[-3:] == [
        ("tests", f"tests: created the SFTP profile of partner acme ({where})"),
        ("tests", f"tests: changed the SFTP profile of partner acme ({where})"),
        ("tests", "tests: deleted the SFTP profile of partner acme")]


def test_a_bad_private_key_or_no_credential_is_refused(api, sshd):
    bad = api.put(PROFILE, json={"host": "h", "username": "u",
                                 "private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n"})
    assert bad.status_code == 422  # valid in shape; only the key's parser can judge it
    assert "private_key" in bad.get_json()["error"]["details"]
    none = api.put(PROFILE, json={"host": "h", "username": "u"})
    assert none.status_code == 422  # a password or a key: the two fields together
    assert "password" in none.get_json()["error"]["details"]


def test_the_host_key_cannot_be_set_by_a_save(api, sshd):
    refused = api.put(PROFILE, json={"host": "h", "username": "u", "password": "p",
                                     "host_key": sshd.host_key})
    assert refused.status_code == 400


def test_fetch_shows_the_fingerprint_and_pins_nothing_then_confirm_pins_it(
        api, sshd, session):
    save(api, sshd)
    fetched = api.post(f"{PROFILE}/actions/fetch_host_key", json={})
    assert fetched.status_code == 200
    answer = fetched.get_json()
    assert answer["fingerprint"] == sshd.fingerprint()  # what ssh-keygen -l says
    assert answer["key"] == sshd.host_key and answer["pinned"] is False
    assert api.get(PROFILE).get_json()["host_key"] is None

    pinned = api.post(f"{PROFILE}/actions/pin_host_key",
                      json={"fingerprint": answer["fingerprint"]})
    assert pinned.status_code == 200
    assert pinned.get_json()["host_key"] == sshd.host_key
    assert pinned.get_json()["host_key_fingerprint"] == sshd.fingerprint()
    lines = config_lines(session)
    assert lines[-2] == ("tests", f"tests: fetched the host key of 127.0.0.1:{sshd.port} for "
                         f"the SFTP profile of partner acme: ssh-ed25519 "
                         f"{sshd.fingerprint()} (not pinned)")
    assert lines[-1] == ("tests", f"tests: pinned the fetched host key ssh-ed25519 "
                         f"{sshd.fingerprint()} of 127.0.0.1:{sshd.port} for the SFTP "
                         "profile of partner acme")


def test_confirming_a_fingerprint_the_server_no_longer_offers_pins_nothing(
        api, session, tmp_path):
    server = SshServer(tmp_path / "sshd")
    try:
        api.put(PROFILE, json={"host": "127.0.0.1", "port": server.port, "username": USER,
                               "password": PASSWORD})
        seen = api.post(f"{PROFILE}/actions/fetch_host_key", json={}).get_json()
        server.new_host_key()  # between the operator's look and the confirmation
        refused = api.post(f"{PROFILE}/actions/pin_host_key",
                           json={"fingerprint": seen["fingerprint"]})
        assert refused.status_code == 422  # not the key the server offers now
        assert f"is {server.fingerprint()}, not the confirmed {seen['fingerprint']}" in \
            refused.get_json()["error"]["message"]
        assert api.get(PROFILE).get_json()["host_key"] is None
    finally:
        server.close()


def test_a_pasted_key_is_pinned_and_a_wrong_fingerprint_refused(api, sshd, session):
    save(api, sshd)
    wrong = api.post(f"{PROFILE}/actions/pin_host_key",
                     json={"key": sshd.host_key,
                           "fingerprint": "SHA256:" + "A" * 43})
    assert wrong.status_code == 422  # the fingerprint is not the pasted key's
    garbage = api.post(f"{PROFILE}/actions/pin_host_key", json={"key": "ssh-ed25519 !!"})
    assert garbage.status_code == 422  # not a key: only the parser can say
    known_hosts = f"[127.0.0.1]:{sshd.port} {sshd.host_key}"
    pinned = api.post(f"{PROFILE}/actions/pin_host_key", json={"key": known_hosts})
    assert pinned.status_code == 200
    assert pinned.get_json()["host_key_fingerprint"] == sshd.fingerprint()
    assert config_lines(session)[-1][1].startswith("tests: pinned the pasted host key")
    unpinned = api.post(f"{PROFILE}/actions/unpin_host_key", json={})
    assert unpinned.get_json()["host_key"] is None
    assert config_lines(session)[-1] == (
        "tests", "tests: removed the pinned host key of the SFTP profile of partner acme")


def test_an_unknown_action_and_a_party_without_a_profile_are_404(api):
    assert api.post(f"{PROFILE}/actions/fetch_host_key", json={}).status_code == 404
    assert api.post(f"{PROFILE}/actions/reboot", json={}).status_code == 404


def test_a_viewer_cannot_pin(app, session, sshd, api):
    from b2bhub.services.tokens import create_token
    save(api, sshd)
    token = create_token(session, "looker", "viewer")
    session.commit()
    viewer = app.test_client()
    viewer.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    assert viewer.post(f"{PROFILE}/actions/pin_host_key",
                       json={"key": sshd.host_key}).status_code == 403


def test_the_actions_are_in_the_openapi_document(api):
    doc = api.get("/api/v1/openapi.json").get_json()
    for action in ("fetch_host_key", "pin_host_key", "unpin_host_key"):
        path = doc["paths"][f"/api/v1/partners/{{name}}/profiles/sftp/actions/{action}"]
        assert path["post"]["operationId"] == f"{action}_partner_sftp_profile"


# --- the connection module a poller reuses ---------------------------------------------

def test_a_connection_lists_reads_renames_and_removes(sshd):
    box = sshd.directory("poller-box")
    (box / "a.edi").write_bytes(b"A" * 1000)
    (box / "b.edi").write_bytes(b"B" * 20)
    endpoint = Endpoint.from_config(sshd.connection())
    connection = Connection(endpoint)
    try:
        entries = {e.name: e for e in connection.listdir(str(box))}
        assert entries["a.edi"].size == 1000 and entries["b.edi"].size == 20
        assert entries["a.edi"].mtime == int((box / "a.edi").stat().st_mtime)
        assert entries["a.edi"].is_file
        with connection.open_read(str(box / "a.edi")) as stream:
            assert stream.read() == b"A" * 1000
        assert connection.rename(str(box / "a.edi"), str(box / "b.edi"), overwrite=False) \
            is False  # never replaces without overwrite
        assert connection.rename(str(box / "a.edi"), str(box / "c.edi"), overwrite=False)
        assert connection.remove(str(box / "c.edi")) is True
        assert connection.remove(str(box / "c.edi")) is False
        assert sorted(p.name for p in box.iterdir()) == ["b.edi"]
        assert connection.posix_rename  # OpenSSH offers posix-rename@openssh.com
    finally:
        connection.close()


def test_host_key_parsing():
    line = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9"
            "GKJl comment")
    key = HostKey.parse(line)
    assert key.type == "ssh-ed25519"
    assert key.fingerprint.startswith("SHA256:") and len(key.fingerprint) == 50
    assert HostKey.parse(f"host1,host2 {line}") == key
    for bad in ("", "ssh-ed25519", "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKL"
                "sabgH5C9okWi0dh2l9GKJl", "one\ntwo", "ssh-dss AAAA", f"@cert-authority * {line}"):
        with pytest.raises(ValueError):
            HostKey.parse(bad)


def test_a_connection_without_a_pinned_key_is_never_attempted(sshd):
    with pytest.raises(SftpError) as refused:
        Connection(Endpoint.from_config(sshd.connection(host_key="")))
    assert refused.value.error_class == "host_key"


# --- an sftp_writer instance's own host key ---------------------------------------------

def test_an_instance_fetches_and_pins_its_servers_host_key(api, sshd, session, hub,
                                                           tmp_path):
    """The instance was saved with a key the server does not have (pasted from the wrong
    place); the operator fetches the server's, compares the fingerprint, confirms: the
    instance's host_key is the server's, and both steps are in the history."""
    wrong = keygen(tmp_path / "wrong", "ed25519").with_suffix(".pub").read_text()
    hub.instance("out", "sftp_writer", config={**sshd.connection(host_key=wrong),
                                               "remote_directory": "/tmp/out"})
    base = "/api/v1/plugins/configs/out/actions"
    fetched = api.post(f"{base}/fetch_host_key", json={})
    assert fetched.status_code == 200
    assert fetched.get_json()["fingerprint"] == sshd.fingerprint()
    config = api.get("/api/v1/plugins/configs/out").get_json()["config"]
    assert config["host_key"] == wrong  # fetching pins nothing
    assert config["password"] == "********"

    refused = api.post(f"{base}/pin_host_key", json={"fingerprint": "SHA256:" + "B" * 43})
    assert refused.status_code == 422  # not the key the server offers
    pinned = api.post(f"{base}/pin_host_key",
                      json={"fingerprint": fetched.get_json()["fingerprint"]})
    assert pinned.status_code == 200
    config = api.get("/api/v1/plugins/configs/out").get_json()["config"]
    assert config["host_key"] == sshd.host_key
    assert config["password"] == "********"
    from b2bhub.plugin import instance_type  # noqa: F401  (the stored secret is kept)
    from b2bhub.services import config as svc
    session.expire_all()
    assert svc.get_instance(session, "out").config["password"] == PASSWORD
    assert config_lines(session)[-2:] == [
        ("tests", f"tests: instance out: fetched the host key of 127.0.0.1:{sshd.port}: "
                  f"ssh-ed25519 {sshd.fingerprint()} (not pinned)"),
        ("tests", f"tests: instance out: pinned the fetched host key ssh-ed25519 "
                  f"{sshd.fingerprint()} of 127.0.0.1:{sshd.port}")]
    assert api.post(f"{base}/reboot", json={}).status_code == 404
    doc = api.get("/api/v1/openapi.json").get_json()
    assert "/api/v1/plugins/configs/{name}/actions/pin_host_key" in doc["paths"]
