"""The ``as2_sender`` target: sends a message to the partner per its AS2 profile.

The work is in :mod:`plugins.as2.sender`; this class declares the type.
"""

from __future__ import annotations

from b2bhub.config_schema import Field
from b2bhub.domain.retry import RetryPolicy, Strategy
from b2bhub.plugin_api import DeliveryInfo, Outcome, PayloadReader, Plugin, TargetContext


class As2Sender(Plugin):
    type_name = "as2_sender"
    roles = frozenset({"target"})
    description = ("Sends messages to partners over AS2 (RFC 4130): signed, encrypted and "
                   "compressed per the partner's AS2 profile, with sync or async MDNs.")
    config_schema = [
        Field("payload_stage", "choice", default="unpacked",
              choices=("raw", "unpacked", "sent"),
              help="the stage of the message to send"),
        Field("timeout", "integer", default=120, min=1, max=3600,
              help="seconds to wait for the partner's answer (and a sync MDN)"),
    ]
    default_retry_policy = RetryPolicy(strategy=Strategy.EXPONENTIAL, base_delay=60,
                                       max_delay=3600, max_attempts=10)

    def deliver(self, delivery: DeliveryInfo, payload: PayloadReader,
                context: TargetContext) -> Outcome:
        from plugins.as2 import sender
        return sender.send(delivery, payload, context, self.config)
