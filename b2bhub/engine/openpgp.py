"""OpenPGP with Debian's ``gpg``, driven by python-gnupg (docs/openpgp.md).

Every operation gets a keyring of its own: a fresh ``GNUPGHOME`` in the temporary
directory (mode 0700) holding only the keys it needs, imported from the parties'
profiles, and removed, with the ``gpg-agent`` gpg started for it, as soon as the
operation ends. So no secret key stays on disk longer than one encryption or
decryption, worker processes never share (or lock) a keyring, and what a keyring trusts
is exactly what the profiles say. A payload streams through ``gpg``: it is written to
``gpg``'s standard input in chunks and ``gpg`` writes its result to a file of the
operation's directory, which the caller puts into the payload store; nothing holds a
whole payload in memory.

The verdicts are gpg's status lines (``[GNUPG:] ...``), read by this module into a
reason a person can act on.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import gnupg

from b2bhub.domain.i18n import N_

log = logging.getLogger(__name__)

#: the ``gpg`` program, found on the PATH (Debian's package ``gnupg``)
GPG = "gpg"
#: the chunk size of a payload written to ``gpg``
CHUNK = 1 << 16
PUBLIC_BEGIN = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
PRIVATE_BEGIN = "-----BEGIN PGP PRIVATE KEY BLOCK-----"


class KeyProblem(ValueError):
    """A key that cannot be used as given; the text says why."""


class OpenPGPError(RuntimeError):
    """``gpg`` failed for a reason that is not the message's (a crash, a full disk)."""


@dataclass(frozen=True)
class KeyInfo:
    """What a key is: its primary ``fingerprint``, the fingerprints of it and its
    subkeys, user ids, when it expires (None: never), and what it can do now."""

    fingerprint: str
    fingerprints: tuple[str, ...]
    user_ids: tuple[str, ...]
    expires: datetime | None
    can_encrypt: bool
    can_sign: bool
    secret: bool


@dataclass(frozen=True)
class KeyPair:
    """Our key pair as a profile keeps it."""

    private_key: str
    passphrase: str
    fingerprint: str


@contextmanager
def keyring(*armored: str) -> Iterator[gnupg.GPG]:
    """A keyring of its own holding the keys ``armored``, removed on leaving."""
    home = tempfile.mkdtemp(prefix="b2bhub-gpg-")
    try:
        os.chmod(home, 0o700)
        gpg = gnupg.GPG(gpgbinary=GPG, gnupghome=home)
        gpg.buffer_size = CHUNK
        for key in armored:
            gpg.import_keys(key)
        yield gpg
    finally:
        _close(home)


def _close(home: str) -> None:
    """Stop the agent gpg started for the keyring and remove its directory."""
    if (Path(home) / "private-keys-v1.d").exists() or any(
            name.startswith("S.gpg-agent") for name in os.listdir(home)):
        try:
            subprocess.run(["gpgconf", "--homedir", home, "--kill", "gpg-agent"],
                           capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            log.warning("could not stop the gpg-agent of %s", home, exc_info=True)
    shutil.rmtree(home, ignore_errors=True)


def _when(epoch: str) -> datetime | None:
    return datetime.fromtimestamp(int(epoch), UTC) if epoch else None


def inspect_key(armored: str, *, secret: bool, passphrase: str = "",
                now: datetime | None = None) -> KeyInfo:
    """Read one armored key: a public key (``secret`` False) or our key pair (a private
    key and its passphrase). :class:`KeyProblem` says what is wrong with it."""
    now = now or datetime.now(UTC)
    if not isinstance(armored, str) or not armored.strip():
        raise KeyProblem(N_("no key given"))
    if PRIVATE_BEGIN in armored and not secret:
        raise KeyProblem(N_("this is a private key; give the partner's public key here (a "
                            "private key is never handed to anyone)"))
    if secret and PRIVATE_BEGIN not in armored:
        raise KeyProblem(N_("not an armored private key (-----BEGIN PGP PRIVATE KEY "
                            "BLOCK-----); our key pair needs the private key (this is a "
                            "public key)") if PUBLIC_BEGIN in armored else
                         N_("not an armored private key (-----BEGIN PGP PRIVATE KEY "
                            "BLOCK-----); our key pair needs the private key"))
    if not secret and PUBLIC_BEGIN not in armored:
        raise KeyProblem(N_("not an armored OpenPGP public key (-----BEGIN PGP PUBLIC KEY "
                            "BLOCK-----)"))
    with keyring(armored) as gpg:
        keys = gpg.list_keys(secret=secret)
        if not keys:
            raise KeyProblem(N_("gpg read no key from it: not an OpenPGP key, or damaged"))
        if len(keys) > 1:
            raise KeyProblem(N_("it holds %(count)d keys; give exactly one", count=len(keys)))
        key = keys[0]
        public = gpg.list_keys()[0]
        info = KeyInfo(
            fingerprint=key["fingerprint"],
            fingerprints=(key["fingerprint"], *(s[2] for s in key.get("subkeys", ())
                                                if len(s) > 2 and s[2])),
            user_ids=tuple(key.get("uids", ())), expires=_when(key.get("expires", "")),
            can_encrypt="E" in public.get("cap", ""), can_sign="S" in public.get("cap", ""),
            secret=secret)
        if info.expires is not None and info.expires <= now:
            raise KeyProblem(N_("the key %(key)s expired on %(when)s UTC",
                                key=info.fingerprint, when=f"{info.expires:%Y-%m-%d %H:%M}"))
        if public.get("trust") in ("r", "e") or not (info.can_encrypt or info.can_sign):
            raise KeyProblem(N_("the key %(key)s is revoked or expired, or has no usable "
                                "subkey", key=info.fingerprint))
        if not info.can_encrypt:
            raise KeyProblem(N_("the key %(key)s has no usable encryption key",
                                key=info.fingerprint))
        if secret:
            signed = gpg.sign("b2bhub passphrase check", keyid=info.fingerprint,
                              passphrase=passphrase or "", detach=True)
            if not signed.data:
                why = "bad passphrase" in signed.stderr.lower() or "No passphrase" in \
                    signed.stderr
                raise KeyProblem(N_("the passphrase does not unlock the private key") if why
                                 else N_("the private key could not sign%(gpg_said)s",
                                         gpg_said=_problem(signed.stderr)))
        return info


def encrypt(source: IO[bytes], output: Path, recipient: str | None,
            recipient_fpr: str | None, signer: KeyPair | None = None) -> None:
    """Encrypt ``source`` to the public key ``recipient`` (signed with ``signer`` when
    given), or only sign it (``recipient`` None), into the file ``output``: binary
    OpenPGP, as ``gpg --encrypt --sign`` (or ``gpg --sign``) makes it."""
    keys = ([recipient] if recipient else []) + ([signer.private_key] if signer else [])
    with keyring(*keys) as gpg:
        if recipient is None:
            result = gpg.sign_file(source, keyid=signer.fingerprint,
                                   passphrase=signer.passphrase, clearsign=False,
                                   binary=True, output=str(output))
            ok = bool(result.data) or "SIG_CREATED" in result.stderr
        else:
            result = gpg.encrypt_file(
                source, [recipient_fpr], sign=signer.fingerprint if signer else None,
                passphrase=signer.passphrase if signer else None, always_trust=True,
                armor=False, output=str(output))
            ok = result.ok
        if not ok or not output.exists():
            status = _status(result.stderr)
            if "INV_RECP" in status or "INV_SGNR" in status:  # the same key fails again
                whose = "signing key" if "INV_SGNR" in status else "recipient's key"
                raise KeyProblem(f"gpg cannot use the {whose} (expired or revoked since it "
                                 f"was saved?){_problem(result.stderr)}")
            raise OpenPGPError(f"gpg could not {'sign' if recipient is None else 'encrypt'}"
                               f": {result.status or 'failed'}{_problem(result.stderr)}")


@dataclass(frozen=True)
class Opened:
    """What decrypting a message found: ``reason`` None when it may be taken in."""

    reason: str | None
    encrypted: bool
    signer: str | None


def decrypt(source: IO[bytes], output: Path, ours: KeyPair | None,
            theirs: str | None, theirs_fpr: str | None, *, encrypted: bool,
            signed: bool) -> Opened:
    """Decrypt and/or verify ``source`` into ``output``: ``encrypted`` requires it to be
    encrypted (to ``ours``), ``signed`` requires a good signature by ``theirs`` (the
    partner's public key, primary fingerprint ``theirs_fpr``)."""
    keys = ([ours.private_key] if ours else []) + ([theirs] if theirs else [])
    with keyring(*keys) as gpg:
        result = gpg.decrypt_file(source, passphrase=ours.passphrase if ours else None,
                                  always_trust=True, output=str(output))
    status = _status(result.stderr)
    was_encrypted = "BEGIN_DECRYPTION" in status or "DECRYPTION_OKAY" in status
    signer = (status.get("VALIDSIG") or [None])[-1]
    if "NO_SECKEY" in status:
        held = f" (ours is {ours.fingerprint})" if ours else ""
        return Opened(f"OpenPGP: encrypted to key {', '.join(status['NO_SECKEY'])}, which "
                      f"is not ours{held}", True, None)
    if "NODATA" in status and not was_encrypted and "PLAINTEXT" not in status:
        return Opened("OpenPGP: not an OpenPGP message", False, None)
    if was_encrypted and "DECRYPTION_OKAY" not in status:
        return Opened(f"OpenPGP: could not be decrypted ({result.status or 'failed'})"
                      f"{_problem(result.stderr)}", True, None)
    if encrypted and not was_encrypted:
        return Opened("OpenPGP: the message is not encrypted, and this source's "
                      "openpgp_decrypt requires it", False, None)
    if "PLAINTEXT" not in status and not output.exists():
        raise OpenPGPError(f"gpg gave no content: {result.status}{_problem(result.stderr)}")
    if signed:
        reason = _signature_problem(status, theirs_fpr)
        if reason:
            return Opened(reason, was_encrypted, signer)
    return Opened(None, was_encrypted, signer)


def _signature_problem(status: dict[str, list[str]], expected: str | None) -> str | None:
    if "BADSIG" in status:
        return (f"OpenPGP: bad signature (key {status['BADSIG'][0].split()[0]}): the "
                "content is not what was signed")
    if "ERRSIG" in status or "NO_PUBKEY" in status:
        key = (status.get("NO_PUBKEY") or status["ERRSIG"])[0].split()[0]
        return (f"OpenPGP: signed by key {key}, which is not the sender's key "
                f"{expected or '(none in its profile)'}")
    if "EXPSIG" in status or "EXPKEYSIG" in status or "REVKEYSIG" in status:
        return "OpenPGP: the signature was made by an expired or revoked key"
    if "VALIDSIG" not in status or "GOODSIG" not in status:
        return ("OpenPGP: not signed, and this source's openpgp_verify requires a "
                f"signature by the sender's key {expected or ''}".rstrip())
    primary = status["VALIDSIG"][0].split()
    if expected is None or expected.upper() not in {p.upper() for p in
                                                    (primary[0], primary[-1])}:
        return (f"OpenPGP: signed by key {primary[-1]}, which is not the sender's key "
                f"{expected or '(none in its profile)'}")
    return None


def _status(stderr: str) -> dict[str, list[str]]:
    """gpg's status lines by keyword: ``[GNUPG:] BADSIG <id> <uid>`` -> {"BADSIG":
    ["<id> <uid>"]}."""
    found: dict[str, list[str]] = {}
    for line in stderr.splitlines():
        if line.startswith("[GNUPG:] "):
            word, _, rest = line[9:].partition(" ")
            found.setdefault(word, []).append(rest)
    return found


def _problem(stderr: str) -> str:
    """gpg's own words (its lines that are not status lines), shortened."""
    said = [line.removeprefix("gpg: ") for line in stderr.splitlines()
            if line.startswith("gpg: ")]
    return f": {'; '.join(said)[:300]}" if said else ""
