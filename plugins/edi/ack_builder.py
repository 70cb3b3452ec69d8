"""Functional acknowledgments of the interchanges the inspectors read (docs/edi.md):
an X12 997 (004010) or 999 (005010X231A1), an EDIFACT CONTRL, at syntax level, made
from the envelope errors the inspector told to their interchange, group or set
(``Envelope.faults``). Pure functions of an envelope; the core numbers, stores and
dispatches what they make.

What is said, per standard (the codes are the standards' own):

* X12: one acknowledgment set (997 or 999) per functional group received, in one
  ``FA`` group. Only the sets in error get an AK2 loop (AK5 / IK5 ``R`` with the codes
  2 trailer missing, 3 control numbers differ, 4 wrong segment count); AK9 counts
  included, received and accepted sets and says ``A`` accepted, ``E`` accepted with
  errors (GE02 / GE01 wrong: 4 / 5), ``P`` partially accepted, ``R`` rejected (every
  set, or GE missing: 3). An error of the interchange's own envelope (IEA) is a TA1
  before the group: ``E`` with 001 (control numbers differ) or 021 (group count), ``R``
  with 023 (no IEA: the interchange ended early).
* EDIFACT: one CONTRL. UCI action 7 (acknowledged, every lower level too unless
  rejected below) or 4 (rejected: the UNZ is wrong or missing, or every message is
  rejected); a UCF (4, or 7 holding rejected messages) per group in error and a UCM
  (4) per message in error, with 0085 13 (missing), 28 (references do not match) or
  29 (count does not match) and the trailer's tag (0013).

Acknowledgments (X12 ``FA`` groups, ``CONTRL`` messages) are never acknowledged.
"""

from __future__ import annotations

from b2bhub.plugin import Acknowledgment, AckRequest, Envelope

#: the document types of acknowledgments (never acknowledged themselves)
ACK_TYPES = ("997", "999", "CONTRL")
#: X12 AK502 / IK502 (element 718 / 618) by fault kind
SET_CODES = {"trailer": "2", "control": "3", "count": "4"}
#: X12 AK905 (element 716) by fault kind
GROUP_CODES = {"trailer": "3", "control": "4", "count": "5"}
#: X12 TA105 (interchange note code) by fault kind
TA1_CODES = {"control": "001", "count": "021", "trailer": "023"}
#: EDIFACT 0085 (syntax error, coded) by fault kind
EDIFACT_CODES = {"trailer": "13", "control": "28", "count": "29"}
#: the versions an acknowledgment is made in: (ISA12, GS08 and ST03)
X12_VERSIONS = {"997": ("00401", "004010"), "999": ("00501", "005010X231A1")}
WORDS = {"A": "accepted", "E": "accepted with errors", "P": "partially accepted",
         "R": "rejected"}
#: the errors a detail names, at most
DETAIL_ERRORS = 5


def detail(env: Envelope) -> str:
    texts = [f["text"] for f in env.faults[:DETAIL_ERRORS]]
    more = len(env.errors) - len(texts)
    return "; ".join(texts) + (f" and {more} more" if more > 0 else "")


def _id(identity: str) -> tuple[str, str]:
    """(qualifier, id) of ``qualifier:id``."""
    qualifier, _, ident = identity.partition(":")
    return qualifier, ident


# --- X12 -----------------------------------------------------------------------------

def x12_ack(env: Envelope, request: AckRequest) -> Acknowledgment | None:
    """A 997 or 999 of ``env`` (None when it holds no group to acknowledge)."""
    kind = request.kind if request.kind in X12_VERSIONS else "997"
    groups = [(at, g) for at, g in enumerate(env.groups) if g["functional_id"] != "FA"]
    if not groups or not env.separators:
        return None
    sep = env.separators
    e, term = sep["element"], sep["segment"]

    def seg(*fields: str) -> str:
        return e.join(fields) + term

    isa12, version = X12_VERSIONS[kind]
    repetition = sep.get("repetition", "U")
    if isa12 == "00401":
        repetition = "U"  # ISA11 is the standards identifier there
    elif not repetition or repetition.isalnum():  # a 4010 interchange's U: none given
        repetition = "^" if "^" not in (e, term, sep["sub_element"]) else "{"
    ours, theirs = _id(request.sender), _id(request.receiver)
    now, n = request.now, request.control
    out = [seg("ISA", "00", " " * 10, "00", " " * 10, ours[0].ljust(2), ours[1].ljust(15)[:15],
               theirs[0].ljust(2), theirs[1].ljust(15)[:15], now.strftime("%y%m%d"),
               now.strftime("%H%M"), repetition, isa12, f"{n:09d}", "0",
               env.headers.get("usage") or "P", sep["sub_element"])]
    ta1 = _ta1(env)
    if ta1:
        date, _, time = env.date.partition(" ")
        out.append(seg("TA1", env.control, date, time, *ta1))
    out.append(seg("GS", "FA", env.headers.get("application_receiver") or ours[1],
                   env.headers.get("application_sender") or theirs[1],
                   now.strftime("%Y%m%d"), now.strftime("%H%M"), str(n), "X", version))
    codes = []
    for k, (at, group) in enumerate(groups, start=1):
        body, code = _x12_group(env, at, group, kind, version)
        codes.append(code)
        control = f"{k:04d}"
        head = seg("ST", kind, control, version) if kind == "999" else seg("ST", kind, control)
        out += [head, *(seg(*fields) for fields in body),
                seg("SE", str(len(body) + 2), control)]
    out += [seg("GE", str(len(groups)), str(n)), seg("IEA", "1", f"{n:09d}")]
    return Acknowledgment("".join(out).encode("latin-1"), kind,
                          _x12_outcome(codes, ta1), detail(env))


def _ta1(env: Envelope) -> tuple[str, str] | None:
    """TA104 and TA105 for the interchange's own envelope errors, None for none."""
    faults = [f for f in env.faults if f["level"] == "interchange"]
    if not faults:
        return None
    trailer = [f for f in faults if f["kind"] == "trailer"]
    first = (trailer or faults)[0]
    return ("R" if trailer else "E"), TA1_CODES[first["kind"]]


def _x12_group(env: Envelope, at: int, group: dict, kind: str, version: str
               ) -> tuple[list[tuple[str, ...]], str]:
    """The AK1 ... AK9 segments (as fields) of one group, and its AK901 code."""
    body: list[tuple[str, ...]] = [("AK1", group["functional_id"], group["control"],
                                    *((group["version"],) if kind == "999" else ()))]
    sets: dict[tuple[str, str], list[str]] = {}
    for fault in env.faults:
        if fault["level"] == "set" and fault["group"] == at:
            codes = sets.setdefault((fault["type"], fault["control"]), [])
            if SET_CODES[fault["kind"]] not in codes:
                codes.append(SET_CODES[fault["kind"]])
    for (kind_of, control), codes in sets.items():
        body += [("AK2", kind_of, control),
                 ("IK5" if kind == "999" else "AK5", "R", *codes[:5])]
    own = [f for f in env.faults if f["level"] == "group" and f["group"] == at]
    received = group["sets"]
    cut = any(f["kind"] == "trailer" for f in own)
    accepted = 0 if cut else max(received - env.bad_sets.get(at, 0), 0)
    included = next((f["said"] for f in own if f["kind"] == "count"), str(received))
    code = ("R" if cut or (received and not accepted) else
            "P" if accepted < received else "E" if own else "A")
    group_codes = list(dict.fromkeys(GROUP_CODES[f["kind"]] for f in own))[:5]
    body.append(("AK9", code, included if included.isdigit() else str(received),
                 str(received), str(accepted), *group_codes))
    return body, code


def _x12_outcome(codes: list[str], ta1: tuple[str, str] | None) -> str:
    if (ta1 and ta1[0] == "R") or all(c == "R" for c in codes):
        return WORDS["R"]
    if all(c == "A" for c in codes) and not ta1:
        return WORDS["A"]
    if any(c in ("P", "R") for c in codes):
        return WORDS["P"]
    return WORDS["E"]


# --- EDIFACT -------------------------------------------------------------------------

def contrl(env: Envelope, request: AckRequest) -> Acknowledgment | None:
    """A CONTRL of ``env`` (None when it holds no message to acknowledge)."""
    if not env.separators or not env.control or env.set_count == 0 or all(
            kind.startswith("CONTRL") for kind in env.types):
        return None
    sep = env.separators
    c, e, r, term = sep["sub_element"], sep["element"], sep["release"], sep["segment"]

    def esc(value: str) -> str:
        if not r:
            return value
        return "".join(r + ch if ch in (c, e, r, term) else ch for ch in value)

    def seg(*fields: str | tuple[str, ...]) -> str:
        parts = [c.join(esc(v) for v in _trimmed(f)) if isinstance(f, tuple) else esc(f)
                 for f in fields]
        return e.join(_trimmed(parts)) + term

    syntax = env.version.partition(":")[2] or "3"
    four = syntax >= "4"
    message = ("CONTRL", "4", "1", "UN") if four else ("CONTRL", "D", "3", "UN")
    ours, theirs = _id(request.sender), _id(request.receiver)
    sent_by, sent_to = _id(env.sender), _id(env.receiver)
    now, n = request.now, str(request.control)
    date = now.strftime("%Y%m%d" if four else "%y%m%d")
    test = ("",) * 6 + ("1",) if env.headers.get("test") == "1" else ()
    head = [f"UNA{c}{e}.{r or ' '}{'*' if four else ' '}{term}",
            seg("UNB", tuple(env.version.split(":")), (ours[1], ours[0]),
                (theirs[1], theirs[0]), (date, now.strftime("%H%M")), n, *test),
            seg("UNH", n, message)]
    body, action = _contrl_body(env)
    uci = seg("UCI", env.control, (sent_by[1], sent_by[0]), (sent_to[1], sent_to[0]),
              action, *_edifact_code(env, None, "interchange"))
    lines = [uci, *(seg(*fields) for fields in body)]
    out = [*head, *lines, seg("UNT", str(len(lines) + 2), n), seg("UNZ", "1", n)]
    outcome = (WORDS["R"] if action == "4" else WORDS["A"] if not body else WORDS["P"])
    return Acknowledgment("".join(out).encode("latin-1"), "CONTRL", outcome, detail(env))


def _trimmed(values) -> list[str]:
    """``values`` without the empty ones at their end (left out, as EDIFACT asks)."""
    values = list(values)
    while values and not values[-1]:
        values.pop()
    return values


def _edifact_code(env: Envelope, group: int | None, level: str) -> tuple[str, ...]:
    """0085 and 0013 of the first fault at this level (and group), () for none."""
    for fault in env.faults:
        if fault["level"] == level and (level == "interchange" or fault["group"] == group):
            return EDIFACT_CODES[fault["kind"]], fault["segment"]
    return ()


def _contrl_body(env: Envelope) -> tuple[list[tuple], str]:
    """The UCF and UCM segments (as fields) and the UCI action."""
    messages: dict[tuple[int | None, str], tuple] = {}
    for fault in env.faults:
        if fault["level"] == "set" and not fault["type"].startswith("CONTRL"):
            key = (fault["group"], fault["control"])
            if key not in messages:
                ident = fault.get("identifier") or fault["type"]
                messages[key] = ("UCM", fault["control"], tuple(ident.split(":")), "4",
                                 EDIFACT_CODES[fault["kind"]], fault["segment"])
    body: list[tuple] = [ucm for (group, _), ucm in messages.items() if group is None]
    bad_groups = {f["group"] for f in env.faults if f["level"] == "group"}
    for at, group in enumerate(env.groups):
        held = [ucm for (g, _), ucm in messages.items() if g == at]
        if at in bad_groups:
            body.append(("UCF", group["control"], "", "", "4",
                         *_edifact_code(env, at, "group")))
        elif held:
            body.append(("UCF", group["control"], "", "", "7"))
        body += held
    rejected = sum(n for at, n in env.bad_sets.items() if at not in bad_groups) + sum(
        env.groups[at]["sets"] for at in bad_groups if at is not None)
    whole = any(f["level"] == "interchange" for f in env.faults) or (
        rejected >= env.set_count > 0)
    return body, "4" if whole else "7"
