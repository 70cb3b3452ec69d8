"""The MIME entities of a received AS2 message, read without the email package's line
parser where their shape allows, into the very objects it makes.

The receiver's parse (``lib.parsing``) reads two entities per message: the message as
received (an ``application/pkcs7-mime`` body behind its headers) and the decrypted
content (a ``multipart/signed`` of the document and its signature). The email package's
``FeedParser`` reads both line by line through a Python loop, with a regular expression
compiled afresh for every boundary. ``python bench/as2_receive.py --backend postgres
--sizes 10240 --count 300``, four runs each alternated with the email package's reading
(2026-12-07, load 1.1-1.9): the receiver's protocol work ("hub-way") 3.2-5.0 ms a
message against 3.8-5.3 (0.3-1.0 ms less in each pair), the web workers' CPU a message
8.9-11.8 ms against 9.8-12.8 (less in three pairs of four).

:func:`parse` reads the header blocks with the parser's own rules (``compat32``'s
``header_source_parse``, one header per line and its continuation lines) and cuts bodies
and parts with ``str.find``: a non-multipart body as the rest of the text, a
``multipart/signed`` at its boundary lines (RFC 2046: the line break before a boundary
belongs to the boundary). It gives the email package's own result, attribute for
attribute (``tests/test_as2_mime.py`` compares both on messages pyas2lib builds and on
every irregular shape it knows), and gives None, for the email package to read it,
wherever the input is not of the plain shape it knows: line breaks other than CRLF in a
header block or a multipart (a binary or compressed part), a header line the parser
would flag, a missing or repeated boundary, blanks after one, a part without headers or
that is itself multipart or a message. None is never wrong, only slower.
"""

from __future__ import annotations

import email.message
import itertools
import re
from email import policy

__all__ = ["parse"]

_HEADER_NAME = re.compile(r"[\041-\071\073-\176]+:")
_CRLF = "\r\n"


def parse(data: bytes, factory: type[email.message.Message]):
    """The entity ``email.message_from_bytes(data, _class=factory)`` makes, or None when
    ``data`` is not of a shape read here (the caller reads it with the email package)."""
    text = data.decode("ascii", "surrogateescape")
    entity = _entity(text, 0, len(text), factory)
    if entity is None:
        return None
    msg, body_at = entity
    maintype = msg.get_content_maintype()
    if maintype == "message":
        return None
    if maintype != "multipart":
        msg._payload = text[body_at:]
        return msg
    if msg.get_content_type() != "multipart/signed" or not _crlf_only(text, body_at,
                                                                       len(text)):
        return None
    return msg if _parts(msg, text, body_at, factory) else None


def _crlf_only(text: str, start: int, end: int) -> bool:
    """Whether every line break of ``text[start:end]`` is CRLF."""
    crlf = text.count(_CRLF, start, end)
    return text.count("\r", start, end) == crlf == text.count("\n", start, end)


def _entity(text: str, start: int, end: int, factory):
    """(the entity with its headers, where its body starts) of ``text[start:end]``, or
    None. The header block ends at the first empty line; each of its lines must be a
    header the parser takes without a defect (a name and a colon, or a continuation)."""
    blank = text.find("\r\n\r\n", start, end)
    if blank < 0 or not _crlf_only(text, start, blank + 2):
        return None
    msg = factory(policy=policy.compat32)
    header: list[str] = []
    for line in text[start:blank].split(_CRLF):
        if line[:1] in (" ", "\t"):
            if not header:
                return None  # a continuation first: a defect
            header.append(line + _CRLF)
            continue
        if not _HEADER_NAME.match(line) or line.startswith("From "):
            return None  # not a header line, or an envelope line
        if header:
            msg.set_raw(*policy.compat32.header_source_parse(header))
        header = [line + _CRLF]
    msg.set_raw(*policy.compat32.header_source_parse(header))
    return msg, blank + 4


def _parts(msg, text: str, body_at: int, factory) -> bool:
    """Attach the parts of the multipart ``msg`` whose body is ``text[body_at:]``, with
    its preamble and epilogue, as the parser does; False where the shape is not the
    plain one (nothing is then kept of it)."""
    boundary = msg.get_boundary()
    cte = msg.get("content-transfer-encoding", "8bit").lower()
    if not boundary or cte not in ("7bit", "8bit", "binary"):
        return False  # the parser notes a defect
    marks = _boundary_lines(text, body_at, "--" + boundary)
    if marks is None or len(marks) < 2 or not marks[-1][2]:
        return False  # no part, or no close boundary
    first = marks[0][0]
    if first > body_at:  # a preamble: its last line break belongs to the boundary
        msg.preamble = text[body_at:first - 2]
    parts = []
    for (_s, part_at, _c), (next_at, _e, _c2) in itertools.pairwise(marks):
        entity = _entity(text, part_at, next_at, factory)
        if entity is None:
            return False
        part, its_body = entity
        if part.get_content_maintype() in ("multipart", "message"):
            return False
        if its_body > next_at - 2:
            return False  # the part's empty line is the boundary's own line break
        part._payload = text[its_body:next_at - 2]  # that line break is the boundary's
        parts.append(part)
    msg.epilogue = text[marks[-1][1]:]  # after the close boundary's line break
    msg._payload = None
    for part in parts:
        msg.attach(part)
    return True


def _boundary_lines(text: str, start: int, separator: str):
    """The boundary lines of ``text[start:]`` up to the close boundary, as (where the
    line starts, where the next line starts, closing); None when a line starts with the
    separator and has more on it than ``--`` (blanks, which the parser also takes for
    a boundary, or anything else, which makes it a body's line). A boundary right after
    another makes an empty part, which :func:`_entity` leaves to the email package."""
    marks = []
    at = text.find(separator, start)
    while at >= 0:
        if at == start or text[at - 2:at] == _CRLF:
            end = text.find(_CRLF, at)
            line = text[at + len(separator):end if end >= 0 else len(text)]
            closing = line.startswith("--")
            if line[2 if closing else 0:]:
                return None  # more on its line: blanks (a boundary) or not (a body's)
            marks.append((at, end + 2 if end >= 0 else len(text), closing))
            if closing:
                return marks
        at = text.find(separator, at + 1)
    return marks
