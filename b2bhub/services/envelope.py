"""A message's envelope as its page shows it (docs/edi.md, "The envelope on the message
page"): which functional group each transaction set belongs to is read again from the
stored ``unpacked`` stage by the inspector, for a payload of at most :data:`MAX_READ`
bytes; a larger one (or one that cannot be read any more) is shown by the flat summary
its attributes keep. Either way at most :data:`MAX_ROWS` groups and sets are shown."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session

from b2bhub.engine.inspection import inspect_stream
from b2bhub.models import Message
from b2bhub.services.identities import party_of
from b2bhub.services.messages import message_envelope

log = logging.getLogger(__name__)
#: the largest ``unpacked`` stage read again when the page is shown (the inspector reads
#: 200 MB/s and more: a few tens of milliseconds)
MAX_READ = 16 * 1024 * 1024
#: the most groups, and the most sets, listed (the rest are counted: "and K more")
MAX_ROWS = 100
#: envelopes read, by payload digest (the same bytes have the same envelope): a page
#: shown again, or refreshed live while its deliveries move, does not read it again
_CACHE_SIZE = 64
_cache: OrderedDict[str, Read] = OrderedDict()
_lock = threading.Lock()


@dataclass
class Listed:
    """Values of one kind, the first :data:`MAX_ROWS` kept, ``more`` not shown."""

    items: list
    more: int = 0


@dataclass
class Read:
    """What the inspector read of a payload, cut to what the page lists."""

    standard: str
    version: str
    sender: str
    receiver: str
    control: str
    date: str
    separators: dict[str, str]
    groups: Listed
    sets: Listed


@dataclass
class Identity:
    """An envelope's sender or receiver and the party whose EDI identity it is."""

    text: str
    party: str | None = None


@dataclass
class EnvelopeView:
    """What the message page shows of an envelope. ``detailed``: groups and sets as
    the inspector read them again; otherwise ``flat`` holds the attributes' values by
    name and ``why_flat`` says why."""

    standard: str
    version: str = ""
    sender: Identity | None = None
    receiver: Identity | None = None
    control: str = ""
    date: str = ""
    separators: dict[str, str] = field(default_factory=dict)
    group_count: str = ""
    set_count: str = ""
    errors: list[str] = field(default_factory=list)
    detailed: bool = False
    groups: Listed = field(default_factory=lambda: Listed([]))
    sets: Listed = field(default_factory=lambda: Listed([]))
    flat: dict[str, Listed] = field(default_factory=dict)
    why_flat: str = ""

    @property
    def set_word(self) -> str:
        return "Messages" if self.standard == "EDIFACT" else "Transaction sets"

    @property
    def readable_date(self) -> str:
        """The interchange date as ``2026-11-29 12:00`` (a two-digit year is 1970-2069,
        as ``strptime`` reads it); as written when it is not a date."""
        for form in ("%y%m%d %H%M", "%Y%m%d %H%M"):
            try:
                return datetime.strptime(self.date, form).strftime("%Y-%m-%d %H:%M")
            except ValueError:
                continue
        return self.date


def envelope_view(session: Session, store, message: Message) -> EnvelopeView | None:
    """The envelope of ``message`` as its page shows it; None when it has none."""
    pairs = [(row["name"], row["value"]) for row in message_envelope(session, message.id)]
    if not pairs:
        return None
    values: dict[str, list[str]] = {}
    for name, value in pairs:
        values.setdefault(name, []).append(value)

    def one(name: str) -> str:
        return values.get(name, [""])[0]

    view = EnvelopeView(standard=one("standard"), version=one("version"),
                        control=one("interchange_control"), date=one("interchange_date"),
                        group_count=one("groups"), set_count=one("sets"),
                        # what intake found and acted on (refused or accepted)
                        errors=values.get("edi_error", []))
    read, view.why_flat = _read(store, message)
    if read is not None and (read.standard, read.control) == (view.standard, view.control):
        view.detailed = True
        view.version, view.separators = read.version, read.separators
        view.groups, view.sets = read.groups, read.sets
        sender, receiver = read.sender, read.receiver
    else:
        if read is not None:
            view.why_flat = "the payload reads differently now than when it was stored"
        view.flat = {name: _listed(values.get(name, [])) for name in (
            "group_type", "group_control", "document_type", "transaction_control",
            "reference")}
        sender, receiver = one("sender"), one("receiver")
    view.sender = Identity(sender, party_of(session, sender)) if sender else None
    view.receiver = Identity(receiver, party_of(session, receiver)) if receiver else None
    return view


def _listed(items: list, count: int | None = None) -> Listed:
    total = len(items) if count is None else count
    return Listed(items[:MAX_ROWS], max(total - MAX_ROWS, 0))


def _read(store, message: Message) -> tuple[Read | None, str]:
    """The envelope of the message's ``unpacked`` stage read again, or why not."""
    stage = next((p for p in message.payloads if p.stage == "unpacked"), None)
    if stage is None:
        return None, "no unpacked stage is stored"
    if stage.size > MAX_READ:
        return None, (f"the payload is larger than the {MAX_READ // (1024 * 1024)} MiB "
                      "the page reads again")
    with _lock:
        if stage.digest in _cache:
            _cache.move_to_end(stage.digest)
            return _cache[stage.digest], ""
    try:
        with store.open(stage.digest) as stream:
            env = inspect_stream(stream)
    except Exception:  # noqa: BLE001 - the page shows the summary and says why
        log.warning("payload %s of message %s could not be read again", stage.digest,
                    message.id, exc_info=True)
        return None, "the stored payload could not be read"
    if env is None:
        return None, "no inspector recognises the payload now"
    read = Read(env.standard, env.version, env.sender, env.receiver, env.control,
                env.date, _separators(env.separators), _listed(env.groups),
                _listed(env.sets, env.set_count))
    with _lock:
        _cache[stage.digest] = read
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return read, ""


#: how a separator that is no visible character is named
_NAMED = {"\n": "LF", "\r": "CR", "\t": "TAB", " ": "space"}


def _separators(found: dict[str, str]) -> dict[str, str]:
    """The separators to show: a letter or digit is none (X12 before 00403 has a
    standards identifier, ``U``, where later versions name the repetition separator)."""
    return {name: _NAMED.get(char, char) for name, char in found.items()
            if char and not char.isalnum()}
