"""The AS2 plugin types (RFC 4130), built on the plugin interface's protocol hooks alone.

* ``as2_receiver`` (source): ``POST /as2/<instance>`` (the core's endpoint hook); the work
  is in :mod:`.receiver`, MDNs for our messages in :mod:`.mdn_in`.
* ``as2_sender`` (target): sends per the partner's AS2 profile (:mod:`.sender`).
* Both add the ``as2`` party profile kind (:mod:`.profiles`, UI in :mod:`.ui`) and the
  periodic jobs ``as2_send_mdns`` (owed asynchronous MDNs, every 5 s and after a receipt)
  and ``as2_cem`` (certificate exchange, :mod:`.cem`: responses owed, requests overdue);
  certificates ending soon are the core's hourly ``b2bhub.check_certificates``. The
  tables ``as2_inbound`` and ``as2_outbound`` (:mod:`.models`) came with the core's
  migration 0006; later changes to them are migrations of this package's own
  (``migrations``, none yet).

This module stays light: the protocol's modules load on first use.
"""

from __future__ import annotations

from b2bhub.plugin import (
    DeliveryInfo,
    EndpointReply,
    EndpointRequest,
    Field,
    Outcome,
    PayloadReader,
    PeriodicJob,
    Plugin,
    RetryPolicy,
    Strategy,
    TargetContext,
)
from plugins.as2.profile_kind import AS2_PROFILES

MDN_JOB = "as2_send_mdns"


def _send_mdns(session, store, now) -> int:
    """Send the asynchronous MDNs that are due."""
    from plugins.as2.mdn_out import send_due_mdns
    return send_due_mdns(session, store, now)


def _cem_due(session, store, now) -> int:
    """CEM responses owed, CEM requests overdue (:mod:`.cem`)."""
    from plugins.as2.cem import run_due
    return run_due(session, store, now)


CEM_JOB = "as2_cem"
JOBS = (PeriodicJob(MDN_JOB, _send_mdns, every=5.0, expires=5.0),
        PeriodicJob(CEM_JOB, _cem_due, every=60.0, expires=60.0))


class As2Receiver(Plugin):
    type_name = "as2_receiver"
    roles = frozenset({"source"})
    description = ("Receives AS2 messages from partners (and their MDNs for ours) at "
                   "POST /as2/<instance>.")
    config_schema = [
        Field("max_size", "integer", label="Largest message (bytes)",
              default=100 * 1024 * 1024, min=1024,
              help="largest body taken, in bytes; larger ones are refused"),
        Field("stream_threshold", "integer", label="Stream above (bytes)",
              default=8 * 1024 * 1024, min=0,
              help="bodies larger than this (bytes) are parsed from a temp file, "
                   "streamed, not in memory (0: every one)"),
    ]
    endpoint_prefix = "as2"
    #: a preread body's receiver is looked up with the profiles version, the intake's
    #: settings and a duplicate Message-ID, in one statement (:func:`.receiver._lookups`)
    endpoint_lookup = "handler"
    endpoint_label = "AS2 receiver"
    profile_kinds = (AS2_PROFILES,)
    periodic_jobs = JOBS

    @classmethod
    def payload_references(cls) -> list:
        """The MDN stored for a received message keeps its payload file alive."""
        from plugins.as2.models import As2Inbound
        return [(As2Inbound.message_id, As2Inbound.mdn_digest)]

    @classmethod
    def handle_request(cls, request: EndpointRequest) -> EndpointReply:
        from plugins.as2 import receiver
        reply = receiver.receive(request.session, request.store, request.instance,
                                 request.config, request.headers, request.body,
                                 request.content_length, request.now,
                                 parties_from=request.parties_from,
                                 checks=request.checks)
        wake = [job for job, owed in ((MDN_JOB, reply.mdn_owed), (CEM_JOB, reply.cem_owed))
                if owed]
        return EndpointReply(reply.status, reply.headers, reply.body,
                             after=(lambda: _wake(wake)) if wake else None)


def _wake(jobs: list[str]) -> None:
    """Ask a worker to run the jobs now (an owed MDN, a CEM response); beat asks every
    5 s and 60 s anyway."""
    from b2bhub.plugin import run_job_soon
    for job in jobs:
        run_job_soon(job)


class As2Sender(Plugin):
    type_name = "as2_sender"
    roles = frozenset({"target"})
    description = ("Sends messages to partners over AS2 (RFC 4130): signed, encrypted and "
                   "compressed per the partner's AS2 profile, with sync or async MDNs.")
    config_schema = [
        Field("payload_stage", "choice", label="Payload stage", default="unpacked",
              choices=("raw", "unpacked", "sent"),
              help="the stage of the message to send"),
        Field("timeout", "integer", label="Timeout (seconds)", default=120, min=1, max=3600,
              help="seconds to wait for the partner's answer (and a sync MDN)"),
        Field("stream_threshold", "integer", label="Stream above (bytes)",
              default=8 * 1024 * 1024, min=0,
              help="messages larger than this (bytes) are built on temp files and "
                   "sent from them, streamed, not in memory (0: every one)"),
    ]
    default_retry_policy = RetryPolicy(strategy=Strategy.EXPONENTIAL, base_delay=60,
                                       max_delay=3600, max_attempts=10)
    profile_kinds = (AS2_PROFILES,)
    periodic_jobs = JOBS

    def deliver(self, delivery: DeliveryInfo, payload: PayloadReader,
                context: TargetContext) -> Outcome:
        from plugins.as2 import sender
        return sender.send(delivery, payload, context, self.config)
