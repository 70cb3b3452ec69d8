"""The operator's host-key actions on an SFTP instance (the writer's and the poller's):
``fetch_host_key`` shows the key the configured server offers, pinned nowhere;
``pin_host_key`` pins a confirmed one into the instance's ``host_key`` (docs/sftp.md,
"Pinning the host key"). The same fetch-and-confirm as on an ``sftp`` profile."""

from __future__ import annotations

from typing import Any

from b2bhub.plugin import N_, InstanceActionResult, ServiceError
from plugins.sftp.profiles import PROFILE_KIND, fetch, key_to_pin


class HostKeyActions:
    """Mixed into a plugin type whose instances hold the connection fields."""

    instance_actions = ("fetch_host_key", "pin_host_key")

    @classmethod
    def action_refused(cls, config: dict[str, Any]) -> None:
        """Raise :class:`ServiceError` when this instance pins no key of its own."""

    @classmethod
    def instance_action_schemas(cls) -> dict[str, dict]:
        return {action: schema for action, schema in PROFILE_KIND.action_schemas().items()
                if action in cls.instance_actions}

    @classmethod
    def run_instance_action(cls, config: dict[str, Any], action: str, body: dict
                            ) -> InstanceActionResult:
        """``fetch_host_key``: the key the configured server offers, with its
        fingerprint, pinned nowhere; ``pin_host_key``: as the ``sftp`` profile's
        (docs/sftp.md), into this instance's ``host_key``."""
        cls.action_refused(config)
        unknown = set(body) - set(cls.instance_action_schemas()[action]["properties"])
        if unknown:
            raise ServiceError(N_("unknown fields: %(fields)s",
                                  fields=", ".join(sorted(unknown))),
                               {f: "unknown" for f in unknown})
        where = f"{config.get('host')}:{config.get('port') or 22}"
        if action == "fetch_host_key":
            offered = fetch(config)
            return InstanceActionResult(
                answer={"host": config.get("host"), "port": config.get("port") or 22,
                        "key": offered.line, "key_type": offered.type,
                        "fingerprint": offered.fingerprint, "pinned": False},
                text=f"fetched the host key of {where}: {offered.type} "
                     f"{offered.fingerprint} (not pinned)",
                confirm={"action": "pin_host_key",
                         "body": {"fingerprint": offered.fingerprint},
                         "label": f"Confirm and pin {offered.fingerprint}"})
        key, how = key_to_pin(config, body)
        return InstanceActionResult(
            answer={"host_key": key.line, "host_key_fingerprint": key.fingerprint},
            changes={"host_key": key.line},
            text=f"pinned the {how} host key {key.type} {key.fingerprint} of {where}")
