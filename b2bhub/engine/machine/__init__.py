"""The delivery state machine: the one package that writes ``deliveries.state``.

Every transition is a conditional UPDATE inside the caller's transaction that also
writes its history line(s), re-derives the message status and raises or resolves
alerts; wake-ups are queued with :func:`b2bhub.engine.wakeups.after_commit` and go out
only after the commit. The caller commits: one transition (or one batch of the same
transition) is one transaction.

One module per part of a delivery's life; which one writes which transition is the
table in :mod:`b2bhub.engine`:

- :mod:`.claiming`: claims (and :func:`.claiming.settle_and_claim`, a batch's
  settlements and the next claim in one transaction); :mod:`.lanes`, the claimer's turn
  at its target (no write of state);
- :mod:`.settlement`: an attempt's outcome, fenced by its claim, and an attempt a stop
  cut short;
- :mod:`.recovery`: deliveries whose lease expired or whose owner is gone, put back;
- :mod:`.receipts`: receipts that came, and those overdue;
- :mod:`.wake`: wake-ups of due deliveries, and the stall of those woken in vain;
- :mod:`.sequence`: an operator's moves, and sequences parked and released;
- :mod:`.common`: what several of them share.

A name with a leading underscore is private to this package: its modules use each
other's, nothing outside the package does (tests of a statement's text aside).

A failure that blocks its sequence parks the deliveries behind it in the same
transaction, whichever path failed it (an attempt, an overdue or negative receipt, the
API's receipt report). :mod:`b2bhub.engine.sequences` holds the queries; the writes are
:mod:`.sequence`'s.

Fencing: an outcome is written only while the delivery is still ``in_progress`` with the
attempt number and lease owner of the claim that produced it. A late outcome changes
nothing and leaves a ``stale_outcome_ignored`` line. An outcome that arrives after the
lease time but before anyone put the delivery back is accepted: the attempt really ended
that way, and refusing it would only send the message twice.
"""
