"""OpenPGP as the core applies it to any source and any target (docs/openpgp.md).

The keys are the parties' ``openpgp`` profiles (``protocol_profiles``, protocol
``openpgp``): a partner's public key; an organization's key pair (its private key and
passphrase, never shown again) and the public key that goes with it.

* **A source** whose configuration says ``openpgp_decrypt`` and/or ``openpgp_verify``
  (:class:`Unpacker`, called by the intake before the message's transaction): the bytes
  received are stored as the ``raw`` stage, decrypted with the key pair of the
  message's organization into the ``unpacked`` stage, whose EDI envelope is the one
  inspected; the signature must be good and made by the key of its partner
  (:func:`sides`: the organization is the message's ``to``, or its ``from`` when the
  ``to`` is a partner, as a ``file_poller``'s messages are).
  Anything else (not encrypted, encrypted to another key, a bad signature, none, a
  signature by another key, no key in a profile) refuses the message: stored Refused
  with the reason, its ``raw`` stage kept, nothing routed.
* **A target** whose configuration says ``openpgp_encrypt`` and/or ``openpgp_sign``
  (:func:`deliver`, around the plugin's ``deliver``): the stage the target sends (its
  ``payload_stage``, default ``unpacked``) is encrypted to the public key of the
  message's partner and/or signed with the key pair of its organization, stored as the
  message's ``sent`` stage, and handed to the target in place of the stage it reads.
  Once per message and target: a later attempt reuses what the first made (its
  ``openpgp`` history line names it). A missing key fails the delivery (no retry: the
  same attempt would fail the same way until an operator adds the key and redelivers).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from b2bhub.domain.outcome import Outcome
from b2bhub.engine import openpgp
from b2bhub.engine.history import add_line
from b2bhub.engine.inspection import attribute_rows
from b2bhub.models import (
    ORGANIZATION,
    PARTNER,
    HistoryLine,
    Party,
    Payload,
    ProtocolProfile,
    utcnow,
)
from b2bhub.payloads.store import StoredPayload

log = logging.getLogger(__name__)

#: ``protocol_profiles.protocol`` of the keys
PROTOCOL = "openpgp"
#: the history line of an OpenPGP step (a decryption at intake, an encryption for a
#: target; its ``data`` names the target and the ``sent`` payload it made)
LINE = "openpgp"
#: the line a source's unpacking leaves on a message it refuses: the intake checks turn
#: it into the refusal's reason (``envelope_checks.check_intake``)
REFUSED_LINE = "unpack_refused"
#: how often a source's lease is kept alive while gpg decrypts
KEEP_ALIVE_EVERY = 2.0


@dataclass(frozen=True)
class PartyKeys:
    """A party's ``openpgp`` profile as the core uses it."""

    party: str
    public_key: str
    fingerprint: str
    pair: openpgp.KeyPair | None


def party_keys(session: Session, names: set[str]) -> dict[str, PartyKeys]:
    """The OpenPGP keys of the parties named, by name (those without a profile left out)."""
    rows = session.execute(
        select(Party.name, ProtocolProfile.settings)
        .join(ProtocolProfile, ProtocolProfile.party_id == Party.id)
        .where(ProtocolProfile.protocol == PROTOCOL, Party.name.in_(names))).all()
    found = {}
    for name, settings in rows:
        settings = settings or {}
        pair = (openpgp.KeyPair(settings["private_key"], settings.get("passphrase") or "",
                                settings["fingerprint"])
                if settings.get("private_key") else None)
        found[name] = PartyKeys(name, settings.get("public_key", ""),
                                settings.get("fingerprint", ""), pair)
    return found


def sides(session: Session, from_party: str, to_party: str) -> tuple[str, str]:
    """(our organization, the partner) of a message: the organization is its ``to``
    unless that is a partner (then its ``from``), the partner its ``from`` unless that
    is an organization (then its ``to``)."""
    kinds = dict(session.execute(select(Party.name, Party.kind).where(
        Party.name.in_({from_party, to_party}))).all())
    ours = from_party if kinds.get(to_party) == PARTNER else to_party
    theirs = to_party if kinds.get(from_party) == ORGANIZATION else from_party
    return ours, theirs


# --- sources ---------------------------------------------------------------------------

@dataclass
class Unpacked:
    """A received payload's stages, its inspection's rows and its history lines."""

    stages: dict[str, tuple[str, int]]
    rows: list = field(default_factory=list)
    lines: list[dict] = field(default_factory=list)


class Unpacker:
    """What a source's intake stores of a received payload (module docstring)."""

    def __init__(self, session: Session, store, config: dict | None, commit: bool = True,
                 keep_alive: Callable[[], None] | None = None):
        """``commit``: end the transaction that read the keys before gpg runs (a
        receiver in the middle of its request's transaction says False);
        ``keep_alive``: called every few seconds while gpg works, on this thread (a
        scan renews its lease so: a large file takes longer than the lease)."""
        self.session, self.store, self.commit = session, store, commit
        self.keep_alive = keep_alive
        self.decrypt = bool((config or {}).get("openpgp_decrypt"))
        self.verify = bool((config or {}).get("openpgp_verify"))

    @property
    def transforms(self) -> bool:
        """Whether what a source receives is unpacked (else it is the content itself)."""
        return self.decrypt or self.verify

    def __call__(self, from_party: str, to_party: str, stored: StoredPayload,
                 rows: list | None = None) -> Unpacked:
        """``rows``: the inspection's of the content already read (``b2bhub.engine.
        staging``), for a source that does not unpack; None: read from the store."""
        if not self.transforms:
            return Unpacked({"unpacked": (stored.digest, stored.size)}, rows
                            if rows is not None else
                            attribute_rows(self.store, stored.digest, waits=True))
        raw = {"raw": (stored.digest, stored.size)}
        org, partner = sides(self.session, from_party, to_party)
        keys = party_keys(self.session, {org, partner})
        if self.commit:
            self.session.commit()  # a read: no transaction held while gpg works
        ours, theirs = keys.get(org), keys.get(partner)
        if self.decrypt and (ours is None or ours.pair is None):
            return _refused(raw, f"OpenPGP: {org} has no key pair to decrypt with "
                                 "(an openpgp profile with its private key)")
        if self.verify and theirs is None:
            return _refused(raw, f"OpenPGP: {partner} has no public key to verify its "
                                 "signature with (an openpgp profile)")
        with tempfile.TemporaryDirectory(prefix="b2bhub-pgp-") as tmp:
            out = Path(tmp) / "content"
            with self.store.open(stored.digest) as source:
                opened = _meanwhile(self.keep_alive, lambda: openpgp.decrypt(
                    source, out, ours.pair if ours else None,
                    theirs.public_key if theirs else None,
                    theirs.fingerprint if theirs else None,
                    encrypted=self.decrypt, signed=self.verify))
            if opened.reason is not None:
                return _refused(raw, opened.reason)
            with open(out, "rb") as content:
                plain = self.store.put(content)
        done = [word for word, did in (("decrypted", opened.encrypted),
                                       (f"signature of {partner} verified", self.verify))
                if did]
        return Unpacked({**raw, "unpacked": (plain.digest, plain.size)},
                        attribute_rows(self.store, plain.digest, waits=True),
                        [{"type": LINE, "text": f"OpenPGP: {' and '.join(done)}",
                          "data": {"signer": opened.signer.split()[-1] if opened.signer
                                   else None, "decrypted": opened.encrypted}}])


def _meanwhile(keep_alive: Callable[[], None] | None, work: Callable[[], Any]) -> Any:
    """``work()``, on a thread of its own when ``keep_alive`` is given, which is called
    on this thread every :data:`KEEP_ALIVE_EVERY` seconds until the work is done."""
    if keep_alive is None:
        return work()
    with ThreadPoolExecutor(1, thread_name_prefix="openpgp") as pool:
        running = pool.submit(work)
        while True:
            try:
                return running.result(timeout=KEEP_ALIVE_EVERY)
            except TimeoutError:
                keep_alive()


def _refused(raw: dict, reason: str) -> Unpacked:
    return Unpacked(raw, [], [{"type": REFUSED_LINE, "text": reason}])


# --- targets ---------------------------------------------------------------------------

class SealedPayloads:
    """The target's PayloadReader with the stage it sends replaced by the ``sent`` one."""

    def __init__(self, payloads, stage: str, sent: tuple[str, int], store):
        self._payloads, self._stage, self._sent, self._store = payloads, stage, sent, store

    def stages(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self._payloads.stages(), "sent")))

    def _is_sent(self, stage: str) -> bool:
        return stage in (self._stage, "sent")

    def size(self, stage: str) -> int:
        return self._sent[1] if self._is_sent(stage) else self._payloads.size(stage)

    def digest(self, stage: str) -> str:
        return self._sent[0] if self._is_sent(stage) else self._payloads.digest(stage)

    def open(self, stage: str) -> IO[bytes]:
        if self._is_sent(stage):
            return self._store.open(self._sent[0])
        return self._payloads.open(stage)


def deliver(plugin, delivery, payloads, context) -> Any:
    """The plugin's ``deliver``, given the stage it sends encrypted and/or signed when
    its instance says so (module docstring)."""
    config = getattr(plugin, "config", None) or {}
    if not (config.get("openpgp_encrypt") or config.get("openpgp_sign")):
        return plugin.deliver(delivery, payloads, context)
    stage = config.get("payload_stage") or "unpacked"
    if stage not in payloads.stages():
        return Outcome.failed(f"the message has no '{stage}' payload stage to encrypt")
    session: Session = context.open_session()
    try:
        sealed = _seal(session, context.store, config, stage, delivery, payloads)
    except openpgp.KeyProblem as exc:  # a key gpg refuses fails the same way next time
        sealed = f"OpenPGP: {exc}; update the profile, then redeliver"
    finally:
        session.close()
    if isinstance(sealed, str):
        return Outcome.failed(sealed)
    return plugin.deliver(delivery, SealedPayloads(payloads, stage, sealed, context.store),
                          context)


def _seal(session: Session, store, config: dict, stage: str, delivery, payloads
          ) -> tuple[str, int] | str:
    """The ``sent`` payload (digest, size) of this delivery, made now or before; or the
    reason it cannot be made."""
    target = delivery.target
    made = [line.data for line in session.scalars(select(HistoryLine).where(
        HistoryLine.message_id == delivery.message_id, HistoryLine.type == LINE))
        if (line.data or {}).get("target") == target]
    if made and store.exists(made[-1]["digest"]):
        sent = (made[-1]["digest"], made[-1]["size"])
        _record_sent(session, delivery.message_id, sent)
        return sent
    encrypt, sign = bool(config.get("openpgp_encrypt")), bool(config.get("openpgp_sign"))
    sender, recipient = sides(session, delivery.from_party, delivery.to_party)
    keys = party_keys(session, {sender, recipient})
    session.commit()
    theirs, ours = keys.get(recipient), keys.get(sender)
    if encrypt and theirs is None:
        return (f"OpenPGP: {recipient} has no public key to encrypt to (an openpgp "
                "profile); add it, then redeliver")
    if sign and (ours is None or ours.pair is None):
        return (f"OpenPGP: {sender} has no key pair to sign with (an openpgp profile "
                "with its private key); add it, then redeliver")
    with tempfile.TemporaryDirectory(prefix="b2bhub-pgp-") as tmp:
        out = Path(tmp) / "sent"
        with payloads.open(stage) as source:
            openpgp.encrypt(source, out, theirs.public_key if encrypt else None,
                            theirs.fingerprint if encrypt else None,
                            ours.pair if sign else None)
        with open(out, "rb") as content:
            stored = store.put(content)
    sent = (stored.digest, stored.size)
    done = " and ".join(word for word, did in (
        (f"encrypted to {recipient}'s key {theirs.fingerprint if theirs else ''}", encrypt),
        (f"signed with {sender}'s key {ours.fingerprint if ours else ''}", sign)) if did)
    _record_sent(session, delivery.message_id, sent, lambda: add_line(
        session, delivery.message_id, LINE, f"OpenPGP for {target}: {done}; stored as "
        "the sent stage", delivery_id=delivery.delivery_id, data={
            "target": target, "digest": stored.digest, "size": stored.size,
            "stage": stage, "encrypted": encrypt, "signed": sign}))
    return sent


def _record_sent(session: Session, message_id: int, sent: tuple[str, int],
                 line=lambda: None) -> None:
    """Record (or point again) the message's ``sent`` stage, with ``line``, and commit."""
    for _ in range(2):  # another target's attempt may insert it at the same moment
        line()
        row = session.scalar(select(Payload).where(Payload.message_id == message_id,
                                                   Payload.stage == "sent"))
        if row is None:
            session.add(Payload(message_id=message_id, stage="sent", digest=sent[0],
                                size=sent[1], created_at=utcnow()))
        elif (row.digest, row.size) != sent:
            row.digest, row.size, row.created_at = sent[0], sent[1], utcnow()
        try:
            session.commit()
            return
        except IntegrityError:
            session.rollback()
    raise RuntimeError(f"message {message_id}: the sent stage could not be recorded")
