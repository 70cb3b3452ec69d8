"""The AS2 library loads on this machine's OpenSSL (the oscrypto 1.3.0 trap)."""

import importlib.metadata
import ssl


def test_oscrypto_on_disk_is_the_fixed_one_and_loads_openssl():
    import oscrypto

    import plugins.as2  # noqa: F401  (raises when oscrypto cannot load OpenSSL)

    assert oscrypto.backend() == "openssl"
    files = importlib.metadata.distribution("elements-oscrypto").files
    owner = {str(f) for f in files}
    assert "oscrypto/__init__.py" in owner
    # the stand-in for pyas2lib's oscrypto pin ships no module files of its own
    stand_in = importlib.metadata.distribution("oscrypto")
    assert stand_in.version.startswith("1.3.0+")
    assert not [f for f in stand_in.files or () if str(f).endswith(".py")]
    assert ssl.OPENSSL_VERSION  # the version string the old pattern could not read


def test_pyas2lib_builds_and_parses_a_message_here():
    from pyas2lib import Message, Organization, Partner

    org = Organization(as2_name="hub")
    partner = Partner(as2_name="acme", compress=True)
    out = Message(org, partner)
    out.build(b"UNA:+.? 'UNB+UNOC:3'", filename="order.edi", content_type="application/edi")
    incoming = Message()
    status, exc, mdn = incoming.parse(
        out.headers_str + b"\r\n" + out.content,
        find_org_cb=lambda _h: Organization(as2_name="acme"),
        find_partner_cb=lambda _h: Partner(as2_name="hub"))
    assert status == "processed", exc
    assert incoming.content == b"UNA:+.? 'UNB+UNOC:3'"
