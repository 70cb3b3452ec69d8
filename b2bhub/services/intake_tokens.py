"""Intake tokens of a plugin instance whose type keeps them (``Plugin.takes_tokens``):
the one lookup the API and the CLI share; the plugin stores and checks the tokens."""

from __future__ import annotations

from sqlalchemy.orm import Session

from b2bhub.domain.i18n import N_
from b2bhub.services import config as svc
from b2bhub.services.errors import Conflict


def token_keeper(session: Session, registry, instance: str) -> type:
    """The plugin type of ``instance``, if it keeps intake tokens (404 for no instance,
    409 for a type that takes none)."""
    found = svc.get_instance(session, instance)
    cls = registry.types().get(found.type)
    if cls is None or not getattr(cls, "takes_tokens", False):
        raise Conflict(N_("instance '%(name)s' (%(type)s) takes no intake tokens",
                          name=instance, type=found.type))
    return cls
