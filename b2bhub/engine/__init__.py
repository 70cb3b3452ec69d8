"""The delivery engine: intake, dispatch, the workers' attempts, the sweep, operators.

Only the state machine, the package :mod:`b2bhub.engine.machine`, writes
``deliveries.state`` (``tests/test_single_writer.py`` holds every other module to it).
Each transition is written by one module of it:

=================  ==========================  ================================  ==========
event              from                        to                                module
=================  ==========================  ================================  ==========
claim              queued, retrying, stalled   in_progress (attempt += 1,        claiming
                                               lease)
delivered          in_progress                 delivered (fenced)                settlement
retry / error      in_progress                 retrying (due_at) or failed       settlement
                                               (fenced)
await receipt      in_progress                 awaiting_receipt (fenced)         settlement
failed / business  in_progress                 failed (technical / business; a   settlement
                                               rule may block the instance)
interrupted        in_progress                 queued, or retrying after         settlement
                                               wire_started
lease expired      in_progress                 queued (sweep)                    recovery
owner gone         in_progress                 queued (sweep, owner known dead)  recovery
receipt            awaiting_receipt            delivered, or failed (MDN or API) receipts
receipt overdue    awaiting_receipt            failed (sweep)                    receipts
stalled            queued, retrying            stalled (sweep, after N           wake
                                               wake-ups)
operator action    as the action allows        queued, cancelled, skipped        sequence
                                               (:func:`move`)
parked             queued, retrying, stalled   deferred (behind a failed         sequence
                                               delivery)
released           deferred                    queued (its blocker               sequence
                                               skipped/resubmitted)
=================  ==========================  ================================  ==========

The module column names modules of :mod:`b2bhub.engine.machine`: ``claiming`` (claims;
its lanes are :mod:`~b2bhub.engine.machine.lanes`'), ``settlement`` (outcomes, fenced),
``recovery`` (put back from a dead or hung owner), ``receipts``, ``wake`` (wake-ups,
which change no state, and stalls) and ``sequence`` (operator moves, parking and
release). The other modules of the engine create deliveries, read their state, ask the
machine for a transition or write other columns.
"""
