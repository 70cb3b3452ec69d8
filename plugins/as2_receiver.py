"""The ``as2_receiver`` source: ``POST /as2/<instance>`` in the web process.

The endpoint is served by :mod:`plugins.as2.views`, the work is in
:mod:`plugins.as2.receiver`; this class declares the type and its configuration.
"""

from __future__ import annotations

from b2bhub.config_schema import Field
from b2bhub.plugin_api import Plugin


class As2Receiver(Plugin):
    type_name = "as2_receiver"
    roles = frozenset({"source"})
    description = ("Receives AS2 messages from partners (and their MDNs for ours) at "
                   "POST /as2/<instance>.")
    config_schema = [
        Field("max_size", "integer", default=100 * 1024 * 1024, min=1024,
              help="largest body taken, in bytes; larger ones are refused"),
    ]
