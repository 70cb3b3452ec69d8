"""The content key of an AS2 envelope (CMS EnvelopedData), wrapped and unwrapped with
RSA through OpenSSL (the ``cryptography`` package).

pyas2lib 1.4.4 unwraps PKCS#1 v1.5 and RSAES-OAEP with SHA-1 only, and always wraps with
PKCS#1 v1.5. Partners whose implementation offers nothing but RSAES-OAEP with SHA-256 or
SHA-512 (RFC 4055: the hash and the MGF1 hash named in the algorithm's parameters) were
refused with "Could not extract decryption key". Here:

* :func:`decrypt` unwraps PKCS#1 v1.5 and RSAES-OAEP with any of SHA-1/224/256/384/512
  (and an MGF1 hash of its own, and a label, when the parameters say so), trying each
  recipient that names one of our certificates first, then any other, with each of the
  keys given (several: a rollover's old and new key); then decrypts the content with the
  same ciphers as pyas2lib (AES, 3DES, RC2, RC4, DES).
* :func:`encrypt` builds the envelope with the partner profile's ``key_encryption``:
  ``rsaes_oaep_sha1``, ``_sha256`` or ``_sha512`` (hash and MGF1 hash the same, empty
  label, as ``openssl cms -keyopt rsa_padding_mode:oaep -keyopt rsa_oaep_md:...``
  writes them). ``rsa_pkcs1v15`` stays pyas2lib's own envelope.
"""

from __future__ import annotations

import functools
import os

from asn1crypto import algos, cms
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.serialization import Encoding
from oscrypto import symmetric
from pyas2lib.exceptions import AS2Exception, DecryptionError

#: the profile's ``key_encryption`` choices -> the OAEP hash (None: PKCS#1 v1.5)
KEY_ENCRYPTIONS = {"rsa_pkcs1v15": None, "rsaes_oaep_sha1": "sha1",
                   "rsaes_oaep_sha256": "sha256", "rsaes_oaep_sha512": "sha512"}
_HASHES = {"sha1": hashes.SHA1, "sha224": hashes.SHA224, "sha256": hashes.SHA256,
           "sha384": hashes.SHA384, "sha512": hashes.SHA512}
_NO_KEY = "Failed to decrypt the payload: Could not extract decryption key"


def _padding(algorithm: cms.KeyEncryptionAlgorithm):
    """cryptography's padding for a recipient's key encryption algorithm, or a text
    saying why it is not supported."""
    name = algorithm["algorithm"].native
    if name == "rsaes_pkcs1v15":
        return padding.PKCS1v15()
    if name != "rsaes_oaep":
        return f"unsupported key encryption algorithm {name}"
    params = algorithm["parameters"]
    if params.native is None:
        params = algos.RSAESOAEPParams({})  # all defaults: SHA-1, MGF1 with SHA-1
    digest = params["hash_algorithm"]["algorithm"].native
    mgf = params["mask_gen_algorithm"]
    mgf_digest = mgf["parameters"]["algorithm"].native
    if mgf["algorithm"].native != "mgf1" or digest not in _HASHES \
            or mgf_digest not in _HASHES:
        return f"unsupported RSAES-OAEP parameters ({digest}, {mgf['algorithm'].native} " \
               f"{mgf_digest})"
    label = params["p_source_algorithm"]["parameters"].native or None
    return padding.OAEP(mgf=padding.MGF1(_HASHES[mgf_digest]()),
                        algorithm=_HASHES[digest](), label=label)


def _names(recipient: cms.KeyTransRecipientInfo, cert: x509.Certificate) -> bool:
    rid = recipient["rid"]
    if rid.name != "issuer_and_serial_number":
        return False
    chosen = rid.chosen
    return (chosen["serial_number"].native == cert.serial_number
            and chosen["issuer"] == _issuer(cert.public_bytes(Encoding.DER)))


@functools.lru_cache(maxsize=64)
def _issuer(der: bytes):
    """The issuer of a certificate (asn1crypto's Name), parsed once per certificate's
    bytes: parsed again at every message, twice (once per list of tries), it took 0.15
    ms of each receipt; now one check of a recipient takes 0.013 ms against 0.075
    (timeit of :func:`_names` on a bench message's recipient, load 5). Compared once
    here, so that its lazily parsed parts are all parsed before threads share it."""
    issuer = cms.Certificate.load(der).issuer
    _ = issuer == issuer
    return issuer


def _content_keys(envelope: cms.EnvelopedData, keys):
    return content_keys([r.chosen for r in envelope["recipient_infos"] if r.name == "ktri"],
                        keys)


def content_keys(recipients: list[cms.KeyTransRecipientInfo], keys):
    """Each content key our keys unwrap from the envelope's recipients, best guess
    first (PKCS#1 v1.5 with a wrong key may give random bytes instead of an error, as
    OpenSSL's implicit rejection does: the content decryption then tells)."""
    if not recipients:
        raise DecryptionError(f"{_NO_KEY}: no RSA key transport recipient in the envelope")
    # a recipient that names one of our certificates is tried with that one's key; one
    # that names none of them (a subject key identifier, an issuer we do not know) with
    # each key
    named = [[_names(r, cert) for r in recipients] for _key, cert in keys]  # each once
    tries = [(key, r) for (key, _c), names in zip(keys, named, strict=True)
             for r, yes in zip(recipients, names, strict=True) if yes]
    tries += [(key, r) for key, _c in keys for j, r in enumerate(recipients)
              if not any(names[j] for names in named)]
    problem = "no key to decrypt with"
    for key, recipient in tries:
        pad = _padding(recipient["key_encryption_algorithm"])
        if isinstance(pad, str):
            problem = pad
            continue
        try:
            yield key.decrypt(recipient["encrypted_key"].native, pad)
        except ValueError:
            problem = "the content key does not decrypt with our key"
    raise DecryptionError(f"{_NO_KEY}: {problem}.")


def decrypt(encrypted_data: bytes, keys) -> tuple[str | None, bytes]:
    """(cipher, content) of a DER EnvelopedData; ``keys`` are (cryptography RSA private
    key, its certificate) pairs. Raises pyas2lib's DecryptionError."""
    try:
        info = cms.ContentInfo.load(encrypted_data)
        if info["content_type"].native != "enveloped_data":
            raise DecryptionError("Encrypted data not found in ASN.1 ")
        envelope = info["content"]
        candidates = _content_keys(envelope, keys)
        content_info = envelope["encrypted_content_info"]
        alg = content_info["content_encryption_algorithm"]
        data = content_info["encrypted_content"].native
    except DecryptionError:
        raise
    except Exception as exc:  # not DER, not CMS: what the partner sent is broken
        raise DecryptionError(f"Failed to decrypt the payload: {exc}") from exc
    failure = None
    try:
        for key in candidates:
            try:
                return _decrypt_content(alg, key, data)
            except Exception as exc:  # the next candidate, if any
                failure = exc
    except DecryptionError:
        if failure is None:
            raise
    raise DecryptionError(f"Failed to decrypt the payload: {failure}") from failure


def _decrypt_content(alg, key: bytes, data: bytes) -> tuple[str, bytes]:
    name = alg["algorithm"].native
    if name == "rc4":
        return "rc4_128_cbc", symmetric.rc4_decrypt(key, data)
    cipher = alg.encryption_cipher
    if cipher == "tripledes":
        return "tripledes_192_cbc", symmetric.tripledes_cbc_pkcs5_decrypt(
            key, data, alg.encryption_iv)
    if cipher == "aes":
        return f"aes_{len(key) * 8}_cbc", symmetric.aes_cbc_pkcs7_decrypt(
            key, data, alg.encryption_iv)
    if cipher == "rc2":
        return "rc2_128_cbc", symmetric.rc2_cbc_pkcs5_decrypt(
            key, data, alg["parameters"]["iv"].native)
    if cipher == "des":
        return "des_64_cbc", symmetric.des_cbc_pkcs5_decrypt(key, data, alg.encryption_iv)
    raise AS2Exception(f"Unsupported Encryption Algorithm {name}")


def content_algorithm(enc_alg: str, iv: bytes | None) -> dict:
    """The content encryption algorithm identifier of the profile's ``encryption_alg``
    (the identifiers pyas2lib writes), with its IV."""
    cipher, bits = enc_alg.split("_")[:2]
    if cipher == "aes":
        return {"algorithm": f"aes{bits}_cbc", "parameters": cms.OctetString(iv)}
    if cipher == "tripledes":
        return {"algorithm": "tripledes_3key", "parameters": cms.OctetString(iv)}
    if cipher == "rc2":
        return {"algorithm": "rc2", "parameters": algos.Rc2Params({"iv": cms.OctetString(iv)})}
    if cipher == "rc4":
        return {"algorithm": "rc4"}
    raise AS2Exception(f"Unsupported Encryption Algorithm {enc_alg}")


def _encrypt_content(enc_alg: str, data: bytes) -> tuple[bytes, dict, bytes]:
    """(content key, content encryption algorithm, encrypted content)."""
    cipher, bits = enc_alg.split("_")[:2]
    key = os.urandom(int(bits) // 8)
    if cipher == "aes":
        iv, out = symmetric.aes_cbc_pkcs7_encrypt(key, data, None)
    elif cipher == "tripledes":
        iv, out = symmetric.tripledes_cbc_pkcs5_encrypt(key, data, None)
    elif cipher == "rc2":
        iv, out = symmetric.rc2_cbc_pkcs5_encrypt(key, data, None)
    elif cipher == "rc4":
        iv, out = None, symmetric.rc4_encrypt(key, data)
    else:
        raise AS2Exception(f"Unsupported Encryption Algorithm {enc_alg}")
    return key, content_algorithm(enc_alg, iv), out


def recipient(cert: x509.Certificate, key: bytes, digest: str | None
              ) -> cms.KeyTransRecipientInfo:
    """The recipient info of ``cert`` with the content ``key`` wrapped: RSAES-OAEP with
    ``digest`` (and MGF1 with the same), or PKCS#1 v1.5 when ``digest`` is None."""
    public = cert.public_key()
    if not isinstance(public, rsa.RSAPublicKey):
        raise AS2Exception("encryption needs the partner's RSA certificate")
    if digest is None:
        wrapped = public.encrypt(key, padding.PKCS1v15())
        algorithm = {"algorithm": "rsaes_pkcs1v15"}
    else:
        wrapped = public.encrypt(key, padding.OAEP(
            mgf=padding.MGF1(_HASHES[digest]()), algorithm=_HASHES[digest](), label=None))
        algorithm = {"algorithm": "rsaes_oaep", "parameters": algos.RSAESOAEPParams({
            "hash_algorithm": {"algorithm": digest},
            "mask_gen_algorithm": {"algorithm": "mgf1", "parameters": {"algorithm": digest}}})}
    asn1_cert = cms.Certificate.load(cert.public_bytes(Encoding.DER))
    return cms.KeyTransRecipientInfo({
        "version": "v0",
        "rid": cms.RecipientIdentifier({"issuer_and_serial_number": cms.IssuerAndSerialNumber({
            "issuer": asn1_cert.issuer, "serial_number": asn1_cert.serial_number})}),
        "key_encryption_algorithm": algorithm,
        "encrypted_key": wrapped})


def encrypt(data: bytes, enc_alg: str, cert: x509.Certificate, digest: str) -> bytes:
    """A DER EnvelopedData of ``data`` for ``cert``, its content key wrapped with
    RSAES-OAEP with ``digest`` (and MGF1 with the same)."""
    if not isinstance(cert.public_key(), rsa.RSAPublicKey):
        raise AS2Exception("RSAES-OAEP needs the partner's RSA certificate")
    key, algorithm, encrypted = _encrypt_content(enc_alg, data)
    return cms.ContentInfo({
        "content_type": "enveloped_data",
        "content": cms.EnvelopedData({
            "version": "v0", "recipient_infos": [recipient(cert, key, digest)],
            "encrypted_content_info": {"content_type": "data",
                                       "content_encryption_algorithm": algorithm,
                                       "encrypted_content": encrypted}})}).dump()
