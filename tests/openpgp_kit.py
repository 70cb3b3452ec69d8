"""OpenPGP keys for the tests, made by the ``gpg`` command line as a partner makes them,
and ``gpg`` run as the partner runs it (each party a GNUPGHOME of its own)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

ORG_PASSPHRASE = "correct horse battery staple"


@dataclass
class Party:
    """A party's own gpg: its home directory, key fingerprint, armored keys."""

    home: Path
    fingerprint: str
    public: str
    private: str
    passphrase: str

    def gpg(self, *args: str, data: bytes | None = None, check: bool = True
            ) -> subprocess.CompletedProcess:
        done = subprocess.run(
            ["gpg", "--homedir", str(self.home), "--batch", "--yes", "--pinentry-mode",
             "loopback", "--passphrase", self.passphrase, "--trust-model", "always",
             *args], input=data, capture_output=True, timeout=600)
        if check and done.returncode != 0:
            raise AssertionError(f"gpg {' '.join(args)}: {done.stderr.decode()}")
        return done

    def trust(self, other: Party) -> None:
        """Import another party's public key (as a partner does with ours)."""
        self.gpg("--import", data=other.public.encode())


def make_party(home: Path, uid: str, algo: str, passphrase: str = "") -> Party:
    """A key pair made with ``gpg --quick-gen-key``: ``ed25519`` (with a cv25519
    encryption subkey) or ``rsa`` (RSA 2048, signing primary, encryption subkey)."""
    home.mkdir(mode=0o700, parents=True)
    party = Party(home, "", "", "", passphrase)
    if algo == "ed25519":
        party.gpg("--quick-gen-key", uid, "ed25519", "sign,cert", "1y")
    else:
        party.gpg("--quick-gen-key", uid, "rsa2048", "sign,cert", "1y")
    listing = party.gpg("--list-keys", "--with-colons").stdout.decode()
    party.fingerprint = next(line.split(":")[9] for line in listing.splitlines()
                             if line.startswith("fpr:"))
    party.gpg("--quick-add-key", party.fingerprint,
              "cv25519" if algo == "ed25519" else "rsa2048", "encr", "1y")
    party.public = party.gpg("--armor", "--export", party.fingerprint).stdout.decode()
    party.private = party.gpg("--armor", "--export-secret-keys",
                              party.fingerprint).stdout.decode()
    return party


@dataclass
class Keys:
    partner: Party  # acme: ed25519 / cv25519, no passphrase
    org: Party  # mycompany: RSA, with a passphrase
    stranger: Party  # someone else: ed25519
    expired_public: str
    homes: tuple[Path, ...] = ()

    def close(self) -> None:
        """Stop the gpg-agents the parties' gpg started."""
        for home in self.homes:
            subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
                           capture_output=True, timeout=30, check=False)


def make_keys(root: Path) -> Keys:
    partner = make_party(root / "partner", "ACME EDI <edi@acme.example>", "ed25519")
    org = make_party(root / "org", "My Company <b2b@mycompany.example>", "rsa",
                     ORG_PASSPHRASE)
    stranger = make_party(root / "stranger", "Mallory <m@example.org>", "ed25519")
    partner.trust(org)
    org.trust(partner)
    old = Party(root / "old", "", "", "", "")
    old.home.mkdir(mode=0o700)
    old.gpg("--faked-system-time", "20200101T000000", "--quick-gen-key",
            "Old <old@example.org>", "ed25519", "default", "1d")
    old_fpr = next(line.split(":")[9] for line in old.gpg(
        "--list-keys", "--with-colons").stdout.decode().splitlines()
        if line.startswith("fpr:"))
    expired = old.gpg("--armor", "--export", old_fpr).stdout.decode()
    return Keys(partner, org, stranger, expired,
                (partner.home, org.home, stranger.home, old.home))


def imported(keys: Keys, root: Path) -> Keys:
    """The same key pairs in gpg homes of their own under ``root``: each party's key pair
    imported, and the public key each party trusts, as :func:`make_keys` left them."""
    def copy(party: Party, name: str) -> Party:
        home = root / name
        home.mkdir(mode=0o700, parents=True)
        copied = Party(home, party.fingerprint, party.public, party.private,
                       party.passphrase)
        copied.gpg("--import", data=party.private.encode())
        return copied

    partner = copy(keys.partner, "partner")
    org = copy(keys.org, "org")
    stranger = copy(keys.stranger, "stranger")
    partner.trust(org)
    org.trust(partner)
    return Keys(partner, org, stranger, keys.expired_public,
                (partner.home, org.home, stranger.home))


def generated_once(root: Path) -> Keys:
    """The key pairs of a test run (a session fixture's body): generated once, since
    generating them (RSA above all) takes seconds; their agents stopped at once, as
    only the armored keys are used (a module imports them with :func:`keys_in`)."""
    keys = make_keys(root)
    keys.close()
    return keys


def keys_in(root: Path, generated: Keys):
    """A module's keys: the run's key pairs imported into gpg homes of the module's own
    (what a module's gpg does to its homes stays its own), their agents stopped at its
    end (a pytest fixture's body)."""
    keys = imported(generated, root)
    yield keys
    keys.close()
