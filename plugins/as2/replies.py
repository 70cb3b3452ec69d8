"""The receiving endpoint's replies: shared by the message path (:mod:`.receiver`) and
the MDN path (:mod:`.mdn_in`), which therefore need not import each other."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    message_id: int | None = None
    mdn_owed: bool = False  # an asynchronous MDN row is due: wake the sender
    cem_owed: bool = False  # a CEM document was taken: wake the CEM job (plugins.as2.cem)


def text_reply(status: int, text: str, **kw) -> Reply:
    """A plain-text reply of one line."""
    return Reply(status, {"Content-Type": "text/plain; charset=utf-8"},
                 (text + "\n").encode(), **kw)


def party_name(as2_id: str | None) -> str:
    """A Refused message from an unknown AS2 ID records the ID itself (shortened)."""
    return (as2_id or "?")[:64]
