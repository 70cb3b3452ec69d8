"""Document inspection at intake (docs/edi.md): a message's ``unpacked`` stage is read
once by the first inspector that recognises its first bytes; what it found becomes the
message's attributes (``message_attributes``), one row per distinct name and value."""

from __future__ import annotations

import io
import logging
import queue
import threading
from typing import IO, Any

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
    found = inspect_with(stream, inspectors)
    return found[1] if found is not None else None


def inspect_with(stream: IO[bytes], inspectors: dict | None = None
                 ) -> tuple[Any, Envelope] | None:
    """The first recognising inspector and the envelope it reads of ``stream``."""
    head = stream.read(HEAD)
    for inspector in (get_inspectors() if inspectors is None else inspectors).values():
        if inspector.recognise(head):
            return inspector, inspector.inspect(_Head(head, stream))
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


def _envelope(store, digest: str) -> Envelope | None:
    """The envelope of the stored payload ``digest``; None when no inspector knows it or
    it cannot be read (the message is stored all the same, a warning logged). With no
    inspector chosen (``B2BHUB_INSPECTORS`` empty) the payload is not even opened."""
    inspectors = get_inspectors()
    if not inspectors:
        return None
    try:
        with store.open(digest) as stream:
            return inspect_stream(stream, inspectors)
    except Exception:
        log.warning("payload %s could not be inspected", digest, exc_info=True)
        return None


def attribute_rows(store, digest: str, waits: bool = False) -> list[tuple]:
    """The attributes of the stored payload ``digest`` (:func:`_envelope`) as rows of
    ``message_attributes`` for a
    :class:`b2bhub.engine.dispatch.NewMessage` (each given its message id there), and
    the acknowledgment rows its envelope brings: a received acknowledgment's to match
    (:mod:`b2bhub.engine.ack_waits`), an interchange's ``edi_ack_jobs`` row for the
    acknowledgment we send (:mod:`b2bhub.engine.acks`).
    ``waits``: with the acknowledgment waits it may start, which are incomplete until
    the message passes through ``envelope_parties.by_envelope`` (as the core's intake
    checks do); without, a caller storing the rows as they are stores no wait."""
    from b2bhub.engine.ack_waits import envelope_rows
    from b2bhub.engine.acks import job_rows

    env = _envelope(store, digest)
    if env is None:
        return []
    pairs = attributes(env)
    return attribute_rows_of(pairs) + envelope_rows(env, waits) + job_rows(pairs)


def attribute_rows_of(pairs: list[tuple[str, str]]) -> list[tuple]:
    """(name, value) pairs as rows of ``message_attributes`` for a
    :class:`b2bhub.engine.dispatch.NewMessage` (each given its message id there)."""
    from b2bhub.models import MessageAttribute

    table = MessageAttribute.__table__
    return [(table, {"name": name, "value": value}) for name, value in pairs]


# --- for sources that store their messages themselves (the receivers) ------------------
# They inspect what they hold before the message's rows go in, never reading the payload
# back from the store: its bytes in memory, or its stream as it passes to the store.

class Found(list):
    """The attributes a receiver's inspection found ((name, value) pairs), with the
    :class:`Envelope` they were read from (None: none), for :func:`message_rows`."""

    def __init__(self, env: Envelope | None = None):
        super().__init__(attributes(env) if env is not None else ())
        self.envelope = env


def message_rows(found: list[tuple[str, str]]) -> list[tuple]:
    """The rows a received message's inspection brings, to go in with it
    (``NewMessage.rows``), as :func:`attribute_rows` gives the core's intake: its
    attributes, a received acknowledgment's row to match, the acknowledgment waits it
    may start (completed by ``envelope_parties.by_envelope``, which the intake checks
    run), the job of the acknowledgment we send. ``found``: :func:`inspect_bytes` or
    :meth:`InspectingReader.attributes` (plain pairs: the attributes alone)."""
    from b2bhub.engine.ack_waits import envelope_rows
    from b2bhub.engine.acks import job_rows

    env = getattr(found, "envelope", None)
    if env is None:
        return attribute_rows_of(found)
    return attribute_rows_of(found) + envelope_rows(env, True) + job_rows(found)


def inspect_bytes(data: bytes) -> Found:
    """The attributes of a payload held in memory; none when no inspector knows it or
    it cannot be read (as for a stored payload: inspection never fails a receive)."""
    try:
        return Found(inspect_stream(io.BytesIO(data)))
    except Exception:
        log.warning("a payload of %d bytes could not be inspected", len(data),
                    exc_info=True)
        return Found()


class InspectingReader:
    """A binary stream whose bytes, as its reader (the payload store's ``put``) takes
    them, are inspected on a thread of their own: the payload is read once, never whole
    in memory (at most :attr:`DEPTH` chunks wait for the inspector), and inspection is
    done when the stream has been read to its end. :meth:`attributes` then gives what
    was found; :meth:`close` ends the inspection of a stream not read to its end (a
    refused body). An inspector that fails or stops early leaves no attributes and
    never blocks the reader: its thread takes the rest of the chunks and drops them."""

    DEPTH = 4

    def __init__(self, stream: IO[bytes]):
        self._stream = stream
        self._chunks: queue.Queue[bytes] = queue.Queue(self.DEPTH)
        self._ended = False  # the end (or a stop) was handed to the thread
        self._complete = False  # the stream was read to its end
        self._found = Found()
        self._thread = threading.Thread(target=self._inspect, name="inspect", daemon=True)
        self._thread.start()

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        if not self._ended:
            self._chunks.put(bytes(data))
            self._ended = self._complete = not data
        return data

    def attributes(self) -> list[tuple[str, str]]:
        """What the inspection found, once the stream was read to its end ([] else)."""
        self.close()
        return self._found if self._complete else Found()

    def close(self) -> None:
        """End the inspection (the stream is not read on) and wait for its thread."""
        if not self._ended:
            self._ended = True
            self._chunks.put(b"")
        self._thread.join()

    def _inspect(self) -> None:
        pipe = _Pipe(self._chunks)
        try:
            env = inspect_stream(pipe)
            self._found = Found(env)
        except Exception:
            log.warning("a streamed payload could not be inspected", exc_info=True)
        finally:
            pipe.drain()


class _Pipe:
    """The reading end of :class:`InspectingReader`'s queue: a blocking binary stream
    whose ``read(n)`` gives ``n`` bytes unless the end came first."""

    def __init__(self, chunks: queue.Queue[bytes]):
        self._chunks, self._left, self._done = chunks, b"", False

    def read(self, size: int = -1) -> bytes:
        parts, have = [self._left], len(self._left)
        while not self._done and (size < 0 or have < size):
            chunk = self._chunks.get()
            if not chunk:
                self._done = True
                break
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        cut = len(data) if size < 0 else size
        data, self._left = data[:cut], data[cut:]
        return data

    def drain(self) -> None:
        """Take the chunks left up to the end, so that the writer never waits."""
        while not self._done:
            self._done = not self._chunks.get()
