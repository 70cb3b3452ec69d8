"""The file name a partner gives its AS2 message, in every form products send it
(issue 42, item 6): plain, RFC 2231 (a charset, continuations) and RFC 2047 encoded
words, decoded on both receiving paths (in memory and streamed), then sanitised as
before: no directory part, nothing but the last name."""

# ruff: noqa: F401, F811  (test_as2's fixtures, imported, are the tests' parameters)

from __future__ import annotations

import pytest
import requests

from tests.test_as2 import DATA, PATHS, as2, certs, partner

FORMS = [
    ("plain", 'attachment; filename="orders.edi"', "orders.edi"),
    ("rfc2231 utf-8", "attachment; filename*=UTF-8''%E2%82%AC%20rates.edi", "€ rates.edi"),
    ("rfc2231 latin-1 with language", "attachment; filename*=iso-8859-1'fr'r%E9sum%E9.edi",
     "résumé.edi"),
    ("rfc2231 continuations", "attachment; filename*0*=UTF-8''%C3%A7a; filename*1=va.edi",
     "çava.edi"),
    ("rfc2047 base64", 'attachment; filename="=?UTF-8?B?w6fDo28uZWRp?="', "ção.edi"),
    ("rfc2047 quoted-printable", 'attachment; filename="=?ISO-8859-1?Q?r=E9sum=E9.edi?="',
     "résumé.edi"),
    ("rfc2047 with a directory", 'attachment; filename="=?UTF-8?Q?..=2F..=2Fetc=2Fpasswd?="',
     "passwd"),
    # an unknown charset: RFC 2231's bytes are read as Latin-1 by the email package; an
    # encoded word that cannot be decoded is no name at all (not its raw =?...?= form)
    ("rfc2231 unknown charset", "attachment; filename*=x-unknown''%E9t%E9.edi", "été.edi"),
    ("rfc2047 unknown charset", 'attachment; filename="=?x-unknown?Q?=E9t=E9.edi?="', None),
]


@PATHS
@pytest.mark.parametrize("form, header, expected", FORMS, ids=[f[0] for f in FORMS])
def test_the_file_name_is_decoded_then_sanitised(as2, form, header, expected):
    as2.choose(sign=False, encrypt=False, mdn_mode="none")
    answer = requests.post(as2.url, data=DATA, timeout=30, headers={
        "AS2-From": "ACME", "AS2-To": "HUB", "AS2-Version": "1.2",
        "Message-ID": f"<name-{abs(hash(form))}@acme>",
        "Content-Type": "application/edi-x12", "Content-Disposition": header})
    assert answer.status_code == 200, answer.text
    [message] = as2.messages()
    assert as2.stages(message.id)["unpacked"] == DATA
    assert message.original_filename == expected
