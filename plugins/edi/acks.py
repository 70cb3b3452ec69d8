"""Reading the acknowledgments a partner sends for interchanges we sent (docs/edi.md,
"Acknowledgments we receive"): X12 997 / 999 and EDIFACT CONTRL.

The inspectors hand each segment of these kinds to a reader here as they stream by;
what it found goes into ``Envelope.acknowledges``, one entry per group (X12: an
``AK1``) or interchange (EDIFACT: a ``UCI``) acknowledged:

- ``standard``: ``X12`` or ``EDIFACT``; ``kind``: ``group`` or ``interchange``
- ``functional_id``, ``group_control`` (X12 AK101, AK102) or ``interchange_control``,
  ``sender``, ``receiver`` (EDIFACT UCI 0020, S002, S003: the acknowledged
  interchange's own sender and recipient, ``qualifier:id``)
- ``status``: the code as sent (AK901 / IK9... ``A`` ``E`` ``P`` ``R`` ...; UCI 0083
  ``7`` ``4`` ``8``), ``result``: ``accepted``, ``accepted with errors``, ``partially
  accepted``, ``rejected`` or ``received``
- ``codes``: the error codes given, each named by where it was found
  (``AK9: 5``, ``AK5 0001: 5``, ``IK3 0001: 8``, ``UCI: 18``, ``UCM 1: 12``)
- ``sets``: per transaction set or message (AK2 / UCM): ``type``, ``control``,
  ``status``, ``result``, ``codes``
"""

from __future__ import annotations

#: X12 segments an acknowledgment is read from
X12_TAGS = frozenset({b"AK1", b"AK2", b"AK3", b"AK4", b"AK5", b"AK9", b"IK3", b"IK4",
                      b"IK5"})
#: EDIFACT segments a CONTRL is read from
EDIFACT_TAGS = frozenset({b"UCI", b"UCM", b"UCF", b"UCS", b"UCD"})

#: X12 group / set status codes (AK9 01, AK5 01, IK5 01)
X12_RESULTS = {"A": "accepted", "E": "accepted with errors",
               "P": "partially accepted", "R": "rejected", "M": "rejected",
               "W": "rejected", "X": "rejected"}
#: EDIFACT action codes (0083)
EDIFACT_RESULTS = {"7": "accepted", "4": "rejected", "8": "received"}
#: the results that settle a wait as rejected (the others: acknowledged)
REJECTING = frozenset({"rejected", "partially accepted"})

#: the most sets kept per entry (an ack of 100,000 sets stays small)
MAX_SETS = 1000
MAX_CODES = 100


def _field(fields: list, n: int) -> str:
    if n >= len(fields):
        return ""
    value = fields[n]
    if isinstance(value, list):  # EDIFACT: the first component
        value = value[0] if value else ""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value.strip()


def _component(fields: list, n: int, c: int) -> str:
    if n >= len(fields) or not isinstance(fields[n], list) or c >= len(fields[n]):
        return ""
    return fields[n][c].strip()


def _add_code(entry: dict, where: str, code: str) -> None:
    if code and len(entry["codes"]) < MAX_CODES:
        entry["codes"].append(f"{where}: {code}")


class X12Acks:
    """Reads AK1 ... AK9 of a 997 or 999 (segments split on the element separator)."""

    def __init__(self, env):
        self.env = env
        self.entry: dict | None = None
        self.set: dict | None = None

    def read(self, tag: bytes, fields: list[bytes]) -> None:
        getattr(self, "_" + tag.decode())(fields)

    def _AK1(self, f):
        self.entry = {"standard": "X12", "kind": "group", "functional_id": _field(f, 1),
                      "group_control": _field(f, 2), "status": "", "result": "",
                      "codes": [], "sets": []}
        self.set = None
        self.env.acknowledges.append(self.entry)

    def _AK2(self, f):
        if self.entry is None:
            return
        self.set = {"type": _field(f, 1), "control": _field(f, 2), "status": "",
                    "result": "", "codes": []}
        if len(self.entry["sets"]) < MAX_SETS:
            self.entry["sets"].append(self.set)

    def _segment_error(self, f, tag: str, position: int) -> None:
        if self.entry is not None:
            where = f"{tag} {self.set['control']}" if self.set else tag
            _add_code(self.entry, where, _field(f, position))

    def _AK3(self, f):  # a segment in error: AK304 its syntax error code
        self._segment_error(f, "AK3", 4)

    def _IK3(self, f):
        self._segment_error(f, "IK3", 4)

    def _AK4(self, f):  # an element in error: AK403 its syntax error code
        self._segment_error(f, "AK4", 3)

    def _IK4(self, f):
        self._segment_error(f, "IK4", 3)

    def _set_status(self, f, tag: str) -> None:
        if self.entry is None or self.set is None:
            return
        status = _field(f, 1)
        self.set["status"], self.set["result"] = status, X12_RESULTS.get(status, status)
        for n in range(2, 7):
            _add_code(self.set, tag, _field(f, n))
            _add_code(self.entry, f"{tag} {self.set['control']}", _field(f, n))
        self.set = None

    def _AK5(self, f):
        self._set_status(f, "AK5")

    def _IK5(self, f):
        self._set_status(f, "IK5")

    def _AK9(self, f):
        if self.entry is None:
            return
        status = _field(f, 1)
        self.entry["status"] = status
        self.entry["result"] = X12_RESULTS.get(status, status)
        self.entry["counts"] = {"included": _field(f, 2), "received": _field(f, 3),
                                "accepted": _field(f, 4)}
        for n in range(5, 10):
            _add_code(self.entry, "AK9", _field(f, n))
        self.entry = None


class EdifactAcks:
    """Reads UCI, UCF, UCM, UCS and UCD of a CONTRL (segments split into elements of
    components, release characters resolved)."""

    def __init__(self, env):
        self.env = env
        self.entry: dict | None = None
        self.set: dict | None = None

    def read(self, tag: bytes, fields: list[list[str]]) -> None:
        getattr(self, "_" + tag.decode())(fields)

    def _UCI(self, f):
        status = _field(f, 4)
        self.entry = {"standard": "EDIFACT", "kind": "interchange",
                      "interchange_control": _field(f, 1),
                      "sender": _identity(f, 2), "receiver": _identity(f, 3),
                      "status": status, "result": EDIFACT_RESULTS.get(status, status),
                      "codes": [], "sets": []}
        self.set = None
        _add_code(self.entry, "UCI", _field(f, 5))
        self.env.acknowledges.append(self.entry)

    def _UCF(self, f):  # a group: its action, counted as its messages' are
        if self.entry is not None:
            if _field(f, 3) == "4":
                self.entry["group_rejected"] = True
            _add_code(self.entry, f"UCF {_field(f, 1)}", _field(f, 4))

    def _UCM(self, f):
        if self.entry is None:
            return
        status = _field(f, 3)
        self.set = {"type": ":".join(c for c in (f[2] if len(f) > 2 else [])[:3] if c),
                    "control": _field(f, 1), "status": status,
                    "result": EDIFACT_RESULTS.get(status, status), "codes": []}
        _add_code(self.set, "UCM", _field(f, 4))
        _add_code(self.entry, f"UCM {self.set['control']}", _field(f, 4))
        if len(self.entry["sets"]) < MAX_SETS:
            self.entry["sets"].append(self.set)

    def _UCS(self, f):  # a segment in error: 0085 its code
        self._error(f, "UCS", 2)

    def _UCD(self, f):  # a data element in error: 0085 its code
        self._error(f, "UCD", 1)

    def _error(self, f, tag: str, position: int) -> None:
        if self.entry is not None:
            where = f"{tag} {self.set['control']}" if self.set else tag
            _add_code(self.entry, where, _field(f, position))
            if self.set is not None:
                _add_code(self.set, tag, _field(f, position))


def _identity(fields: list, n: int) -> str:
    """An EDIFACT party (S002 / S003) as ``qualifier:id``, as the inspector stores one."""
    party = _component(fields, n, 0)
    return f"{_component(fields, n, 1)}:{party}" if party else ""


def finish(env) -> None:
    """An interchange accepted as a whole whose sets or groups were not all accepted
    is partially accepted (CONTRL UCI 7 with a UCM or UCF 4)."""
    for entry in env.acknowledges:
        if entry["standard"] == "EDIFACT" and entry["result"] == "accepted" and (
                entry.pop("group_rejected", False)
                or any(s["result"] == "rejected" for s in entry["sets"])):
            entry["result"] = "partially accepted"
        entry.pop("group_rejected", None)
        if entry["standard"] == "X12" and not entry["result"]:
            # no AK9 (a broken ack): the sets say it
            results = {s["result"] for s in entry["sets"]}
            entry["result"] = ("rejected" if results == {"rejected"} else
                               "partially accepted" if "rejected" in results else
                               "accepted with errors" if "accepted with errors" in results
                               else "accepted")
