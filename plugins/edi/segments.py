"""A streaming segment reader shared by the X12 and EDIFACT inspectors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

CHUNK = 1 << 16
#: a segment longer than this is not an envelope the inspectors can read
MAX_SEGMENT = 1 << 20


def segments(stream: IO[bytes], terminator: bytes, head: bytes = b"",
             release: bytes | None = None) -> Iterator[bytes]:
    """Each segment of ``stream`` (after ``head``, bytes already read from it), without
    its terminator and with the line breaks and spaces before it stripped. A
    terminator preceded by an odd number of ``release`` characters is data."""
    rest, chunk = b"", head
    while chunk:
        parts = (rest + chunk).split(terminator)
        rest = parts.pop()
        if len(rest) > MAX_SEGMENT:
            raise ValueError(f"a segment longer than {MAX_SEGMENT} bytes")
        if release is not None and release in chunk:
            parts, rest = _rejoin(parts, rest, terminator, release)
        for part in parts:
            yield part.lstrip()
        chunk = stream.read(CHUNK)
    rest = rest.strip()
    if rest:
        yield rest


def _rejoin(parts: list[bytes], rest: bytes, terminator: bytes, release: bytes
            ) -> tuple[list[bytes], bytes]:
    out: list[bytes] = []
    carry: bytes | None = None
    for part in parts + [rest]:
        part = part if carry is None else carry + terminator + part
        carry = None
        if _released(part, release):
            carry = part
        else:
            out.append(part)
    if carry is not None:
        return out, carry
    return out[:-1], out[-1]


def _released(part: bytes, release: bytes) -> bool:
    n = len(part) - len(part.rstrip(release))
    return n % 2 == 1
