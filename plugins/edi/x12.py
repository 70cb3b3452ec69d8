"""The X12 inspector: ISA/GS/ST envelopes, separators from the ISA."""

from __future__ import annotations

from typing import IO

from b2bhub.plugin import Acknowledgment, AckRequest, Envelope
from plugins.edi import acks
from plugins.edi.ack_builder import x12_ack
from plugins.edi.segments import segments

ISA_LENGTH = 106


class X12Inspector:
    """Recognises an interchange that starts with ``ISA`` and reads its envelope."""

    name = "x12"

    @staticmethod
    def recognise(head: bytes) -> bool:
        return head.lstrip()[:3] == b"ISA" and len(head.lstrip()) > 3

    @staticmethod
    def acknowledge(env: Envelope, request: AckRequest) -> Acknowledgment | None:
        """A functional acknowledgment of ``env`` (plugins/edi/ack_builder.py)."""
        return x12_ack(env, request)

    @staticmethod
    def inspect(stream: IO[bytes]) -> Envelope:
        head = b""
        while len(head) < 512:  # leading blanks, then the fixed-length ISA
            chunk = stream.read(512)
            if not chunk:
                break
            head += chunk
        head = head.lstrip()
        env = Envelope(standard="X12")
        if len(head) < ISA_LENGTH:
            env.error(f"the ISA segment is {len(head)} characters, not 106")
            return env
        element = head[3:4]
        terminator = head[105:106]
        isa = head[:105].split(element)
        if len(isa) != 17 or len(isa[16]) != 1 or terminator in (b"", element) \
                or terminator.isalnum():
            env.error(f"the ISA segment is {_isa_length(head, element)} "
                              "characters, not 106")
            return env
        env.separators = {"element": _text(element), "repetition": _text(isa[11]),
                          "sub_element": _text(isa[16]), "segment": _text(terminator)}
        env.sender = f"{_text(isa[5]).strip()}:{_text(isa[6]).strip()}"
        env.receiver = f"{_text(isa[7]).strip()}:{_text(isa[8]).strip()}"
        env.version = _text(isa[12])
        env.control = _text(isa[13])
        env.date = f"{_text(isa[9])} {_text(isa[10])}"
        env.headers["usage"] = _text(isa[15])
        _Reader(env, element).run(segments(stream, terminator, head[106:]))
        acks.finish(env)
        return env


class _Reader:
    def __init__(self, env: Envelope, element: bytes):
        self.env, self.element = env, element
        self.group: dict | None = None
        self.set: dict | None = None
        self.set_segments = 0
        self.trailer = False
        self.acks = acks.X12Acks(env)  # a 997's or 999's AK segments

    def run(self, segs) -> None:
        element, env = self.element, self.env
        for seg in segs:
            if self.set is not None:
                self.set_segments += 1
            tag = seg[:3]
            if tag[2:3] == element:
                tag = tag[:2]
            elif seg[3:4] != element and seg[3:4] != b"":
                continue
            if tag in _INTERESTING:
                getattr(self, "_" + tag.decode())(seg.split(element), env)
            elif tag in acks.X12_TAGS:
                self.acks.read(tag, seg.split(element))
        if not self.trailer:
            env.fault("the interchange has no IEA trailer", "interchange", "trailer", "IEA")
        self._unclosed()

    def _unclosed(self, group: bool = True) -> None:
        """The set (and the group) still open have no trailer (the file ended, or the
        next header or trailer came)."""
        if self.set is not None:
            self.env.fault(f"transaction set {self.set['control']} has no SE trailer",
                           "set", "trailer", "SE", group=self._at(), one=self.set)
            self.set = None
        if group and self.group is not None:
            self.env.fault(f"group {self.group['control']} has no GE trailer", "group",
                           "trailer", "GE", group=self._at())
            self.group = None

    def _at(self) -> int | None:
        """The place of the group open in ``env.groups`` (None: no group is open)."""
        return len(self.env.groups) - 1 if self.group is not None else None

    def _GS(self, f, env):
        self._unclosed()
        if not env.groups:
            env.headers.update(application_sender=_f(f, 2),
                               application_receiver=_f(f, 3))
        self.group = {"functional_id": _f(f, 1), "control": _f(f, 6), "version": _f(f, 8),
                      "sets": 0}
        env.groups.append(self.group)

    def _ST(self, f, env):
        self._unclosed(group=False)
        self.set = {"type": _f(f, 1), "control": _f(f, 2), "reference": "",
                    "group": self.group["control"] if self.group else ""}
        self.set_segments = 1
        env.add_set(self.set)
        if self.group is not None:
            self.group["sets"] += 1

    def _BEG(self, f, env):
        if self.set is not None:
            self.set["reference"] = _f(f, 3)

    def _BIG(self, f, env):  # an 810's invoice number
        if self.set is not None:
            self.set["reference"] = _f(f, 2)

    def _SE(self, f, env):
        if self.set is None:
            env.error("an SE without its ST")
            return
        if _f(f, 2) != self.set["control"]:
            env.fault(f"SE02 {_f(f, 2)} does not match ST02 {self.set['control']}", "set",
                      "control", "SE", group=self._at(), one=self.set)
        if _f(f, 1) != str(self.set_segments):
            env.fault(f"SE01 says {_f(f, 1)} segments, transaction set "
                      f"{self.set['control']} has {self.set_segments}", "set", "count",
                      "SE", group=self._at(), one=self.set, said=_f(f, 1))
        self.set = None

    def _GE(self, f, env):
        if self.group is None:
            env.error("a GE without its GS")
            return
        self._unclosed(group=False)
        if _f(f, 2) != self.group["control"]:
            env.fault(f"GE02 {_f(f, 2)} does not match GS06 {self.group['control']}",
                      "group", "control", "GE", group=self._at())
        if _f(f, 1) != str(self.group["sets"]):
            env.fault(f"GE01 says {_f(f, 1)} transaction sets, group "
                      f"{self.group['control']} has {self.group['sets']}", "group",
                      "count", "GE", group=self._at(), said=_f(f, 1))
        self.group = None

    def _IEA(self, f, env):
        self.trailer = True
        self._unclosed()
        if _f(f, 2) != env.control:
            env.fault(f"IEA02 {_f(f, 2)} does not match ISA13 {env.control}",
                      "interchange", "control", "IEA")
        if _f(f, 1) != str(len(env.groups)):
            env.fault(f"IEA01 says {_f(f, 1)} groups, the interchange has "
                      f"{len(env.groups)}", "interchange", "count", "IEA", said=_f(f, 1))


_INTERESTING = frozenset({b"GS", b"ST", b"BEG", b"BIG", b"SE", b"GE", b"IEA"})


def _isa_length(head: bytes, element: bytes) -> str:
    """How long the ISA is, by its 16th element separator (a sub-element and the
    segment terminator follow it); '?' when it has fewer."""
    at = -1
    for _ in range(16):
        at = head.find(element, at + 1)
        if at < 0:
            return "?"
    return str(at + 3)


def _f(fields: list[bytes], n: int) -> str:
    return _text(fields[n]).strip() if n < len(fields) else ""


def _text(value: bytes) -> str:
    return value.decode("latin-1")
