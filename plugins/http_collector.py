"""The ``http_collector`` source: GETs a URL on a schedule (SPEC 9, seed 003).

Every ``polling_interval`` seconds, under the scan lease of scheduled sources (one
process fetches an instance at a time, as the file poller scans), it GETs ``url`` with
the configured ``headers`` and the same authentication and TLS choices as
``http_poster`` (:data:`plugins.http_poster.AUTH_FIELDS`, one ``requests.Session`` per
process). The request is conditional: the ``ETag`` and ``Last-Modified`` of the last
answer that became a message go out as ``If-None-Match`` / ``If-Modified-Since``, and
they are kept in the instance's source state (a row of the settings table), so a
restart does not fetch the same document into a second message. An answer of 304, or
204 (nothing to collect), makes no message; a 2xx with a body is streamed into the
payload store and becomes one message from ``from`` to ``to``, named ``filename`` (else
the last element of the URL's path). A peer that sends neither validator gets each
answer taken as new.

The state is saved just after the message commits: a crash in between fetches the
document once more at the next scan (a second message, never a lost one).

A failed fetch (no connection, no answer within ``timeout``, a non-2xx other than 304,
an answer that breaks off) goes to ``SourceContext.record_collection_error``: a message
in status Collection error from ``from`` to ``to``, with no payload and no deliveries,
the reason as its status text and the start of the answer in its history, and the
``message_failed`` alert, listed apart from delivery errors (seed 003 ERRO_COLETA).
A server that stays down makes one such message per failure episode, not one per poll:
the later failed fetches are counted on it (a history line when the reason changes,
else at most one an hour) until a fetch succeeds again, which ends the episode with a
line and resolves its alert (``b2bhub.engine.collection``). The reason names the status
or the connection's failure, never the answer's text, so that a body that changes at
every poll is no new reason.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import unquote, urlsplit

import requests

from b2bhub.plugin import (
    RECORD_AT_ONCE,
    Plugin,
    PluginStartError,
    SourceContext,
    validate_name,
)
from b2bhub.plugin.schema import Field
from plugins.http_poster import (
    AUTH_FIELDS,
    auth_problems,
    body_start_text,
    connection_problem,
    headers_problem,
    make_session,
    url_problem,
)

log = logging.getLogger(__name__)
CHUNK = 1 << 20


class CollectionFailed(Exception):
    """A fetch that got no document: why, and the start of the answer if there was one."""

    def __init__(self, reason: str, answer_start: str = "", error_class: str = "connection"):
        super().__init__(f"{reason}: {answer_start}" if answer_start else reason)
        self.reason, self.answer_start = reason, answer_start
        self.error_class = error_class  # the retry policy's rules: timeout, http_503...


class _Body:
    """A response body as a file the payload store reads, chunk by chunk."""

    def __init__(self, response: requests.Response):
        self._chunks = response.iter_content(CHUNK)
        self._rest = b""

    def read(self, size: int = -1) -> bytes:
        out = [self._rest]
        have = len(self._rest)
        while size < 0 or have < size:
            chunk = next(self._chunks, b"")
            if not chunk:
                break
            out.append(chunk)
            have += len(chunk)
        data = b"".join(out)
        if size < 0:
            self._rest = b""
            return data
        self._rest = data[size:]
        return data[:size]


class HttpCollector(Plugin):
    """Fetches a document over HTTP(S) on a schedule; see the module docstring."""

    type_name = "http_collector"
    roles = frozenset({"source"})
    #: SPEC 9: a failed fetch is a Collection error at once; an instance's retry policy
    #: may try again first (error classes connection, timeout, http_<status>)
    collection_retry_policy = RECORD_AT_ONCE
    description = "GETs a URL on a schedule and makes a message of each new answer."
    config_schema = [
        Field("url", "string", label="URL", required=True, validate=url_problem,
              help="the document fetched, e.g. https://erp.example.com/outbound/orders"),
        Field("polling_interval", "integer", label="Polling interval (seconds)",
              default=60, min=1, max=86400,
              help="seconds between two fetches"),
        Field("timeout", "number", label="Timeout (seconds)", default=30, min=0.1, max=3600,
              help="seconds to wait for the connection, and for each read of the answer"),
        Field("headers", "json", label="Request headers (JSON)",
              default={}, validate=headers_problem,
              help='fixed extra headers, a JSON object such as {"Accept": "text/xml"}'),
        Field("from", "string", label="From party", required=True, validate=validate_name,
              help="the party the document comes from"),
        Field("to", "string", label="To party", required=True, validate=validate_name,
              help="the party the document is for"),
        Field("filename", "string", label="File name", default="",
              help="the messages' original file name; empty: the URL path's last part"),
        *AUTH_FIELDS,
    ]

    @classmethod
    def config_problems(cls, config: dict[str, Any]) -> dict[str, str]:
        return auth_problems(config)

    def __init__(self, instance_name: str, config: dict[str, Any]):
        super().__init__(instance_name, config)
        self.url = config["url"]
        self.timeout = float(config.get("timeout") or 30)
        self.headers = dict(config.get("headers") or {})
        self.filename = config.get("filename") or _last_part(self.url)
        self._session: requests.Session | None = None

    def start(self) -> None:
        if not self.config.get("from") or not self.config.get("to"):
            raise PluginStartError("an http_collector needs from and to")

    @property
    def session(self) -> requests.Session:
        if self._session is None:
            self._session = make_session(self.config)
        return self._session

    def poll(self, context: SourceContext) -> None:
        """One conditional GET; a message if the answer is a new document, a collection
        error if the fetch failed."""
        try:
            seen = self._fetch(context, context.load_state())
        except CollectionFailed as exc:
            log.warning("%s: %s", self.instance_name, exc)
            context.record_collection_error(exc.reason, self.config["from"],
                                            self.config["to"], answer_start=exc.answer_start,
                                            filename=self.filename, error_class=exc.error_class)
            return
        context.collection_succeeded()
        if seen is not None:
            context.save_state(seen)

    def _fetch(self, context: SourceContext, state: dict) -> dict | None:
        """The GET, and the message of a new document; the validators of the answer
        that made one (to keep), None when it made none."""
        headers = dict(self.headers)
        if state.get("etag"):
            headers["If-None-Match"] = state["etag"]
        if state.get("last_modified"):
            headers["If-Modified-Since"] = state["last_modified"]
        try:
            response = self.session.get(self.url, headers=headers, stream=True,
                                        timeout=self.timeout, allow_redirects=False)
        except requests.Timeout as exc:
            raise CollectionFailed(f"no answer from {self.url} within {self.timeout:g} s",
                                   error_class="timeout") from exc
        except requests.RequestException as exc:
            raise CollectionFailed(connection_problem(exc, self.url)) from exc
        with response:
            if response.status_code in (204, 304):
                return None
            if not 200 <= response.status_code < 300:
                raise CollectionFailed(
                    f"GET {self.url} answered {response.status_code} {response.reason}",
                    body_start_text(_start_of(response)), f"http_{response.status_code}")
            seen = {"etag": response.headers.get("ETag") or "",
                    "last_modified": response.headers.get("Last-Modified") or ""}
            try:
                context.store_and_dispatch(_Body(response), self.config["from"],
                                           self.config["to"], self.filename)
            except requests.RequestException as exc:  # the body broke off or stalled
                raise CollectionFailed(f"the answer from {self.url} broke off: "
                                       f"{type(exc).__name__}") from exc
        return seen


def _start_of(response: requests.Response) -> bytes:
    """The first bytes of an error answer; what could be read if it stalls or breaks."""
    try:
        return response.raw.read(2048, decode_content=True) or b""
    except Exception:  # a read timeout or a broken connection: the status says enough
        return b""


def _last_part(url: str) -> str:
    path = urlsplit(url).path.rstrip("/")
    return unquote(path.rsplit("/", 1)[-1]) if path else ""
