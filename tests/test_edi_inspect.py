"""The X12 and EDIFACT inspectors read envelopes as the standards say (docs/edi.md)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydifact.segmentcollection import Interchange

from b2bhub.engine.inspection import attributes, inspect_stream
from b2bhub.plugin.registry import get_inspectors
from plugins.edi import segments as segments_module

pytestmark = pytest.mark.filterwarnings("ignore:segments.xml not found")
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
if not SAMPLES.is_dir():
    SAMPLES = Path("/work/shared/samples")
X12 = (SAMPLES / "x12-850-purchase-order.edi").read_bytes()
EDIFACT = (SAMPLES / "edifact-orders.edi").read_bytes()


def inspect(data: bytes):
    return inspect_stream(io.BytesIO(data))


def x12(sets=(("850", "0001", "PO-4711"),), *, element="*", sub=">", rep="U",
        term="~", newline="\n", groups=None, control="000000101"):
    """An X12 interchange: ``groups`` a list of (GS01, GS06, sets)."""
    groups = groups or [("PO", "101", sets)]
    e = element

    def seg(*fields):
        return e.join(fields) + term + newline

    isa = seg("ISA", "00", " " * 10, "00", " " * 10, "ZZ", "MYCOMPANY".ljust(15), "ZZ",
              "ACME".ljust(15), "261129", "1200", rep, "00401", control, "0", "P", sub)
    out = [isa]
    for gid, gctl, gsets in groups:
        out.append(seg("GS", gid, "MYCOMPANY", "ACME", "20261129", "1200", gctl, "X",
                       "004010"))
        for kind, ctl, ref in gsets:
            body = [seg("BEG", "00", "SA", ref, "", "20261129"),
                    seg("PO1", "1", "2", "EA", f"1{sub}5", "", "VP", "SKU-1")]
            out += [seg("ST", kind, ctl), *body, seg("SE", str(len(body) + 2), ctl)]
        out.append(seg("GE", str(len(gsets)), gctl))
    out.append(seg("IEA", str(len(groups)), control))
    return "".join(out).encode()


def test_the_x12_sample_envelope():
    env = inspect(X12)
    assert (env.standard, env.version, env.sender, env.receiver, env.control, env.date) == (
        "X12", "00401", "ZZ:MYCOMPANY", "ZZ:ACME", "000000101", "261129 1200")
    assert env.groups == [{"functional_id": "PO", "control": "101", "version": "004010",
                           "sets": 1}]
    assert env.sets == [{"type": "850", "control": "0001", "group": "101",
                         "reference": "PO-4711"}]
    assert env.separators == {"element": "*", "repetition": "U", "sub_element": ">",
                              "segment": "~"}
    assert env.errors == []
    pairs = attributes(env)
    assert ("document_type", "850") in pairs and ("reference", "PO-4711") in pairs
    assert ("interchange_control", "000000101") in pairs and ("group_control", "101") in pairs


def test_the_edifact_sample_envelope_agrees_with_pydifact():
    env = inspect(EDIFACT)
    assert (env.standard, env.version, env.sender, env.receiver, env.control) == (
        "EDIFACT", "UNOC:3", "ZZ:MYCOMPANY", "ZZ:ACME", "102")
    assert env.sets == [{"type": "ORDERS:D:96A", "control": "1", "group": "",
                         "reference": "PO-4712"}]
    # the sample counts 12 segments in UNT; UNH to UNT inclusive are 13 (0074)
    assert env.errors == ["UNT says 12 segments, message 1 has 13"]
    theirs = Interchange.from_str(EDIFACT.decode())
    unh = next(s for s in theirs.segments if s.tag == "UNH")
    bgm = next(s for s in theirs.segments if s.tag == "BGM")
    assert unh.elements[0] == env.sets[0]["control"]
    assert ":".join(unh.elements[1][:3]) == env.sets[0]["type"]
    assert bgm.elements[1] == env.sets[0]["reference"]
    assert theirs.sender[0] == "MYCOMPANY" and theirs.control_reference == env.control


@pytest.mark.parametrize("element,sub,rep,term,newline", [
    ("*", ">", "U", "~", ""), ("|", "^", "{", "\x1c", ""), ("^", ":", "!", "'", "\r\n"),
    ("*", ">", "U", "~", "\r\n"), ("\x1d", "\x1f", "\x1e", "\n", ""),
])
def test_x12_separators_come_from_the_isa(element, sub, rep, term, newline):
    env = inspect(x12(element=element, sub=sub, rep=rep, term=term, newline=newline))
    assert env.errors == []
    assert env.separators == {"element": element, "repetition": rep, "sub_element": sub,
                              "segment": term}
    assert [s["reference"] for s in env.sets] == ["PO-4711"]


def test_x12_two_groups_and_two_transaction_types():
    data = x12(groups=[("PO", "7", [("850", "0001", "PO-1"), ("850", "0002", "PO-2")]),
                       ("IN", "8", [("810", "0003", "INV-9")])])
    env = inspect(data)
    assert env.errors == []
    assert [(g["functional_id"], g["control"], g["sets"]) for g in env.groups] == [
        ("PO", "7", 2), ("IN", "8", 1)]
    assert [(s["type"], s["group"]) for s in env.sets] == [
        ("850", "7"), ("850", "7"), ("810", "8")]
    pairs = attributes(env)
    assert [v for n, v in pairs if n == "document_type"] == ["850", "810"]
    assert ("sets", "3") in pairs and ("groups", "2") in pairs


#: each X12 envelope error the inspector names: (a change of :func:`x12`'s interchange,
#: the error's text), also dropped into sources in tests/test_edi_checks.py
X12_ERRORS = [
    (lambda d: d.replace(b"MYCOMPANY      *", b"MYCOMPANY     *", 1),
     "the ISA segment is 105 characters, not 106"),
    (lambda d: d.replace(b"IEA*1*000000101", b"IEA*1*000000999"),
     "IEA02 000000999 does not match ISA13 000000101"),
    (lambda d: d.replace(b"GE*1*101", b"GE*1*102"), "GE02 102 does not match GS06 101"),
    (lambda d: d.replace(b"SE*4*0001", b"SE*4*0002"), "SE02 0002 does not match ST02 0001"),
    (lambda d: d.replace(b"SE*4*", b"SE*5*"), "SE01 says 5 segments"),
    (lambda d: d.replace(b"GE*1*", b"GE*2*"), "GE01 says 2 transaction sets"),
    (lambda d: d.replace(b"IEA*1*", b"IEA*3*"), "IEA01 says 3 groups"),
    (lambda d: d[:d.index(b"IEA")], "no IEA trailer"),
    (lambda d: d[:d.index(b"GE*")], "group 101 has no GE trailer"),
    (lambda d: d[:d.index(b"SE*")], "transaction set 0001 has no SE trailer"),
]


@pytest.mark.parametrize("change,error", X12_ERRORS)
def test_each_x12_envelope_error_is_named(change, error):
    env = inspect(change(x12()))
    assert any(error in text for text in env.errors), env.errors


def edifact(una="UNA:+.? '", c=":", e="+", t="'", newline="\n", ung=False):
    def seg(*fields):
        return e.join(fields) + t + newline

    out = [una + newline if una else "", seg("UNB", f"UNOC{c}3", f"MYCOMPANY{c}ZZ",
                                             f"ACME{c}ZZ", f"261129{c}1200", "55")]
    if ung:
        out.append(seg("UNG", "ORDERS", f"MYCOMPANY{c}ZZ", f"ACME{c}ZZ",
                       f"261129{c}1200", "9", "UN", f"D{c}96A"))
    out += [seg("UNH", "1", f"ORDERS{c}D{c}96A{c}UN"), seg("BGM", "220", "PO?+1", "9"),
            seg("UNT", "3", "1"),
            seg("UNH", "2", f"INVOIC{c}D{c}96A{c}UN"), seg("BGM", "380", "INV-3", "9"),
            seg("FTX", "AAI", "", "", "it?'s ok"), seg("UNT", "4", "2")]
    if ung:
        out.append(seg("UNE", "2", "9"))
    out.append(seg("UNZ", "1" if ung else "2", "55"))
    return "".join(out).encode()


@pytest.mark.parametrize("kw", [
    {}, {"una": "", "newline": ""}, {"una": "UNA|*.? !", "c": "|", "e": "*", "t": "!"},
    {"newline": "\r\n"}, {"ung": True},
])
def test_edifact_variants_agree_with_pydifact(kw):
    data = edifact(**kw)
    env = inspect(data)
    assert env.errors == []
    assert [(s["type"], s["control"], s["reference"]) for s in env.sets] == [
        ("ORDERS:D:96A", "1", "PO+1"), ("INVOIC:D:96A", "2", "INV-3")]
    assert len(env.groups) == (1 if kw.get("ung") else 0)
    theirs = [s for s in Interchange.from_str(data.decode()).segments
              if s.tag in ("UNH", "BGM")]
    assert [s.elements[0] if s.tag == "UNH" else s.elements[1] for s in theirs] == [
        "1", "PO+1", "2", "INV-3"]


#: each EDIFACT envelope error the inspector names, of :func:`edifact`'s interchange
EDIFACT_ERRORS = [
    (lambda d: d.replace(b"UNT+3+1", b"UNT+3+7"), "UNT 0062 7 does not match UNH 0062 1"),
    (lambda d: d.replace(b"UNT+3+1", b"UNT+9+1"), "UNT says 9 segments, message 1 has 3"),
    (lambda d: d.replace(b"UNZ+2+55", b"UNZ+2+56"), "UNZ 0020 56 does not match UNB"),
    (lambda d: d.replace(b"UNZ+2+55", b"UNZ+5+55"), "UNZ says 5 messages"),
    (lambda d: d[:d.index(b"UNZ")], "no UNZ trailer"),
    (lambda d: d[:d.index(b"UNT+4")], "message 2 has no UNT trailer"),
]


@pytest.mark.parametrize("change,error", EDIFACT_ERRORS)
def test_each_edifact_envelope_error_is_named(change, error):
    env = inspect(change(edifact()))
    assert any(error in text for text in env.errors), env.errors


def test_edifact_group_errors_are_named():
    data = edifact(ung=True)
    assert "UNE 0048 8 does not match UNG 0048 9" in inspect(
        data.replace(b"UNE+2+9", b"UNE+2+8")).errors
    assert any("UNE says 1 messages" in t for t in inspect(
        data.replace(b"UNE+2+9", b"UNE+1+9")).errors)


def test_the_built_in_inspectors_are_entry_points_and_others_are_not_recognised():
    assert list(get_inspectors()) == ["edifact", "x12"]
    assert inspect(b"<?xml version='1.0'?><Order/>") is None
    assert inspect(b"") is None


def test_a_segment_split_across_read_chunks_is_read_whole(monkeypatch):
    monkeypatch.setattr(segments_module, "CHUNK", 7)
    env = inspect(edifact())
    assert env.errors == [] and [s["reference"] for s in env.sets] == ["PO+1", "INV-3"]
    env = inspect(x12(groups=[("PO", "1", [("850", str(n), f"PO-{n}") for n in range(30)])]))
    assert env.errors == [] and len(env.sets) == 30


CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from b2bhub.engine.inspection import inspect_stream
start = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    env = inspect_stream(f)
seconds = time.perf_counter() - start
# ru_maxrss on Linux keeps the forking parent's peak across exec; VmHWM is this image's
hwm = next(int(line.split()[1]) for line in open("/proc/self/status")
           if line.startswith("VmHWM:"))
print(json.dumps({"sets": env.set_count, "kept": len(env.sets), "errors": env.errors[:3],
                  "seconds": seconds, "peak_kb": hwm,
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def write_big_x12(path: Path, sets: int) -> int:
    """A ~100 MB interchange of ``sets`` 850s (about 1 KB each), written in pieces."""
    lines = "".join(f"PO1*{n}*1*EA*9.99**VP*SKU-{n:08d}*XX*{'D' * 40}~\n"
                    for n in range(1, 15))
    with path.open("wb") as f:
        head = x12(sets=()).split(b"GE*")[0]
        f.write(head)
        for n in range(1, sets + 1):
            ctl = f"{n:09d}"
            f.write((f"ST*850*{ctl}~\nBEG*00*SA*PO-{n}**20261129~\n{lines}"
                     f"SE*17*{ctl}~\n").encode())
        f.write(f"GE*{sets}*101~\nIEA*1*000000101~\n".encode())
    return path.stat().st_size


def test_a_100_mb_interchange_is_inspected_under_100_mb_peak_rss(tmp_path):
    path = tmp_path / "big.edi"
    size = write_big_x12(path, 100_000)
    assert size > 100_000_000
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), root], check=True,
                         capture_output=True, text=True, env={**os.environ},
                         timeout=120).stdout
    result = json.loads(out)
    assert result["sets"] == 100_000 and result["errors"] == []
    assert result["kept"] == 10_000  # the first sets' details; all are counted
    assert result["peak_kb"] < 100 * 1024, result
