"""The interface a plugin implements (SPEC 9).

A plugin type is a class registered under the entry-point group ``b2bhub.plugins``.
It declares whether it is a source, a target or both (``roles``), a configuration
schema (:class:`b2bhub.plugin.schema.Field` list, from which the web form and the API
are generated), and implements:

* a target: ``deliver(delivery, payload, context) -> Outcome`` and optionally
  ``probe() -> bool | None``, a cheap check that the destination is up, run by the
  workers every probe interval (``b2bhub.engine.probes``): while it says False (or
  raises, or hangs past its timeout) no attempt goes out;
* a source: it is given a :class:`SourceContext` whose ``store_and_dispatch`` stores a
  message; scheduled sources implement ``poll(context)`` and take a ``polling_interval``
  (seconds) in their configuration, and say a failed fetch with
  ``record_collection_error`` (a message in status Collection error, SPEC 9). A file
  source hands its files to the context as :class:`PickedFile` s (``take_file``): the
  core stores them in batches and removes each file only after the transaction that
  recorded it committed. A file source may take ``scan_shards`` (1 to
  :data:`MOST_SHARDS`) to have its scan split across processes by the hash of each
  file's path (``SourceContext.shard``).

Any plugin may implement ``start()`` (called once per process before anything else;
raising :class:`PluginStartError` puts the instance in state Error) and the class method
``config_problems(config)`` (checks that span several fields, run when an instance is
saved).

A plain source or target gets plain values and narrow contexts, never the app or a
database session, and never sets a status: the core derives it.

Protocol hooks (SPEC 3), each optional, declared on the plugin class; a protocol such as
AS2 (``plugins/as2/``) is built from them alone:

* **a receiving endpoint**: ``endpoint_prefix = "as2"`` and the class method
  ``handle_request(request: EndpointRequest) -> EndpointReply``. The core serves
  ``POST /<prefix>/<instance>`` outside login and CSRF (the protocol authenticates its
  requests), reads a body of at most :data:`PREREAD` bytes before any database work,
  looks the enabled instance of the type up (``endpoint_lookup = "handler"``: the
  handler looks it up itself, with the rest it reads, when the body was preread), answers
  404 for none, 413 past the instance's ``max_size`` and 503 (plain text, nothing taken)
  for an unexpected failure, and publishes the wake-ups the request committed once the
  answer is sent. The whole request is one transaction on the request's session.
* **party profile kinds**: ``profile_kinds = (ProfileKind(...),)``; the API serves each at
  ``/{organizations,partners}/<name>/profiles/<kind>`` (GET, PUT, DELETE) and the UI at
  ``/ui/parties/<kind>/<name>/<profile kind>``. A :class:`ProfileKind` validates and
  stores (``protocol_profiles`` rows), never shows a secret again once saved, and may
  draw its own UI page (``ui_page``); without one the UI shows the stored profile and a
  form drawn from its ``schema``. A kind may offer a partner's **connection test**
  (:meth:`ProfileKind.test_connection`): the core serves it at
  ``POST /partners/<name>/profiles/<kind>/test`` (admin) and as the UI's "Test connection"
  button, and shows the :class:`ConnectionTest` it returns step by step. Its test
  message is stored with ``store_test_message`` (never routed) and ended with
  ``finish_test_message``.
* **profile actions**: ``ProfileKind.actions`` names operator actions beyond a save
  (SFTP's host key: fetch it, pin it), served at
  ``POST /{organizations,partners}/<name>/profiles/<kind>/actions/<action>`` (admin)
  and run by :meth:`ProfileKind.run_action`, which writes its own history lines.
* **instance actions**: ``instance_actions = ("fetch_host_key", ...)`` and the class
  method ``run_instance_action(config, action, body) -> InstanceActionResult``: served
  at ``POST /api/v1/plugins/configs/<instance>/actions/<action>`` (admin) and as
  buttons on the instance's page; the core saves the changes it returns and writes its
  history line naming the operator.
* **periodic jobs**: ``periodic_jobs = (PeriodicJob(name, run, every=seconds),)`` or
  ``at="HH:MM"`` (UTC, daily); beat schedules them, ``run_job_soon(name)`` asks a worker
  to run one now. ``run(session, store, now)`` commits its own work or leaves it to the
  core, which commits after it returns.
* **intake tokens**: ``takes_tokens = True`` and the classmethods ``create_token``,
  ``revoke_token`` and ``list_tokens`` (session, instance, ...): the core serves them at
  ``/api/v1/plugins/configs/<instance>/tokens`` and as ``b2bhub token create|revoke NAME
  --instance INSTANCE``; the plugin keeps them (hashed) and checks them on its endpoint.
* **tables of its own**: its models on :data:`Base` and ``migrations = "<directory>"``,
  an Alembic versions directory in its package: a branch of its own (first revision
  ``down_revision = None``, ``branch_labels = ("<name>",)``, ``depends_on`` the core
  revision it needs). ``b2bhub db upgrade`` applies the core's and every plugin's.

**Only through this interface.** A plugin imports this module (and
:mod:`b2bhub.plugin.schema`) and nothing else of b2bhub, and writes no SQL over the
core's tables; this module exports none of the core's ORM models. What a plugin needs of
the core is offered here under stable names (the section "The core for protocols" at the
end), each the core's own object:

* **the intake fast path**, offered to every source: :class:`EndpointLookup`
  (``b2bhub.engine.endpoint_lookup``), declared once by a type with the settings keys,
  party roles and values of its own tables it needs, reads an endpoint's instance
  (enabled, configuration), parties' kinds, settings rows and those values in one
  statement, built once per shape and run as the driver's own SQL on PostgreSQL
  (``run_read``); ``store_and_dispatch_many`` / ``store_and_dispatch_grouped`` (grouped
  commits of requests arriving together), ``writes_in_one_statement``,
  ``store_refused``; ``deliver_in_request`` and ``delivery_standing`` for a source that
  delivers inside its request; the checks of an interchange at intake (parties from its
  envelope, its envelope errors, duplicates: ``IntakeChecks``, ``check_intake``,
  ``IntakeRefusal``, ``store_intake_refusal``, ``store_checked_many``,
  ``alert_duplicates``) for a source that stores its messages itself;
* EDI inspection for a source that stores its messages itself (docs/edi.md): it inspects
  what it holds, never the payload read back from the store: ``inspect_bytes`` (a body
  in memory) or ``InspectingReader`` (a stream, inspected as the store reads it), the
  attributes as the message's rows (``attribute_rows_of``; ``message_rows`` with the
  acknowledgment rows its envelope brings), and its parties from the
  envelope (``envelope_identities``, ``by_envelope``, ``PARTIES_FROM_ENVELOPE``;
  ``EndpointLookup`` reads an envelope's identities' parties in its one statement);
* sessions (``new_session``, ``connection``), the payload store (``payload_store``,
  ``PayloadStore``, ``PayloadBatch``, ``StoredPayload``, ``PayloadError``, ``syncfs``);
* the core's rows as plain values (``b2bhub.services.protocol``): ``instance_type``,
  ``message_view``, ``record_stage``, ``delivery_of``, ``latest_line``; parties' protocol
  profiles with their certificates (``get_protocol_profile``, ``save_protocol_profile``,
  ``delete_protocol_profile``, ``find_protocol_profile``, ``address_holder``,
  ``profile_parties``, ``profile_certificates``);
* settling a receipt (``settle_receipt``), history lines and alerts (``add_line``,
  ``raise_alert``, ``resolve_alert``), settings versions (``bump_version``), jobs
  (``run_job_soon``), connection tests' messages, refusals (``ServiceError``,
  ``NotFound``, ``Conflict``), the file plugins' patterns (``path_pattern``,
  ``filename_pattern``, ``validate_name``) and a plugin page's helpers (``ui_*``);
* for a plugin's own tables: ``Base``, ``BigId``, ``utcnow``.

``tests/test_plugin_imports.py`` holds the built-in plugins (``plugins/``) to this.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any, ClassVar, Protocol

from b2bhub.domain.outcome import ANSWER_BODY_LIMIT, Answer, Outcome, OutcomeKind
from b2bhub.domain.retry import FILE_WRITER_DEFAULT, RECORD_AT_ONCE, RetryPolicy
from b2bhub.domain.shards import MOST_SHARDS, WHOLE, Shard

__all__ = ["ANSWER_BODY_LIMIT", "FILE_WRITER_DEFAULT", "RECORD_AT_ONCE", "OutcomeKind",
           "PREREAD", "Answer",
           "ConnectionTest", "DeliveryInfo", "EndpointReply", "EndpointRequest",
           "FileChanged", "Outcome", "PayloadReader", "PeriodicJob",
           "PickedFile", "Plugin", "PluginStartError", "ProfileKind", "SourceContext",
           "TargetContext", "TestStep", "Envelope", "Inspector", "INSPECTOR_GROUP",
           "AckRequest", "Acknowledgment", "InstanceActionResult", "Shard", "WHOLE",
           "MOST_SHARDS"]

#: bodies up to this size (by Content-Length) are read before any database work
PREREAD = 256 * 1024


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
    #: the W3C traceparent of the message's trace (None when it was stored untraced)
    trace_parent: str | None = None


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
    # optional: ``keep = True``: the file stays in place after its commit; its pickup
    #     is kept as the memory that it was taken (:meth:`SourceContext.taken`) until
    #     ``recover_files``' ``find`` says it is gone or changed (then forgotten).


class SourceContext(Protocol):
    """The narrow view of the core a source gets. Party kinds are ``"organization"``
    and ``"partner"``."""

    instance_name: str
    #: the part of the source this scan is for (:class:`Shard`): a scheduled source
    #: whose configuration sets ``scan_shards`` to ``n > 1`` is scanned as ``n``
    #: shards, each under a lease of its own, possibly in ``n`` processes at once.
    #: A file source takes only the files whose recorded relative path the shard
    #: ``owns``, and keeps what it remembers between scans per shard; the core's
    #: ``recover_files`` and ``taken`` see only the shard's pickups. ``WHOLE`` (the
    #: default) owns every file.
    shard: Shard

    def store_and_dispatch(self, payload: IO[bytes] | bytes, from_party: str, to_party: str,
                           filename: str | None = None, *, correlation_id: str | None = None,
                           **kw: Any) -> int:
        """Store one message and dispatch it in a transaction of its own; its id.
        ``correlation_id``: the id the sender gave the exchange (an HTTP
        ``X-Correlation-Id``, a file name's part), kept on the message, filterable, and
        sent on by targets that carry one (``http_poster``: ``X-Correlation-Id``); other
        keywords are :class:`b2bhub.engine.dispatch.NewMessage` fields
        (``external_id``, ``sequence_key``...)."""

    def party_kind(self, name: str) -> str | None:
        """The kind of the party of that name, None if there is none."""

    def organizations(self) -> list[str]:
        """The names of the organizations, looked up now."""

    def take_file(self, file: PickedFile, from_party: str, to_party: str,
                  filename: str, correlation_id: str | None = None) -> bool:
        """Store a complete file as a message in the current batch; False if it changed
        while being read. The file is removed once its batch committed."""

    def flush(self) -> list[int]:
        """Commit the current batch now; the ids of the messages made."""

    def recover_files(self, find: Callable[[str], PickedFile | None]) -> int:
        """Finish what a process that died after a commit left: remove each file stored
        but not removed (``find`` looks one up by its relative path). Returns how many."""

    def taken(self) -> set[tuple[str, int, int]]:
        """(relative path, size, mtime_ns) of the files stored and not yet removed:
        kept files (``keep``) among them, which a source must not take again."""

    def load_state(self) -> dict:
        """The JSON object this instance saved last with :meth:`save_state`, or {}."""

    def save_state(self, state: dict) -> None:
        """Keep a small JSON object for this instance across scans and restarts (the
        key ``_collection_error`` is the core's: neither loaded nor saved)."""

    def record_collection_error(self, reason: str, from_party: str, to_party: str, *,
                                answer_start: str = "", filename: str | None = None,
                                error_class: str | None = None) -> int | None:
        """A scheduled source could not fetch (no connection, no answer in time, an
        error answer): the core records a message in status Collection error, with no
        payload and no deliveries, ``reason`` and ``answer_start`` (the start of the
        answer, as text) in its status text and history, and raises ``message_failed``.
        The instance's retry policy (over :attr:`Plugin.collection_retry_policy`) may
        first try again: ``error_class`` picks its rule (``connection``, ``auth``...),
        and while it retries nothing is recorded and None is returned. The first
        recorded failure of an episode makes the message; the next ones, until
        :meth:`collection_succeeded`, are counted on it (``b2bhub.engine.collection``).
        Keep ``reason`` free of what changes at every poll: a changed reason is a
        history line. Returns the message's id."""

    def collection_succeeded(self) -> None:
        """A fetch succeeded (whatever its answer): an open episode of collection
        errors ends, its alert resolved. Cheap when none is open; call it each time."""

    def log(self, text: str) -> None: ...


@dataclass
class EndpointRequest:
    """One ``POST /<prefix>/<instance>`` as the core hands it to ``handle_request``.

    ``body`` is the request's stream (an in-memory one when it was preread: up to
    :data:`PREREAD` bytes by Content-Length). ``config`` is the enabled instance's
    configuration, or None when the type looks the instance up itself
    (``endpoint_lookup = "handler"``) and the body was preread. ``session`` is the
    request's database session: what the handler commits is the request's one
    transaction; wake-ups of what it commits are published after the answer."""

    type_name: str
    instance: str
    config: dict | None
    headers: list[tuple[str, str]]
    body: IO[bytes]
    content_length: int | None
    now: datetime
    session: Any
    store: Any
    #: the instance's ``max_size`` (or the core's default); :meth:`read` stops past it
    max_size: int = 100 * 1024 * 1024
    #: the instance's ``parties_from`` (``source`` or ``envelope``, docs/edi.md) when the
    #: core looked it up (``config`` given); else the handler's lookup reads it
    #: (:attr:`Looked.parties_from`)
    parties_from: str = "source"
    #: the instance's :class:`IntakeChecks` (``parties_from`` among them) when the core
    #: looked it up; else None, and the handler's lookup reads them
    #: (:attr:`Looked.checks`)
    checks: Any = None

    def read(self, chunk: int = 1 << 20) -> bytes | None:
        """The whole body, or None once it passes ``max_size`` (the rest is not read)."""
        if self.content_length is not None and self.content_length > self.max_size:
            return None
        parts, total = [], 0
        while True:
            data = self.body.read(chunk)
            if not data:
                return b"".join(parts)
            total += len(data)
            if total > self.max_size:
                return None
            parts.append(data)


@dataclass
class EndpointReply:
    """The answer of ``handle_request``; ``after`` runs once it was sent (a wake-up)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    after: Callable[[], None] | None = None


#: the states of a connection test's step
STEP_STATES = ("ok", "failed", "skipped", "pending", "not_run")


@dataclass(frozen=True)
class TestStep:
    """One step of a connection test: ``name`` (e.g. ``tcp``), a ``label`` to show,
    ``state`` (:data:`STEP_STATES`: ``skipped`` does not apply, ``pending`` waits on
    the partner, ``not_run`` after an earlier failure) and a ``text`` saying what was
    found."""

    name: str
    label: str
    state: str
    text: str = ""


@dataclass(frozen=True)
class ConnectionTest:
    """What a connection test found: ``ok`` when no step failed (and none is pending),
    each step in order, the test message's id and a one-line ``summary``."""

    ok: bool
    steps: tuple[TestStep, ...]
    message_id: int | None = None
    summary: str = ""


class ProfileKind:
    """A kind of party profile a protocol adds (``as2``): its schema, validation, storage
    and secrets. Subclass and implement :meth:`get`, :meth:`save` and :meth:`delete`
    (raise :class:`ServiceError` / :class:`NotFound` / :class:`Conflict` from this module
    for bad input, missing or clashing profiles); the core commits. A secret is taken by
    ``save`` and never returned by ``get`` again."""

    #: the profile kind in URLs and ``protocol_profiles.protocol``, e.g. ``as2``
    kind: str = ""
    #: shown in the UI: "AS2 profile", "Add AS2 profile"
    label: str = ""
    #: a list of :class:`b2bhub.plugin.schema.Field`: the fields ``save`` takes (the UI
    #: form without ``ui_page`` is drawn from it; ``secret`` fields are never shown)
    schema: list = []
    #: (label, key) of what the page drawn from the schema shows of a stored profile
    #: before its fields (values :meth:`get` answers that no form takes: a fingerprint)
    shown: tuple = ()
    #: what a certificate the kind stores is called in the ``certificate_expiring``
    #: alert ("the AS2 certificate of acme ..."); empty: "<label> certificate"
    certificate_name: str = ""

    def fields(self) -> tuple[str, ...]:
        """The names a PUT may carry (default: the schema's)."""
        return tuple(f.name for f in self.schema)

    def get(self, session, party_kind: str, name: str) -> dict:
        raise NotImplementedError

    def save(self, session, party_kind: str, name: str, body: dict) -> dict:
        """Create or update from the API shape, all or nothing; returns :meth:`get`'s."""
        raise NotImplementedError

    def delete(self, session, party_kind: str, name: str) -> None:
        raise NotImplementedError

    def describe(self, profile: dict) -> str:
        """A few words naming a saved profile in its history line."""
        return ""

    def json_schemas(self) -> dict[str, dict]:
        """The API's shapes of the profile as JSON Schema, for the OpenAPI document:
        ``{"body": what a PUT takes, "answer": what GET and PUT answer}``, and
        ``"server_checks"``: the body fields only ``save`` can judge (a certificate that
        must parse, one required when the profile is new). Default: the
        :attr:`schema`'s fields, none required (a PUT changes the fields it names), and
        an object. A kind says more by overriding this; the constraints it writes
        should be the ones ``save`` enforces, so a client can tell a good body from a
        bad one before sending it."""
        from b2bhub.plugin.schema import schema_to_json
        return {"body": {**schema_to_json(self.schema), "required": []},
                "answer": {"type": "object"}}

    #: ``ui_page(party, shown, defaults) -> response`` may be set to draw the page itself

    #: the operator's actions on a profile beyond saving it (SFTP: fetch and pin the
    #: server's host key); the core serves each at ``POST /{organizations,partners}/
    #: <name>/profiles/<kind>/actions/<action>`` (admin) with a JSON object body and
    #: answers what :meth:`run_action` returns; the kind writes its own history lines
    actions: tuple[str, ...] = ()

    #: the parties whose profiles of this kind offer :attr:`actions` (AS2's certificate
    #: exchange: a partner's only); the document lists them there alone, and the core
    #: answers 404 for the others without calling :meth:`run_action`
    action_parties: tuple[str, ...] = ("organization", "partner")

    def action_schemas(self) -> dict[str, dict]:
        """Each action's body as JSON Schema, for the OpenAPI document (default: any
        object)."""
        return {action: {"type": "object"} for action in self.actions}

    def run_action(self, session, party_kind: str, name: str, action: str, body: dict,
                   actor: str) -> dict:
        """Run one of :attr:`actions` for ``actor``; the answer as JSON. Refuse with
        :class:`ServiceError`, :class:`NotFound`; the core commits."""
        raise NotImplementedError

    #: named starting points of a profile (vendor presets): the core serves
    #: :meth:`presets` at ``GET /profile-kinds/<kind>/presets`` (viewer) when set
    has_presets: bool = False

    def presets(self) -> list[dict]:
        """The kind's presets as JSON, each a dict with at least ``name``."""
        return []

    def preset_schema(self) -> dict:
        """One preset of :meth:`presets` as JSON Schema, for the OpenAPI document."""
        return {"type": "object", "required": ["name"]}

    #: whether :meth:`test_connection` is offered (for partners' profiles)
    can_test: bool = False

    def test_connection(self, session, name: str, actor: str, options: dict
                        ) -> ConnectionTest:
        """Test the connection to partner ``name`` per its profile, as ``actor``;
        ``options``: ``organization`` (who sends; None: the only one that can) and
        ``wait`` (seconds to wait for a receipt that comes later). Commits its own
        work (its test message must be seen by other processes while it waits)."""
        raise NotImplementedError


@dataclass(frozen=True)
class InstanceActionResult:
    """What an instance action did: the ``answer`` (JSON) for the caller, the
    configuration ``changes`` to save (None: none), the history line's ``text`` (the
    core puts the operator's name first) and, optionally, a follow-up the UI offers as a
    button (``confirm``: ``{"action", "body", "label"}``, e.g. pinning the key just
    fetched)."""

    answer: dict
    text: str
    changes: dict | None = None
    confirm: dict | None = None


@dataclass(frozen=True)
class PeriodicJob:
    """Work beat starts every ``every`` seconds, or daily at ``at`` ("HH:MM", UTC).
    ``run(session, store, now)`` returns a count or None; ``expires``: seconds after
    which a start not yet taken by a worker is dropped (the next one comes)."""

    name: str
    run: Callable[[Any, Any, datetime], Any]
    every: float | None = None
    at: str | None = None
    expires: float | None = None


class Plugin:
    """Base class for plugin types. Subclasses set the class attributes below."""

    #: the type name, e.g. ``file_writer`` (the entry point's name must match)
    type_name: ClassVar[str] = ""
    #: ``{"source"}``, ``{"target"}`` or both
    roles: ClassVar[frozenset[str]] = frozenset()
    #: a list of :class:`b2bhub.plugin.schema.Field`
    config_schema: ClassVar[list] = []
    #: the retry schedule used when neither the instance nor a rule says otherwise
    default_retry_policy: ClassVar[RetryPolicy] = RetryPolicy()
    #: a scheduled source's: how a failed fetch is tried again before the core records
    #: a Collection error (b2bhub.engine.collection); the instance's ``retry_policy``
    #: overrides it. By default no retry: the first failed fetch is recorded.
    collection_retry_policy: ClassVar[RetryPolicy] = RECORD_AT_ONCE
    #: how many due deliveries one worker claims at once; a target whose attempts wait
    #: on the network keeps 1 so that several worker processes share the work
    claim_batch: ClassVar[int] = 1
    description: ClassVar[str] = ""

    # protocol hooks (module docstring) ------------------------------------------
    #: serve ``POST /<endpoint_prefix>/<instance>`` (with :meth:`handle_request`)
    endpoint_prefix: ClassVar[str | None] = None
    #: "core": the core looks the instance up before calling; "handler": for a preread
    #: body the handler does (in the statement it reads the rest with)
    endpoint_lookup: ClassVar[str] = "core"
    #: the 404 of a missing or disabled instance says "no enabled <label> named ..."
    endpoint_label: ClassVar[str] = ""
    #: :class:`ProfileKind` s this type adds (several types of one protocol may name the
    #: same one; the core keeps one per kind)
    profile_kinds: ClassVar[tuple] = ()
    #: :class:`PeriodicJob` s, by unique name
    periodic_jobs: ClassVar[tuple] = ()
    #: an Alembic versions directory holding this type's own tables' migrations
    migrations: ClassVar[str | None] = None
    #: the type keeps named intake tokens per instance (module docstring)
    takes_tokens: ClassVar[bool] = False

    #: an operator's actions on an instance beyond a save (SFTP: fetch and pin the
    #: server's host key); the core serves each at ``POST /api/v1/plugins/configs/
    #: <instance>/actions/<action>`` (admin) and as buttons on the instance's page
    instance_actions: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def instance_action_schemas(cls) -> dict[str, dict]:
        """Each instance action's body as JSON Schema (default: any object)."""
        return {action: {"type": "object"} for action in cls.instance_actions}

    @classmethod
    def run_instance_action(cls, config: dict[str, Any], action: str, body: dict
                            ) -> InstanceActionResult:
        """Run one of :attr:`instance_actions` on an instance of ``config``; refuse with
        :class:`ServiceError`. The core saves the result's ``config`` changes (checked
        as a save is), writes its ``text`` as a ``config_changed`` line naming the
        operator, and answers its ``answer``."""
        raise NotImplementedError

    @classmethod
    def create_token(cls, session, instance: str, name: str, actor: str) -> str:
        raise NotImplementedError

    @classmethod
    def revoke_token(cls, session, instance: str, name: str, actor: str) -> None:
        raise NotImplementedError

    @classmethod
    def list_tokens(cls, session, instance: str) -> list[dict]:
        raise NotImplementedError

    @classmethod
    def payload_references(cls) -> list[tuple[Any, Any]]:
        """(message id column, digest column) pairs of this plugin's own tables whose rows
        keep a stored payload alive (AS2: a received message's MDN). The nightly cleanup
        keeps such a payload while its row exists; the rows must go with their message
        (a foreign key ``ON DELETE CASCADE``)."""
        return []

    @classmethod
    def handle_request(cls, request: EndpointRequest) -> EndpointReply:
        raise NotImplementedError

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


# --- The core for protocols -------------------------------------------------------------
# Stable names for what a protocol plugin needs of the core, resolved on first use (the
# engine imports this module, so these cannot be imported at its top). Each is the
# core's own object: no wrapper, no extra cost.

_PROTOCOL_API = {
    # sessions, settings and the payload store
    "new_session": "b2bhub.runtime.hub:new_session",
    "PRODUCT": "b2bhub.config.environment:PRODUCT",
    "payload_store": "b2bhub.runtime.hub:store",
    "connection": "b2bhub.engine.history:connection",
    # a hot read as psycopg's own SQL, compiled once (b2bhub.engine.driver)
    "run_read": "b2bhub.engine.driver:run_read",
    "bump_version": "b2bhub.engine.settings:bump_version",
    "PROFILES_VERSION_KEY": "b2bhub.engine.settings:PROFILES_VERSION_KEY",
    "PayloadStore": "b2bhub.payloads.store:PayloadStore",
    # a payload that cannot be read (missing, or not the bytes recorded)
    "PayloadError": "b2bhub.payloads.store:PayloadError",
    # one syncfs(2) for a file system (False where there is none: fsync each file)
    "syncfs": "b2bhub.payloads.store:syncfs",
    "PayloadBatch": "b2bhub.payloads.store:PayloadBatch",
    "StoredPayload": "b2bhub.payloads.store:StoredPayload",
    # what an endpoint reads before it stores a message, in one statement, compiled
    # once: its instance, parties, settings rows and values of its own tables
    "EndpointLookup": "b2bhub.engine.endpoint_lookup:EndpointLookup",
    "Looked": "b2bhub.engine.endpoint_lookup:Looked",
    # a received message stored and dispatched (or refused)
    "INTAKE_KEYS": "b2bhub.engine.dispatch:INTAKE_KEYS",
    "NewMessage": "b2bhub.engine.dispatch:NewMessage",
    "direction_of": "b2bhub.engine.dispatch:direction_of",
    "store_and_dispatch_many": "b2bhub.engine.dispatch:store_and_dispatch_many",
    "writes_in_one_statement": "b2bhub.engine.dispatch:writes_in_one_statement",
    "store_and_dispatch_grouped": "b2bhub.engine.grouped:store_and_dispatch_grouped",
    "store_refused": "b2bhub.engine.dispatch:store_refused",
    # a received interchange's checks at intake (parties from the envelope, envelope
    # errors, duplicates; docs/edi.md): the instance's settings, one call per message
    # or batch, and the alerts of duplicates let through for a source storing them itself
    "IntakeChecks": "b2bhub.engine.envelope_checks:IntakeChecks",
    "IntakeRefusal": "b2bhub.engine.envelope_checks:IntakeRefusal",
    "check_intake": "b2bhub.engine.envelope_checks:check_intake",
    "store_checked_many": "b2bhub.engine.envelope_checks:store_checked_many",
    "store_intake_refusal": "b2bhub.engine.envelope_checks:store_intake_refusal",
    "alert_duplicates": "b2bhub.engine.envelope_checks:alert_duplicates",
    # OpenPGP at intake (docs/openpgp.md) for a source that stores its messages itself:
    # ``openpgp_unpacker(session, store, config, commit=False)(from, to, stored)``
    # gives the stages, rows and lines of the message (a refusal among its lines, which
    # check_intake turns into an IntakeRefusal); the type sets ``openpgp_intake = True``
    "openpgp_unpacker": "b2bhub.engine.openpgp_stages:Unpacker",
    # EDI inspection of what a receiver holds (docs/edi.md): bytes in memory, or a
    # stream read through to the payload store; the attributes as a message's rows;
    # parties from the envelope
    "inspect_bytes": "b2bhub.engine.inspection:inspect_bytes",
    "InspectingReader": "b2bhub.engine.inspection:InspectingReader",
    "attribute_rows_of": "b2bhub.engine.inspection:attribute_rows_of",
    "message_rows": "b2bhub.engine.inspection:message_rows",
    "envelope_identities": "b2bhub.engine.envelope_parties:envelope_identities",
    "by_envelope": "b2bhub.engine.envelope_parties:by_envelope",
    "PARTIES_FROM_ENVELOPE": "b2bhub.engine.envelope_parties:ENVELOPE",
    # a source's synchronous mode: the delivery attempted inside the request
    "deliver_in_request": "b2bhub.runtime.in_request:deliver_in_request",
    "delivery_standing": "b2bhub.runtime.in_request:delivery_standing",
    # the core's rows a plugin reads or writes, as plain values (b2bhub.services.protocol)
    "instance_type": "b2bhub.services.protocol:instance_type",
    "MessageView": "b2bhub.services.protocol:MessageView",
    "message_view": "b2bhub.services.protocol:message_view",
    "record_stage": "b2bhub.services.protocol:record_stage",
    "DeliveryView": "b2bhub.services.protocol:DeliveryView",
    "delivery_of": "b2bhub.services.protocol:delivery_of",
    "LineView": "b2bhub.services.protocol:LineView",
    "latest_line": "b2bhub.services.protocol:latest_line",
    # parties' protocol profiles (``protocol_profiles``) and their certificates
    "StoredProfile": "b2bhub.services.protocol:StoredProfile",
    "StoredCertificate": "b2bhub.services.protocol:StoredCertificate",
    "NewCertificate": "b2bhub.services.protocol:NewCertificate",
    "get_protocol_profile": "b2bhub.services.protocol:get_protocol_profile",
    "save_protocol_profile": "b2bhub.services.protocol:save_protocol_profile",
    "delete_protocol_profile": "b2bhub.services.protocol:delete_protocol_profile",
    "find_protocol_profile": "b2bhub.services.protocol:find_protocol_profile",
    "address_holder": "b2bhub.services.protocol:address_holder",
    "profile_parties": "b2bhub.services.protocol:profile_parties",
    "profile_certificates": "b2bhub.services.protocol:profile_certificates",
    # a connection test's message: stored never routed, then given its outcome
    "TEST_SOURCE": "b2bhub.engine.dispatch:TEST_SOURCE",
    "store_test_message": "b2bhub.engine.dispatch:store_test_message",
    "finish_test_message": "b2bhub.engine.dispatch:finish_test_message",
    # a receipt settled; history lines and alerts
    "settle_receipt": "b2bhub.engine.machine.receipts:settle_receipt",
    "DeliveryState": "b2bhub.domain.states:DeliveryState",
    "add_line": "b2bhub.engine.history:add_line",
    "raise_alert": "b2bhub.engine.history:raise_alert",
    "resolve_alert": "b2bhub.engine.history:resolve_alert",
    "run_job_soon": "b2bhub.runtime.jobs:run_job_soon",
    # a plugin's own tables: their base, id type and clock (the core's tables are
    # reached only through the functions above and below)
    "Base": "b2bhub.models:Base",
    "BigId": "b2bhub.models.base:BigId",
    "utcnow": "b2bhub.models:utcnow",
    # the kinds of parties
    "ORGANIZATION": "b2bhub.models:ORGANIZATION",
    "PARTNER": "b2bhub.models:PARTNER",
    # how soon a certificate's end is flagged (Parties page, dashboard, the alert)
    "CERTIFICATE_WARNING": "b2bhub.services.profiles:CERTIFICATE_WARNING",
    # raise (or resolve) certificate_expiring for a certificate just saved
    "certificate_alert": "b2bhub.services.profiles:certificate_alert",
    # refusals (the API's and the UI's error shape)
    "ServiceError": "b2bhub.services.errors:ServiceError",
    "Conflict": "b2bhub.services.errors:Conflict",
    "NotFound": "b2bhub.services.errors:NotFound",
    # that a party has no profile of a protocol, as a whole sentence (a refusal's text)
    "no_profile": "b2bhub.services.config:no_profile",
    # a text of ours, shown in the reader's language (docs/i18n.md): N_("... %(x)s", x=1)
    "N_": "b2bhub.domain.i18n:N_",
    "joined": "b2bhub.domain.i18n:joined",
    # the patterns of file sources and targets (modules): a poller's path pattern,
    # a writer's file name pattern; the name rule of parties and instances
    "path_pattern": "b2bhub.domain.path_pattern:",
    "filename_pattern": "b2bhub.domain.filename_pattern:",
    "validate_name": "b2bhub.domain.routing:validate_name",
    # configuration fields and retry schedules
    "Field": "b2bhub.plugin.schema:Field",
    "RetryPolicy": "b2bhub.domain.retry:RetryPolicy",
    "RetryRule": "b2bhub.domain.retry:RetryRule",
    "Strategy": "b2bhub.domain.retry:Strategy",
    # a plugin's own UI page (``ProfileKind.ui_page``): the core's form helpers
    "ui_submit": "b2bhub.web.kit:submit",
    "ui_button": "b2bhub.web.kit:button",
    "ui_form_status": "b2bhub.web.kit:form_status",
    "render_plugin_template": "b2bhub.web.kit:render_plugin_template",
    "ui_saved_line": "b2bhub.web.parties:saved_line",
    "ui_whole_number": "b2bhub.web.forms:_whole",
    "ui_session": "b2bhub.web.kit:request_session",
}


def __getattr__(name: str) -> Any:
    try:
        module, _, attr = _PROTOCOL_API[name].partition(":")
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr:  # "module:" names the module itself
        value = getattr(value, attr)
    globals()[name] = value
    return value


# --- document inspectors (docs/edi.md) ----------------------------------------------

#: the entry-point group of document inspectors, by name
INSPECTOR_GROUP = "b2bhub.inspectors"


@dataclass
class Envelope:
    """What an inspector read of a payload's envelope. ``sender`` / ``receiver`` are
    ``qualifier:id``; each group a dict of ``functional_id``, ``control``, ``version``,
    ``sets`` (its count); each set (transaction set or message) a dict of ``type``
    (``850``, ``ORDERS:D:96A``), ``control``, ``group`` (its group's control number) and
    ``reference`` (BEG03 / BGM 1004); ``errors`` names each envelope error found.
    ``sets`` keeps the first :attr:`MAX_DETAILS` (an interchange of 100,000 sets stays
    small in memory); ``set_count`` and ``types`` (distinct, in order) count them all."""

    MAX_DETAILS: ClassVar[int] = 10_000

    standard: str
    version: str = ""
    sender: str = ""
    receiver: str = ""
    control: str = ""
    date: str = ""
    separators: dict[str, str] = field(default_factory=dict)
    groups: list[dict] = field(default_factory=list)
    sets: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    set_count: int = 0
    types: list[str] = field(default_factory=list)
    #: what an acknowledgment (X12 997 / 999, EDIFACT CONTRL) acknowledges: one dict per
    #: group or interchange it answers for (``plugins/edi/acks.py`` names the keys);
    #: empty for any other document
    acknowledges: list[dict] = field(default_factory=list)
    #: each error of :attr:`errors` told to its place (:meth:`fault`), for an
    #: acknowledgment: a dict of ``level`` (``interchange``, ``group`` or ``set``),
    #: ``kind`` (``trailer`` missing, ``control`` number not matching, ``count`` wrong),
    #: ``segment`` (the trailer's tag), ``text``, ``group`` (the group's place in
    #: :attr:`groups`, None outside one), for a set its ``type``, ``control`` and
    #: ``identifier`` (EDIFACT S009 whole), for a wrong count ``said`` (the trailer's).
    #: A set's faults are kept for the first :attr:`MAX_DETAILS` of them
    faults: list[dict] = field(default_factory=list)
    #: how many sets had an error, by their group's place (None: outside a group),
    #: counted for all of them
    bad_sets: dict = field(default_factory=dict)
    #: header values an acknowledgment repeats: X12 ``usage`` (ISA15), ``application_
    #: sender`` / ``application_receiver`` (the first GS02 / GS03); EDIFACT ``test``
    #: (UNB 0035)
    headers: dict[str, str] = field(default_factory=dict)
    _bad: dict | None = field(default=None, repr=False, compare=False)

    def add_set(self, one: dict) -> dict:
        """Count a transaction set or message; keep its details while there is room."""
        self.set_count += 1
        if one["type"] not in self.types:
            self.types.append(one["type"])
        if len(self.sets) < self.MAX_DETAILS:
            self.sets.append(one)
        return one

    def error(self, text: str) -> None:
        """Name an envelope error (the first hundred are kept)."""
        if len(self.errors) < 100:
            self.errors.append(text)

    def fault(self, text: str, level: str, kind: str, segment: str, *,
              group: int | None = None, one: dict | None = None, **more: str) -> None:
        """Name an envelope error (:meth:`error`) and where it is (:attr:`faults`):
        ``one`` the set it is in, ``group`` its group's place in :attr:`groups`."""
        self.error(text)
        place = {"level": level, "kind": kind, "segment": segment, "text": text,
                 "group": group, **more}
        if one is not None:
            place.update(type=one["type"], control=one["control"])
            if self._bad is not one:  # a set with two errors counts once
                self._bad = one
                self.bad_sets[group] = self.bad_sets.get(group, 0) + 1
            if sum(self.bad_sets.values()) > self.MAX_DETAILS:
                return
        self.faults.append(place)


@dataclass(frozen=True)
class AckRequest:
    """What the core asks an inspector's ``acknowledge`` for (docs/edi.md): the
    partner's setting ``kind`` (``997`` or ``999``; an EDIFACT interchange gets a CONTRL
    with either), our control number for the acknowledgment (``control``, the next of
    the partner's and standard's counter), our identity and theirs (``qualifier:id``:
    ours is the one the interchange was sent to) and the time it is made."""

    kind: str
    control: int
    sender: str
    receiver: str
    now: datetime


@dataclass(frozen=True)
class Acknowledgment:
    """An inspector's functional acknowledgment of an interchange: the interchange to
    send back (``payload``), its ``document_type`` (``997``, ``999``, ``CONTRL``), the
    ``outcome`` as a word (``accepted``, ``accepted with errors``, ``partially
    accepted``, ``rejected``) and the errors it reports (``detail``, "" for none)."""

    payload: bytes
    document_type: str
    outcome: str
    detail: str = ""


class Inspector(Protocol):
    """A document inspector, registered under :data:`INSPECTOR_GROUP` (a class or an
    object with these). The core opens a message's ``unpacked`` stage once at intake,
    asks each inspector in name order whether it ``recognise`` s the first bytes, and
    hands the first that does the stream, positioned at its start, to ``inspect``, which
    reads it in chunks (never whole) and returns what it found."""

    name: str

    def recognise(self, head: bytes) -> bool: ...

    def inspect(self, stream: IO[bytes]) -> Envelope: ...

    # optional: a functional acknowledgment of an envelope it read (X12 997 / 999,
    # EDIFACT CONTRL), None when it makes none for it
    # def acknowledge(self, envelope: Envelope, request: AckRequest) -> Acknowledgment | None

