"""The interface a plugin implements (SPEC 9).

A plugin type is a class registered under the entry-point group ``b2bhub.plugins``.
It declares whether it is a source, a target or both (``roles``), a configuration
schema (:class:`b2bhub.config_schema.Field` list, from which the web form and the API
are generated), and implements:

* a target: ``deliver(delivery, payload, context) -> Outcome`` and optionally
  ``probe() -> bool | None``, a cheap check that the destination is up, run by the
  workers every probe interval (``b2bhub.engine.probes``): while it says False (or
  raises, or hangs past its timeout) no attempt goes out;
* a source: it is given a :class:`SourceContext` whose ``store_and_dispatch`` stores a
  message; scheduled sources implement ``poll(context)`` and take a ``polling_interval``
  (seconds) in their configuration. A file source hands its files to the context as
  :class:`PickedFile` s (``take_file``): the core stores them in batches and removes each
  file only after the transaction that recorded it committed.

Any plugin may implement ``start()`` (called once per process before anything else;
raising :class:`PluginStartError` puts the instance in state Error) and the class method
``config_problems(config)`` (checks that span several fields, run when an instance is
saved).

A plugin gets plain values and narrow contexts, never the app or a database session,
and never sets a status: the core derives it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any, ClassVar, Protocol

from b2bhub.domain.outcome import Answer, Outcome
from b2bhub.domain.retry import RetryPolicy

__all__ = ["Answer", "DeliveryInfo", "FileChanged", "Outcome", "PayloadReader", "PickedFile",
           "Plugin", "PluginStartError", "SourceContext", "TargetContext"]


class PluginStartError(Exception):
    """An instance cannot start; the message is the reason shown with state Error."""


class FileChanged(OSError):
    """A picked file is no longer the one that was looked at (size, mtime or type)."""


@dataclass(frozen=True)
class DeliveryInfo:
    """What a target knows of the delivery it is attempting."""

    delivery_id: int
    message_id: int
    target: str
    attempt: int
    source: str
    from_party: str
    to_party: str
    direction: str
    original_filename: str | None
    external_id: str | None
    correlation_id: str | None
    sequence_key: str | None
    created_at: datetime
    payload_stages: tuple[str, ...]


class PayloadReader(Protocol):
    """Opens a recorded payload stage as a binary stream (sha256 checked at its end)."""

    def stages(self) -> tuple[str, ...]: ...

    def size(self, stage: str) -> int: ...

    def digest(self, stage: str) -> str:
        """The stage's sha256 hex digest, as recorded: compare content without reading it."""

    def open(self, stage: str) -> IO[bytes]: ...


class TargetContext(Protocol):
    """The narrow view of the core a target's ``deliver`` gets."""

    now: datetime
    #: the URL the destination may POST this attempt's result to later (receipts by
    #: callback, SPEC 8), None where the core offers none
    callback_url: str | None
    #: the receipt reference that URL settles: return it in Outcome.awaiting_receipt
    receipt_ref: str | None
    #: the same on every attempt of this delivery, unique to it (None: none offered)
    idempotency_key: str | None

    def wire_started(self) -> None:
        """Say that bytes may have reached the partner: an interruption from here on
        puts the delivery to Retrying rather than back to the queue."""

    def log(self, text: str) -> None: ...


class PickedFile(Protocol):
    """A file a file source offers its context; the source owns the filesystem."""

    #: the path relative to the source's directory, as recorded (valid text, no NUL)
    relative: str
    size: int
    mtime_ns: int

    def open(self) -> IO[bytes]:
        """Open for reading, never through a symbolic link; :class:`FileChanged` if it is
        no longer the file of ``size`` and ``mtime_ns``."""

    def unchanged(self) -> bool:
        """True while the same regular file (size, mtime) stands at the place."""

    def remove(self) -> bool:
        """Remove the file if it is unchanged: True when it is gone from the place, False
        when a different file stands there now (left alone); OSError if removal failed."""

    # optional: def sync_removal(self) -> None, and a hashable ``directory``:
    #     make the removal durable (fsync the directory); OSError if it could not be.
    #     After removing a batch, the context calls it once per ``directory``.
    # optional: ``path``, the file's name for the payload store to take it by a hard
    #     link instead of a copy (the store checks that the name still is the file
    #     open() gave and copies when it is not, or when it has another name).


class SourceContext(Protocol):
    """The narrow view of the core a source gets. Party kinds are ``"organization"``
    and ``"partner"``."""

    instance_name: str

    def store_and_dispatch(self, payload: IO[bytes] | bytes, from_party: str, to_party: str,
                           filename: str | None = None, **kw: Any) -> int: ...

    def party_kind(self, name: str) -> str | None:
        """The kind of the party of that name, None if there is none."""

    def organizations(self) -> list[str]:
        """The names of the organizations, looked up now."""

    def take_file(self, file: PickedFile, from_party: str, to_party: str,
                  filename: str) -> bool:
        """Store a complete file as a message in the current batch; False if it changed
        while being read. The file is removed once its batch committed."""

    def flush(self) -> list[int]:
        """Commit the current batch now; the ids of the messages made."""

    def recover_files(self, find: Callable[[str], PickedFile | None]) -> int:
        """Finish what a process that died after a commit left: remove each file stored
        but not removed (``find`` looks one up by its relative path). Returns how many."""

    def log(self, text: str) -> None: ...


class Plugin:
    """Base class for plugin types. Subclasses set the class attributes below."""

    #: the type name, e.g. ``file_writer`` (the entry point's name must match)
    type_name: ClassVar[str] = ""
    #: ``{"source"}``, ``{"target"}`` or both
    roles: ClassVar[frozenset[str]] = frozenset()
    #: a list of :class:`b2bhub.config_schema.Field`
    config_schema: ClassVar[list] = []
    #: the retry schedule used when neither the instance nor a rule says otherwise
    default_retry_policy: ClassVar[RetryPolicy] = RetryPolicy()
    #: how many due deliveries one worker claims at once; a target whose attempts wait
    #: on the network keeps 1 so that several worker processes share the work
    claim_batch: ClassVar[int] = 1
    description: ClassVar[str] = ""

    def __init__(self, instance_name: str, config: dict[str, Any]):
        self.instance_name = instance_name
        self.config = config

    def start(self) -> None:
        """Prepare the instance in this process; raise :class:`PluginStartError` with
        the reason when it cannot run."""

    @classmethod
    def config_problems(cls, config: dict[str, Any]) -> dict[str, str]:
        """Problems spanning several fields of a validated configuration, by field."""
        return {}

    # target side -------------------------------------------------------------
    def deliver(self, delivery: DeliveryInfo, payload: PayloadReader,
                context: TargetContext) -> Outcome:
        raise NotImplementedError

    def before_settle(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Called by the worker before it records the outcomes of this instance's
        attempts gathered so far (one settlement for several attempts of a claimed
        batch): make durable what they report, once for the group. Returns the outcomes
        to record, same length and order; an outcome whose effect could not be made
        durable becomes an error (retried)."""
        return outcomes

    def probe(self) -> bool | None:
        """True online, False offline, None: this instance has no probe (e.g. no probe
        URL configured). Raise to say why it is offline: the text is shown. Runs on a
        thread of its own beside the instance's attempts; bound your own network time
        (the core gives up after 10 s and counts that as offline). The base class has
        no probe: a type that does not override this is never probed."""
        return None

    # source side -------------------------------------------------------------
    def poll(self, context: SourceContext) -> Iterator[int] | None:
        """Scheduled sources collect here; return the ids of the messages made."""
        return None

    @classmethod
    def is_source(cls) -> bool:
        return "source" in cls.roles

    @classmethod
    def is_target(cls) -> bool:
        return "target" in cls.roles
