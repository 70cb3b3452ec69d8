"""Runs a target's due deliveries in a worker process: claim, attempt, settle.

A wake-up is a hint: the woken worker drains the target, claiming up to the plugin's
``claim_batch`` due deliveries at a time, until nothing is due or its time budget is
spent. The outcomes a batch ends with settle in the transaction that claims the next
batch (one commit for both); outcomes settled earlier (group commit window, stopping)
and those of the last batch have a transaction of their own. While attempts run, a
thread renews their leases so a long attempt is not put back while it still works.
Plain Python and SQLAlchemy; the Celery task only calls :meth:`TargetRunner.drain`.
"""

from __future__ import annotations

import functools
import io
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import IO, Any, NamedTuple

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from b2bhub.config.database import replan_if_due
from b2bhub.domain import business_rules
from b2bhub.domain.callbacks import CallbackTokens, receipt_ref
from b2bhub.domain.outcome import Outcome, OutcomeKind
from b2bhub.domain.retry import RetryPolicy, Strategy, merge
from b2bhub.engine import faults, openpgp_stages
from b2bhub.engine.machine import claiming, lanes, settlement
from b2bhub.engine.machine.claiming import Claim
from b2bhub.engine.message_reads import read_messages
from b2bhub.engine.settings import DeliverySettings, load_settings
from b2bhub.engine.stopping import AttemptCancelled, StopControl, stop_control
from b2bhub.engine.writelock import serialized_writes
from b2bhub.models import Delivery, PluginInstance, utcnow
from b2bhub.observability import tracing
from b2bhub.payloads.store import PayloadStore, VerifiedReader
from b2bhub.plugin import DeliveryInfo

log = logging.getLogger(__name__)


@dataclass
class DrainReport:
    claimed: int = 0
    settled: int = 0
    stale: int = 0
    more_due: bool = False


class ReadAhead:
    """The payload store as the attempts of one claimed batch read it, one after the
    other, made for a batch of more than one on a store where an open is a round trip
    (``store.reads_ahead``, S3: :func:`_delivery_infos`). The first open of a stage by
    a delivery fetches that stage's payloads for this delivery and those after it,
    together (``store.read_ahead``: in parallel, the small ones, within the store's
    memory for it); each payload so fetched is handed out once, through a
    :class:`~b2bhub.payloads.store.VerifiedReader` whose sha256 check is the one an open
    makes. Any other open (not fetched, fetched and handed out already, another store)
    is the store's ordinary open."""

    def __init__(self, store: PayloadStore, batch: list[dict[str, tuple[str, int]]]):
        self.store = store
        self._batch = batch  # each delivery's stages, in the order they are attempted
        self._stages_read: set[str] = set()
        self._held: dict[str, bytes] = {}

    def open(self, index: int, stage: str) -> VerifiedReader:
        """The payload of ``stage`` of the batch's delivery number ``index``."""
        digest = self._batch[index][stage][0]
        if stage not in self._stages_read:
            self._stages_read.add(stage)
            wanted: dict[str, int] = {}  # in the order of the attempts
            for stages in self._batch[index:]:
                if stage in stages:
                    wanted.setdefault(*stages[stage])
            if len(wanted) > 1:
                self._held.update(self.store.read_ahead(wanted))
        data = self._held.pop(digest, None)
        if data is None:
            return self.store.open(digest)
        return VerifiedReader(digest, io.BytesIO(data))


class StoredPayloads:
    """The PayloadReader a target gets: the message's recorded stages, read through
    the batch's :class:`ReadAhead` (as delivery ``index`` of it) when there is one."""

    def __init__(self, store: PayloadStore, stages: dict[str, tuple[str, int]],
                 ahead: ReadAhead | None = None, index: int = 0):
        self._store, self._stages = store, stages
        self._ahead, self._index = ahead, index

    def stages(self) -> tuple[str, ...]:
        return tuple(self._stages)

    def size(self, stage: str) -> int:
        return self._stages[stage][1]

    def digest(self, stage: str) -> str:
        return self._stages[stage][0]

    def open(self, stage: str) -> IO[bytes]:
        if stage not in self._stages:
            raise KeyError(f"the message has no '{stage}' payload stage")
        if self._ahead is not None:
            return self._ahead.open(self._index, stage)
        return self._store.open(self._stages[stage][0])


class AttemptContext:
    """The TargetContext of one attempt. With the hub's ``callbacks`` and the claim, it
    offers the attempt's receipt callback URL, the receipt reference a callback to it
    settles, and the delivery's idempotency key (:mod:`b2bhub.domain.callbacks`)."""

    def __init__(self, now: datetime, instance: PluginInstance,
                 open_session: Callable[[], Session] | None = None,
                 store: PayloadStore | None = None, claim: Claim | None = None,
                 callbacks: CallbackTokens | None = None):
        self.now = now
        self.instance_name = instance.name
        self.receipt_ref = None if claim is None else receipt_ref(claim.attempt)
        self._claim = claim if callbacks is not None else None
        self._callbacks = callbacks
        # for built-in protocol targets (AS2) that keep their own records and stages
        self.open_session, self.store = open_session, store
        self.wire = False
        self.outcome: Outcome | None = None

    # The callback URL and the idempotency key are an HMAC each (5.4 us of CPU for the
    # two), made when the plugin first asks: most targets (files, SFTP, AS2) never do;
    # made for every attempt, they were 5-6% of a worker's CPU draining a no-op target
    # (sampled).
    @functools.cached_property
    def callback_url(self) -> str | None:
        claim = self._claim
        return None if claim is None else self._callbacks.url(claim.delivery_id,
                                                              claim.attempt)

    @functools.cached_property
    def idempotency_key(self) -> str | None:
        claim = self._claim
        return None if claim is None else self._callbacks.idempotency_key(claim.delivery_id)

    def wire_started(self) -> None:
        self.wire = True

    def log(self, text: str) -> None:
        log.info("%s: %s", self.instance_name, text)


class PendingOutcomes:
    """Outcomes waiting for their settlement (group commit).

    A target that claims one delivery at a time settles each outcome at once. One that
    claims a batch (cheap local work) settles the outcomes gathered so far together when
    the batch is done, or when the oldest has waited ``window`` seconds: one commit for
    many, while an outcome never waits longer than the window. A worker killed in that
    window loses outcomes that were never recorded; their deliveries come back when the
    lease expires and are attempted again, which such targets take as written (the file
    writer finds its file already holding the payload).
    """

    def __init__(self, window: float,
                 before: Callable[[list[Outcome]], list[Outcome]] | None = None):
        self.window, self._before = window, before  # the plugin's before_settle
        self._items: list[tuple[Claim, Outcome]] = []
        self._since = 0.0

    def add(self, claim: Claim, outcome: Outcome) -> None:
        if not self._items:
            self._since = time.monotonic()
        self._items.append((claim, outcome))

    def due(self) -> bool:
        return bool(self._items) and time.monotonic() - self._since >= self.window

    def take(self) -> list[tuple[Claim, Outcome]]:
        """The outcomes to settle now, after the plugin made them durable."""
        items, self._items = self._items, []
        if items and self._before is not None:
            outcomes = self._before([outcome for _claim, outcome in items])
            items = list(zip([claim for claim, _o in items], outcomes, strict=True))
        return items


class InRequest(NamedTuple):
    """What :meth:`TargetRunner.attempt_now` did: the attempt's outcome, the state the
    delivery was left in, and how many attempts the target's retry policy allows."""

    outcome: Outcome
    state: str
    attempts_allowed: int


@dataclass
class _Batch:
    """A claimed batch in the hands of a runner: what its attempts need, the lease hold,
    and the outcomes not settled yet."""

    instance: Any  # the target's row as claimed
    plugin: Any
    policy: RetryPolicy
    rules: list | business_rules.RulesError  # the instance's business-error rules
    claims: list[Claim]
    held: int  # LeaseKeeper token
    pending: PendingOutcomes

    def take(self) -> list[tuple[Claim, Outcome]]:
        return self.pending.take()


class TargetRunner:
    #: longest an outcome of a batch waits for its settlement, in seconds
    settle_window = 0.2

    def __init__(self, session_factory: Callable[[], Session], registry, store: PayloadStore,
                 owner: str, stop: StopControl = stop_control,
                 clock: Callable[[], datetime] = utcnow,
                 callbacks: CallbackTokens | None = None):
        self.session_factory, self.registry, self.store = session_factory, registry, store
        self.owner, self.stop, self.clock = owner, stop, clock
        self.callbacks = callbacks  # the hub's callback URLs and idempotency keys
        self._plugins: dict[str, tuple[datetime, object]] = {}
        self._parsed_rules: dict[str, tuple[datetime, Any]] = {}
        self.leases = LeaseKeeper(clock)

    def drain(self, target: str, budget: float | None = None) -> DrainReport:
        """Claim and run the target's due deliveries until none is due or time is up.

        The outcomes a batch ends with are settled in the transaction that claims the
        next batch (:func:`claiming.settle_and_claim`); the last batch's alone."""
        report = DrainReport()
        session = self.session_factory()
        held = _hold_connection(session)
        batch: _Batch | None = None
        try:
            settings = load_settings(session)
            deadline = time.monotonic() + (budget or settings.drain_seconds)
            while True:
                go_on = not self.stop.requested.is_set()
                if go_on and time.monotonic() >= deadline:
                    report.more_due, go_on = True, False
                if not go_on:
                    if batch is not None:
                        self._settle(session, batch.take(), batch.policy, report)
                    break
                if held is not None:
                    replan_if_due(held)  # as a checkout would (b2bhub.config.database)
                batch = self._next_batch(session, target, settings, report, batch)
                if batch is None:
                    break
                self._run_claims(session, batch, report)
        finally:
            if batch is not None:
                self.leases.drop(batch.held)
            session.close()
            if held is not None:
                held.close()
        return report

    def attempt_now(self, delivery_id: int, target: str, keep_retrying: bool = False,
                    settings: DeliverySettings | None = None) -> InRequest | None:
        """Claim this one delivery and attempt it at once on the calling thread: the
        claim, attempt (business rules included) and settlement of :meth:`drain`, for a
        given delivery whatever its ``due_at`` (the HTTP receiver's synchronous mode).
        ``keep_retrying``: a failure the policy would retry stays Retrying even when it
        used up the maximum attempts, so that the ordinary asynchronous path still gets
        an attempt of its own. ``settings``: the delivery settings, when the caller read
        them already. Returns the outcome, the state the delivery was left in and the
        attempts the target's policy allows; None when it could not be claimed (target
        offline, stopped, disabled or blocked, at its concurrency limit, or the
        delivery taken or settled already).

        Two transactions on one connection: the claim (with its status and lines) and
        the read of the message, then the settlement (with its status and lines). The
        state left is the one the settlement wrote, not read again."""
        session = self.session_factory()
        held_connection = _hold_connection(session)
        try:
            settings = settings or load_settings(session)
            with serialized_writes(session):
                turn = lanes.lock_target(session, target, self.owner)
                instance = turn.instance if turn is not None else None
                plugin = self._plugin(instance) if instance is not None else None
                found = None if plugin is None else claiming.claim_delivery(
                    session, delivery_id, target, self.owner, self.clock(),
                    settings.lease_seconds, turn)
                # what the attempt reads of the message, in the claim's transaction: a
                # read that fails takes the claim back with it (nothing to give back)
                infos = None if found is None else _delivery_infos(session, [found],
                                                                   self.store)
                session.commit()
            if found is None:
                return None
            policy = merge(instance.retry_policy,
                           getattr(plugin, "default_retry_policy", None) or RetryPolicy())
            allowed = max(1, policy.attempts_allowed)
            if keep_retrying and policy.strategy is not Strategy.SCHEDULE:
                policy = replace(policy, max_attempts=max(policy.max_attempts,
                                                          found.failures + 2))
            held = self.leases.hold(session, [found], settings.lease_seconds)
            try:
                context = AttemptContext(self.clock(), instance, self.session_factory,
                                         self.store, found, self.callbacks)
                self._attempt(plugin, infos[found.delivery_id], context, self._rules(instance))
                pending = PendingOutcomes(0, getattr(plugin, "before_settle", None))
                pending.add(found, context.outcome)
                outcomes = pending.take()
                now = self.clock()
                with serialized_writes(session):
                    [written] = settlement.settle_many(session, outcomes, policy, now)
                    session.commit()
            finally:
                self.leases.drop(held)
            outcome = outcomes[0][1]
            if written:
                state = settlement.settled_state(found, outcome, policy, now)
            else:  # someone moved it on meanwhile: what it is now
                state = session.scalar(select(Delivery.state).where(Delivery.id == delivery_id))
                session.commit()
            return InRequest(outcome, state, allowed)
        finally:
            session.close()
            if held_connection is not None:
                held_connection.close()

    def _next_batch(self, session: Session, target: str, settings: DeliverySettings,
                    report: DrainReport, last: _Batch | None) -> _Batch | None:
        """Settle what the last batch left and claim the next, in one transaction."""
        chosen = {}

        def batch_size(instance) -> int:
            chosen["plugin"] = plugin = self._plugin(instance)
            if plugin is None:
                return 0
            return max(1, min(getattr(plugin, "claim_batch", 1), settings.claim_batch_max))

        outcomes = last.take() if last is not None else []
        with tracing.span("claim", **{"b2bhub.target": target,
                                      "b2bhub.settled": len(outcomes)}) as span:
            # planned before this worker's turn to write (settlement.Settling)
            settling = settlement.plan(outcomes, last.policy if last is not None else None,
                                       self.clock(),
                                       session.get_bind().dialect.name == "postgresql")
            with self.stop.settling(), serialized_writes(session):
                written, claims, instance = claiming.settle_and_claim(
                    session, settling, target, self.owner, settings.lease_seconds,
                    batch_size)
                if outcomes:
                    faults.pause("settling")
                session.commit()
                if claims is None:  # no lane was free: settled alone, now claim
                    turn = lanes.lock_target(session, target, self.owner,
                                             outcomes[0][0].lane)
                    instance = turn.instance if turn is not None else None
                    limit = batch_size(instance) if instance is not None else 0
                    claims = claiming.claim(session, target, self.owner, self.clock(), limit,
                                            settings.lease_seconds, turn) if limit else []
                    session.commit()
            if span is not None:
                span.set_attribute("b2bhub.claimed", len(claims))
        if last is not None:
            self.leases.drop(last.held)
        report.settled += sum(written)
        report.stale += len(written) - sum(written)
        if instance is None:
            log.warning("%s: woken, but no target instance has that name; ignored", target)
        if not claims:
            return None
        report.claimed += len(claims)
        plugin = chosen["plugin"]
        policy = merge(instance.retry_policy,
                       getattr(plugin, "default_retry_policy", None) or RetryPolicy())
        return _Batch(instance, plugin, policy, self._rules(instance), claims,
                      self.leases.hold(session, claims, settings.lease_seconds),
                      PendingOutcomes(self.settle_window,
                                      getattr(plugin, "before_settle", None)))

    def _run_claims(self, session: Session, batch: _Batch, report: DrainReport) -> None:
        """Attempt each claim in turn; settle the outcomes by group commit. The outcomes
        still pending at the end stay on the batch, for the next claim's transaction."""
        try:
            infos = _delivery_infos(session, batch.claims, self.store)
        except Exception as exc:
            self._give_back(session, batch.claims, exc)
            raise
        claims, policy, pending = batch.claims, batch.policy, batch.pending
        faults.pause("claimed")
        for index, claim in enumerate(claims):
            if self.stop.requested.is_set():
                self._settle(session, pending.take(), policy, report)
                self._release(session, claims[index:], "worker stopping before the attempt")
                return
            context = AttemptContext(self.clock(), batch.instance, self.session_factory,
                                     self.store, claim, self.callbacks)
            try:
                with self.stop.attempt():
                    self._attempt(batch.plugin, infos[claim.delivery_id], context,
                                  batch.rules)
            except AttemptCancelled:
                if context.outcome is None:  # cut short: put it back
                    self._settle(session, pending.take(), policy, report)
                    self._interrupt(session, claim, context.wire, policy)
                    self._release(session, claims[index + 1:],
                                  "worker stopping before the attempt")
                    return
            # an attempt that returned has an outcome, and it settles in full
            faults.pause("attempted")
            pending.add(claim, context.outcome)
            if _blocks_instance(context.outcome):
                # the rest of the batch waits with the instance's other deliveries
                self._settle(session, pending.take(), policy, report)
                self._release(session, claims[index + 1:],
                              "the target is blocked by a business rule")
                return
            if pending.due():
                self._settle(session, pending.take(), policy, report)

    def _attempt(self, plugin, info: tuple[DeliveryInfo, StoredPayloads],
                 context: AttemptContext, rules: list | business_rules.RulesError = ()
                 ) -> None:
        """Run the plugin; its outcome is kept on the context the moment it returns,
        after the instance's business-error rules have had their say on the answer the
        target attached (SPEC 10: before its status decides anything)."""
        delivery, payloads = info
        # a child of the span that stored the message (its trace), whoever woke us
        with tracing.span("attempt", parent=delivery.trace_parent, **{
                "b2bhub.target": delivery.target, "b2bhub.message_id": delivery.message_id,
                "b2bhub.delivery_id": delivery.delivery_id,
                "b2bhub.attempt": delivery.attempt,
                "b2bhub.correlation_id": delivery.correlation_id}) as span:
            try:
                context.outcome = openpgp_stages.deliver(plugin, delivery, payloads, context)
            except AttemptCancelled:
                raise
            except Exception as exc:  # a plugin bug is a failed attempt, not a dead worker
                log.exception("%s: attempt raised", context.instance_name)
                context.outcome = Outcome.error(type(exc).__name__,
                                                f"{type(exc).__name__}: {exc}")
            if not isinstance(context.outcome, Outcome):
                context.outcome = Outcome.failed(
                    f"plugin returned {context.outcome!r} instead of an Outcome")
            elif context.outcome.answer is not None and rules:
                context.outcome = _checked(rules, context.outcome)
            if span is not None:
                span.set_attribute("b2bhub.outcome", context.outcome.kind.value)

    def _settle(self, session: Session, outcomes: list[tuple[Claim, Outcome]],
                policy: RetryPolicy, report: DrainReport) -> None:
        """One transaction for the outcomes gathered, each fenced by its own claim."""
        if not outcomes:
            return
        with self.stop.settling(), serialized_writes(session):
            written = settlement.settle_many(session, outcomes, policy, self.clock())
            faults.pause("settling")
            session.commit()
        report.settled += sum(written)
        report.stale += len(written) - sum(written)

    def _interrupt(self, session: Session, claim: Claim, wire: bool,
                   policy: RetryPolicy) -> None:
        session.rollback()
        with self.stop.settling():
            settlement.interrupt(session, claim, self.clock(), wire, "worker stopping", policy)
            session.commit()

    def _give_back(self, session: Session, claims: list[Claim], exc: Exception) -> None:
        """A batch claimed but not attempted, whose messages could not be read (the
        database restarted right after the claim, say): put it back to the queue now,
        fenced like any interruption, rather than leave it leased to this live process
        until the lease runs out. If the database is still away the lease remains the
        bound."""
        session.rollback()
        try:
            self._release(session, claims, f"could not read the batch: {type(exc).__name__}")
        except Exception:
            session.rollback()
            log.warning("could not give back %d claimed deliveries; their lease will",
                        len(claims), exc_info=True)

    def _release(self, session: Session, claims: list[Claim], reason: str) -> None:
        with self.stop.settling():
            for claim in claims:
                settlement.interrupt(session, claim, self.clock(), False, reason)
            session.commit()

    def running(self) -> list[str]:
        """The targets this runner has a plugin for (the ones this process runs)."""
        return list(self._plugins)

    def forget(self, names: set[str]) -> None:
        """Drop the plugins of stopped instances; a start builds them anew."""
        for name in names:
            self._plugins.pop(name, None)
            self._parsed_rules.pop(name, None)

    def _rules(self, instance) -> list | business_rules.RulesError:
        """The instance's parsed business rules, parsed again when it changed. Stored
        rules were validated on save; ones that no longer parse are kept as the error,
        which fails each attempt that has an answer to check (rather than let an answer
        the rules were meant to catch pass as delivered)."""
        cached = self._parsed_rules.get(instance.name)
        if cached and cached[0] == instance.updated_at:
            return cached[1]
        try:
            rules: list | business_rules.RulesError = business_rules.parse_rules(
                instance.business_rules)
        except business_rules.RulesError as exc:
            log.error("%s: stored business rules are invalid: %s", instance.name, exc)
            rules = exc
        self._parsed_rules[instance.name] = (instance.updated_at, rules)
        return rules

    def _plugin(self, instance: PluginInstance):
        """The plugin object of an instance, rebuilt when its configuration changed."""
        if not instance.enabled or instance.type not in self.registry:
            return None
        cached = self._plugins.get(instance.name)
        if cached and cached[0] == instance.updated_at:
            return cached[1]
        plugin = self.registry.get(instance.type)(instance.name, dict(instance.config or {}))
        self._plugins[instance.name] = (instance.updated_at, plugin)
        return plugin


def _hold_connection(session: Session) -> Connection | None:
    """Bind ``session`` to one connection of its engine until the caller closes it: a
    drain commits twice per batch, and handing the connection back to the pool and
    taking it again around each transaction (with the pool's reset) cost more than
    its SQLite statements' own bookkeeping. The session still begins and commits each
    transaction on it. Returns the connection (None: the session is bound otherwise)."""
    bind = session.get_bind()
    if not isinstance(bind, Engine):
        return None
    connection = bind.connect()
    session.bind = connection
    return connection


def _checked(rules: list | business_rules.RulesError, outcome: Outcome) -> Outcome:
    if isinstance(rules, business_rules.RulesError):
        return Outcome.failed(f"the instance's business rules are invalid: {rules}")
    return business_rules.apply(rules, outcome)


def _blocks_instance(outcome: Outcome) -> bool:
    return outcome.kind is OutcomeKind.BUSINESS_ERROR and outcome.block == "instance"


def _delivery_infos(session: Session, claims: list[Claim], store: PayloadStore
                    ) -> dict[int, tuple[DeliveryInfo, StoredPayloads]]:
    """What the batch's attempts need: as the claim returned it (PostgreSQL), else read
    in one query."""
    messages, stages = {}, {}
    if all(c.message is not None for c in claims):
        for c in claims:
            *message, found = c.message
            messages[message[0]] = message
            stages[message[0]] = {stage: (digest, size) for stage, digest, size in found or ()}
    else:
        messages, stages = read_messages(session, [c.message_id for c in claims])
        session.commit()
    # on a store where an open is a round trip, the attempts of a batch of more than one
    # read their payloads through one ReadAhead; elsewhere each opens its own
    ahead = (ReadAhead(store, [stages[c.message_id] for c in claims])
             if store.reads_ahead and len(claims) > 1 else None)
    out = {}
    for index, c in enumerate(claims):
        (message_id, source, from_party, to_party, direction, original_filename,
         external_id, correlation_id, sequence_key, created_at,
         trace_parent) = messages[c.message_id]
        out[c.delivery_id] = (DeliveryInfo(
            delivery_id=c.delivery_id, message_id=message_id, target=c.target,
            attempt=c.attempt, source=source, from_party=from_party, to_party=to_party,
            direction=direction, original_filename=original_filename,
            external_id=external_id, correlation_id=correlation_id,
            sequence_key=sequence_key, created_at=created_at,
            payload_stages=tuple(stages[message_id]), trace_parent=trace_parent),
            StoredPayloads(store, stages[message_id], ahead, index))
    return out


class LeaseKeeper:
    """Renews the leases of the claims a worker holds, every third of the lease, on one
    thread per runner started at first use (a thread per claimed batch cost more than a
    no-op attempt). Each renewal is fenced like a settlement: attempt, owner, state.

    The thread opens its sessions on the engine of the session that claimed (it has no
    application context of its own). It is woken only when a new batch must be renewed
    before the time it already sleeps until: waking a thread hands it the GIL, which
    cost the claiming thread milliseconds per batch.

    The thread ends when its keeper is gone (the runner dropped: an app made anew, a
    test's): it holds the keeper only between its waits, and the keeper's finalizer
    wakes it. It also ends after ``idle_seconds`` holding nothing once it wakes (the
    next :meth:`hold` starts another); a worker busy with deliveries keeps its one."""

    #: how long the thread waits with nothing held before it ends
    idle_seconds = 5.0

    def __init__(self, clock: Callable[[], datetime]):
        self.clock = clock
        self._held: dict[int, _Held] = {}
        self._next_token = 0
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wakes_at = math.inf  # when the thread wakes next on its own
        weakref.finalize(self, _wake_all, self._changed).atexit = False

    def hold(self, session: Session, claims: list[Claim], lease_seconds: int) -> int:
        """Keep these claims' leases alive until :meth:`drop` of the token returned."""
        with self._changed:
            self._next_token += 1
            renew_at = time.monotonic() + lease_seconds / 3
            self._held[self._next_token] = _Held(session.get_bind().engine, claims,
                                                 lease_seconds,
                                                 renew_at)
            if self._thread is None or not self._thread.is_alive():
                self._wakes_at = renew_at
                self._thread = threading.Thread(
                    target=_keep_renewing, args=(weakref.ref(self), self._changed),
                    daemon=True, name="lease-keeper")
                self._thread.start()
            elif renew_at < self._wakes_at:
                self._wakes_at = renew_at
                self._changed.notify()
            return self._next_token

    def drop(self, token: int) -> None:
        with self._changed:
            self._held.pop(token, None)

    def _next(self, idle_since: float | None):
        """Under the lock, in the thread: ("renew", due), ("wait", seconds, idle since)
        or ("end",) (idle past ``idle_seconds``; the next hold() starts a thread)."""
        now = time.monotonic()
        if not self._held:
            if idle_since is not None and now - idle_since >= self.idle_seconds:
                self._thread = None
                return ("end",)
            self._wakes_at = math.inf  # a hold() wakes it
            since = now if idle_since is None else idle_since
            return ("wait", self.idle_seconds - (now - since), since)
        due = [h for h in self._held.values() if h.renew_at <= now]
        if not due:
            self._wakes_at = min(h.renew_at for h in self._held.values())
            return ("wait", max(0.0, self._wakes_at - now), None)
        for held in due:
            held.renew_at = now + held.lease / 3
        return ("renew", due)

    def renew(self, bind, claims: list[Claim], lease_seconds: int) -> int:
        """Extend the leases of the claims still held as claimed; how many were."""
        until = self.clock() + timedelta(seconds=lease_seconds)
        with Session(bind) as session, session.begin():
            return session.connection().execute(_RENEW, [
                {"_id": c.delivery_id, "_attempt": c.attempt, "_owner": c.owner,
                 "_until": until} for c in claims]).rowcount


def _keep_renewing(keeper_ref: weakref.ref, changed: threading.Condition) -> None:
    """The lease keeper's thread. It takes the keeper from its weak reference for each
    step and lets go of it before it waits (``Condition.wait`` releases the lock, so a
    hold() that notifies is never missed), so a keeper nothing else holds is collected
    and its finalizer (:func:`_wake_all`) wakes the thread to end."""
    idle_since = None
    while True:
        with changed:
            keeper = keeper_ref()
            if keeper is None:
                return
            step = keeper._next(idle_since)
            if step[0] == "end":
                return
            if step[0] == "wait":
                idle_since = step[2]
                del keeper  # the last reference, maybe: then its finalizer ran just now
                if keeper_ref() is None:
                    return
                changed.wait(step[1])
                continue
            idle_since = None
        try:
            for held in step[1]:
                try:
                    keeper.renew(held.bind, held.claims, held.lease)
                except Exception:
                    log.warning("could not renew leases", exc_info=True)
        finally:
            del keeper


def _wake_all(changed: threading.Condition) -> None:
    with changed:
        changed.notify_all()


@dataclass
class _Held:
    bind: object
    claims: list[Claim]
    lease: int
    renew_at: float


_d = Delivery.__table__
_RENEW = (update(_d).where(_d.c.id == bindparam("_id"), _d.c.attempt == bindparam("_attempt"),
                           _d.c.lease_owner == bindparam("_owner"),
                           _d.c.state == "in_progress")
          .values(lease_until=bindparam("_until")))
