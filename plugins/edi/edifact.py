"""The EDIFACT inspector: UNB/UNG/UNH envelopes, separators from the UNA (or defaults)."""

from __future__ import annotations

from typing import IO

from b2bhub.plugin import Acknowledgment, AckRequest, Envelope
from plugins.edi import acks
from plugins.edi.ack_builder import contrl
from plugins.edi.segments import segments


class EdifactInspector:
    """Recognises an interchange that starts with ``UNA`` or ``UNB`` and reads it."""

    name = "edifact"

    @staticmethod
    def recognise(head: bytes) -> bool:
        return head.lstrip()[:3] in (b"UNA", b"UNB")

    @staticmethod
    def acknowledge(env: Envelope, request: AckRequest) -> Acknowledgment | None:
        """A functional acknowledgment of ``env`` (plugins/edi/ack_builder.py)."""
        return contrl(env, request)

    @staticmethod
    def inspect(stream: IO[bytes]) -> Envelope:
        head = stream.read(512).lstrip()
        component, element, release, terminator = b":", b"+", b"?", b"'"
        if head[:3] == b"UNA" and len(head) >= 9:
            component, element = head[3:4], head[4:5]
            release = head[6:7] if head[6:7] != b" " else None
            terminator = head[8:9]
            head = head[9:]
        env = Envelope(standard="EDIFACT")
        env.separators = {"element": element.decode("latin-1"),
                          "sub_element": component.decode("latin-1"),
                          "release": (release or b"").decode("latin-1"),
                          "segment": terminator.decode("latin-1")}
        _Reader(env, element, component, release).run(
            segments(stream, terminator, head, release))
        acks.finish(env)
        return env


class _Reader:
    def __init__(self, env: Envelope, element: bytes, component: bytes,
                 release: bytes | None):
        self.env, self.element, self.component = env, element, component
        self.release = release
        self.group: dict | None = None
        self.set: dict | None = None
        self.set_segments = 0
        self.units = 0  # messages (or groups) counted for UNZ
        self.started = self.trailer = False
        self.acks = acks.EdifactAcks(env)  # a CONTRL's UCI, UCM ... segments
        self.identifier = ""  # the open message's S009, whole

    def run(self, segs) -> None:
        env, element = self.env, self.element
        for seg in segs:
            if self.set is not None:
                self.set_segments += 1
            if seg[3:4] not in (element, b""):
                continue
            handler = _HANDLERS.get(seg[:3])
            if handler is not None:
                handler(self, self._split(seg), env)
            elif seg[:3] in acks.EDIFACT_TAGS:
                self.acks.read(seg[:3], self._split(seg))
        if not self.started:
            env.error("the interchange has no UNB header")
        if not self.trailer:
            env.fault("the interchange has no UNZ trailer", "interchange", "trailer", "UNZ")
        self._unclosed()

    def _unclosed(self, group: bool = True) -> None:
        """The message (and the group) still open have no trailer (the interchange
        ended, or the next header or trailer came)."""
        if self.set is not None:
            self.env.fault(f"message {self.set['control']} has no UNT trailer", "set",
                           "trailer", "UNT", group=self._at(), one=self.set,
                           identifier=self.identifier)
            self.set = None
        if group and self.group is not None:
            self.env.fault(f"group {self.group['control']} has no UNE trailer", "group",
                           "trailer", "UNE", group=self._at())
            self.group = None

    def _at(self) -> int | None:
        """The place of the group open in ``env.groups`` (None: no group is open)."""
        return len(self.env.groups) - 1 if self.group is not None else None

    def _split(self, seg: bytes) -> list[list[str]]:
        """Elements of components, with release characters resolved."""
        out, field, comp, i = [], [], bytearray(), 0
        while i < len(seg):
            c = seg[i:i + 1]
            if self.release is not None and c == self.release and i + 1 < len(seg):
                comp += seg[i + 1:i + 2]
                i += 2
                continue
            if c == self.element:
                field.append(comp.decode("latin-1"))
                out.append(field)
                field, comp = [], bytearray()
            elif c == self.component:
                field.append(comp.decode("latin-1"))
                comp = bytearray()
            else:
                comp += c
            i += 1
        field.append(comp.decode("latin-1"))
        out.append(field)
        return out

    def unb(self, f, env):
        self.started = True
        env.version = ":".join(_e(f, 1))
        sender, receiver = _e(f, 2), _e(f, 3)
        env.sender = f"{_c(sender, 1)}:{_c(sender, 0)}"
        env.receiver = f"{_c(receiver, 1)}:{_c(receiver, 0)}"
        env.date = " ".join(_e(f, 4))
        env.control = _c(_e(f, 5), 0)
        env.headers["test"] = _c(_e(f, 11), 0)

    def ung(self, f, env):
        self._unclosed()
        self.group = {"functional_id": _c(_e(f, 1), 0), "control": _c(_e(f, 5), 0),
                      "version": ":".join(_e(f, 7)), "sets": 0}
        env.groups.append(self.group)
        self.units += 1

    def unh(self, f, env):
        self._unclosed(group=False)
        self.identifier = ":".join(_e(f, 2))
        self.set = {"type": ":".join(_e(f, 2)[:3]), "control": _c(_e(f, 1), 0),
                    "reference": "",
                    "group": self.group["control"] if self.group else ""}
        self.set_segments = 1
        env.add_set(self.set)
        if self.group is not None:
            self.group["sets"] += 1
        else:
            self.units += 1

    def bgm(self, f, env):
        if self.set is not None:
            self.set["reference"] = _c(_e(f, 2), 0)

    def unt(self, f, env):
        if self.set is None:
            env.error("a UNT without its UNH")
            return
        count, ref = _c(_e(f, 1), 0), _c(_e(f, 2), 0)
        where = {"group": self._at(), "one": self.set, "identifier": self.identifier}
        if ref != self.set["control"]:
            env.fault(f"UNT 0062 {ref} does not match UNH 0062 {self.set['control']}",
                      "set", "control", "UNT", **where)
        if count != str(self.set_segments):
            env.fault(f"UNT says {count} segments, message {self.set['control']} "
                      f"has {self.set_segments}", "set", "count", "UNT", said=count, **where)
        self.set = None

    def une(self, f, env):
        if self.group is None:
            env.error("a UNE without its UNG")
            return
        self._unclosed(group=False)
        count, ref = _c(_e(f, 1), 0), _c(_e(f, 2), 0)
        if ref != self.group["control"]:
            env.fault(f"UNE 0048 {ref} does not match UNG 0048 {self.group['control']}",
                      "group", "control", "UNE", group=self._at())
        if count != str(self.group["sets"]):
            env.fault(f"UNE says {count} messages, group {self.group['control']} "
                      f"has {self.group['sets']}", "group", "count", "UNE",
                      group=self._at(), said=count)
        self.group = None

    def unz(self, f, env):
        self.trailer = True
        self._unclosed()
        count, ref = _c(_e(f, 1), 0), _c(_e(f, 2), 0)
        if ref != env.control:
            env.fault(f"UNZ 0020 {ref} does not match UNB 0020 {env.control}",
                      "interchange", "control", "UNZ")
        if count != str(self.units):
            env.fault(f"UNZ says {count} messages or groups, the interchange "
                      f"has {self.units}", "interchange", "count", "UNZ", said=count)


_HANDLERS = {b"UNB": _Reader.unb, b"UNG": _Reader.ung, b"UNH": _Reader.unh,
             b"BGM": _Reader.bgm, b"UNT": _Reader.unt, b"UNE": _Reader.une,
             b"UNZ": _Reader.unz}


def _e(fields: list[list[str]], n: int) -> list[str]:
    return fields[n] if n < len(fields) else []


def _c(components: list[str], n: int) -> str:
    return components[n] if n < len(components) else ""
