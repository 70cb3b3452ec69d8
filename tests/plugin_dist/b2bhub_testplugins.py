"""Plugin types of a package installed apart from b2bhub (see entry_points.txt beside
this file). They only rely on the class attributes the registry checks, so they load
without importing b2bhub."""

from __future__ import annotations

from typing import Any


class ExternalEcho:
    """A target that reports every delivery as delivered."""

    type_name = "external_echo"
    roles = frozenset({"target"})
    config_schema: list = []

    def __init__(self, instance_name: str, config: dict[str, Any]):
        self.instance_name = instance_name
        self.config = config

    def deliver(self, delivery: Any, payload: Any, context: Any) -> Any:
        from b2bhub.domain.outcome import Outcome

        return Outcome.delivered("echoed")
