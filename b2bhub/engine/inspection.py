"""Document inspection at intake (docs/edi.md): a message's ``unpacked`` stage is read
once by the first inspector that recognises its first bytes; what it found becomes the
message's attributes (``message_attributes``), one row per distinct name and value."""

from __future__ import annotations

import logging
from typing import IO

from b2bhub.plugin import Envelope
from b2bhub.plugin.registry import get_inspectors

log = logging.getLogger(__name__)
HEAD = 512
#: at most this many rows per message: room for the control number and reference of
#: every set whose details an envelope keeps (a 100,000-set interchange's first 10,000),
#: and 1,000 more for the interchange's own, its groups', its types and its errors
MAX_ROWS = 2 * Envelope.MAX_DETAILS + 1_000


class _Head:
    """A stream whose first bytes were read to recognise it, handed back from its start."""

    def __init__(self, head: bytes, stream: IO[bytes]):
        self._head, self._stream = head, stream

    def read(self, size: int = -1) -> bytes:
        if self._head:
            if size < 0:
                data, self._head = self._head + self._stream.read(), b""
                return data
            data, self._head = self._head[:size], self._head[size:]
            return data
        return self._stream.read(size)


def inspect_stream(stream: IO[bytes], inspectors: dict | None = None) -> Envelope | None:
    """The envelope the first recognising inspector reads of ``stream``; None if none."""
    head = stream.read(HEAD)
    for inspector in (get_inspectors() if inspectors is None else inspectors).values():
        if inspector.recognise(head):
            return inspector.inspect(_Head(head, stream))
    return None


def attributes(env: Envelope) -> list[tuple[str, str]]:
    """The (name, value) pairs stored for an envelope, distinct, in a stable order."""
    pairs = [("standard", env.standard), ("version", env.version),
             ("sender", env.sender), ("receiver", env.receiver),
             ("interchange_control", env.control), ("interchange_date", env.date),
             ("groups", str(len(env.groups))), ("sets", str(env.set_count))]
    for group in env.groups:
        pairs += [("group_type", group["functional_id"]),
                  ("group_control", group["control"])]
    pairs += [("document_type", kind) for kind in env.types]
    for one in env.sets:
        pairs.append(("transaction_control", one["control"]))
        if one.get("reference"):
            pairs.append(("reference", one["reference"]))
    # the errors (at most 100) are kept whatever the sets' details take of the room
    errors = list(dict.fromkeys(("edi_error", text[:255]) for text in env.errors if text))
    kept = list(dict.fromkeys((n, v[:255]) for n, v in pairs if v))
    return kept[:MAX_ROWS - len(errors)] + errors


def inspect_payload(store, digest: str) -> list[tuple[str, str]]:
    """The attributes of the stored payload ``digest``; [] when no inspector knows it or
    it cannot be read (the message is stored all the same, a warning logged). With no
    inspector chosen (``B2BHUB_INSPECTORS`` empty) the payload is not even opened."""
    inspectors = get_inspectors()
    if not inspectors:
        return []
    try:
        with store.open(digest) as stream:
            env = inspect_stream(stream, inspectors)
    except Exception:
        log.warning("payload %s could not be inspected", digest, exc_info=True)
        return []
    return attributes(env) if env is not None else []


def attribute_rows(store, digest: str) -> list[tuple]:
    """:func:`inspect_payload` as rows of ``message_attributes`` for a
    :class:`b2bhub.engine.dispatch.NewMessage` (each given its message id there)."""
    from b2bhub.models import MessageAttribute

    table = MessageAttribute.__table__
    return [(table, {"name": name, "value": value})
            for name, value in inspect_payload(store, digest)]
