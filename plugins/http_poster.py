"""The ``http_poster`` target: POSTs a message's payload stage to a URL (SPEC 9, seed 002).

Each request carries, besides the configured ``headers``:

* ``Date``, ``Content-Type`` (the configured one, else guessed from the message's
  original file name, else ``application/octet-stream``) and ``Content-Length``;
* ``X-B2BHub-Message-Id``, ``-Source``, ``-From``, ``-To``, ``-Attempt``,
  ``-Original-Message-Id`` and ``-Correlation-Id`` (the last two when the message has
  them) and ``X-B2BHub-Callback-Url`` (the capability URL of receipts by callback);
* ``X-Correlation-Id`` (the message's correlation id, when it has one), and when traces
  are on (:mod:`b2bhub.observability.tracing`) a W3C ``traceparent`` naming this attempt's span in
  the message's trace (set by the requests instrumentation);
* ``Idempotency-Key``: the same on every attempt of one delivery
  (:mod:`b2bhub.domain.callbacks`), so a destination can drop a repeat;
* with a ``signing_secret`` (``whsec_`` and base64, as Standard Webhooks has it), the
  Standard Webhooks headers ``webhook-id`` (the idempotency key), ``webhook-timestamp``
  and ``webhook-signature``. The signature is the package's algorithm computed while
  reading the payload once before it is sent (its ``sign`` wants the body as text in
  memory, which a 200 MB payload must never be).

The body is streamed from the payload store with its Content-Length; each instance keeps
one ``requests.Session`` per worker process, so connections are reused.

What an answer means:

* 2xx: delivered; with ``accepted_means: awaiting_receipt`` a 202 leaves the delivery
  Awaiting receipt until the destination POSTs ``{"result": "completed"|"failed",
  "text": ...}`` to the callback URL or ``receipt_timeout`` passes;
* 5xx, 408, 425, 429: an error of class ``http_<status>`` (``http_503``, ``http_429``;
  a retry rule for ``http_5xx`` matches every 5xx) that the retry policy retries, at
  the time ``Retry-After`` names
  (seconds or an HTTP date) when there is one, never later than the policy's max delay;
* no answer within ``timeout``: class ``timeout``; a connection refused, reset or
  broken: class ``connection``;
* any other status (3xx when ``follow_redirects`` is off, naming the Location; 400,
  404, ...): failed at once.

Every attempt's history line has the status, the time the attempt took and the start of
the answer's body (at most :data:`TEXT_BODY_LIMIT` bytes, undecodable bytes replaced).
The answer (status, up to ``ANSWER_BODY_LIMIT`` of its body, content type) travels with
every outcome for the instance's business-error rules.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import mimetypes
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime, parsedate_to_datetime
from typing import IO, Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from b2bhub.plugin import (
    ANSWER_BODY_LIMIT,
    N_,
    Answer,
    DeliveryInfo,
    Outcome,
    OutcomeKind,
    PayloadError,
    PayloadReader,
    Plugin,
    TargetContext,
)
from b2bhub.plugin.schema import Field

STAGES = ("raw", "unpacked", "sent")
#: how much of an answer's body a history line shows, at most
TEXT_BODY_LIMIT = 2048
RETRIED_STATUSES = frozenset({408, 425, 429})
CHUNK = 1 << 20
SECRET_PREFIX = "whsec_"


def url_problem(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return N_("must be an http:// or https:// URL")
    return None


def _optional_url_problem(value: str) -> str | None:
    return url_problem(value) if value else None


def headers_problem(value: Any) -> str | None:
    if not isinstance(value, dict):
        return N_('must be a JSON object of header names and values, e.g. {"X-Api": "1"}')
    for name, text in value.items():
        if not name or not isinstance(text, str) or any(c in name for c in " :\r\n"):
            return N_("header %(name)r: a name without spaces or colons and a text value",
                      name=name)
        if "\r" in text or "\n" in text:
            return N_("header %(name)r: the value must be one line", name=name)
    return None


def _signing_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (``whsec_`` and base64)."""
    if secret.startswith(SECRET_PREFIX):
        secret = secret[len(SECRET_PREFIX):]
    return base64.b64decode(secret + "==", validate=False)


def _secret_problem(value: str) -> str | None:
    try:
        key = _signing_key(value)
    except (binascii.Error, ValueError):
        return N_("must be whsec_ followed by base64 (a Standard Webhooks secret)")
    return None if len(key) >= 16 else N_("must hold at least 16 bytes (24 base64 "
                                          "characters)")


#: how the hub authenticates to an HTTP peer and verifies it; shared by the HTTP plugins
AUTH_FIELDS = [
    Field("auth", "choice", label="Authentication",
          default="none", choices=("none", "basic", "bearer"),
          help="how the hub authenticates to the HTTP peer"),
    Field("username", "string", label="User name", default="", help="for basic authentication"),
    Field("password", "secret", label="Password", default="", help="for basic authentication"),
    Field("token", "secret", label="Bearer token", default="", help="for bearer authentication"),
    Field("client_cert", "path", label="Client certificate (PEM file)", default="",
          help="client certificate (PEM) for mutual TLS; may hold the key too"),
    Field("client_key", "path", label="Client key (PEM file)", default="",
          help="the client certificate's private key (PEM), if not in client_cert"),
    Field("ca_bundle", "path", label="CA bundle (PEM file)", default="",
          help="CA certificates (PEM) to verify the HTTP peer; empty: the system's"),
]


def auth_problems(config: dict[str, Any]) -> dict[str, str]:
    """What is missing from the :data:`AUTH_FIELDS` of a configuration."""
    problems = {}
    if config["auth"] == "basic" and not config["username"]:
        problems["username"] = N_("basic authentication needs a username")
    if config["auth"] == "bearer" and not config["token"]:
        problems["token"] = N_("bearer authentication needs a token")
    if config["client_key"] and not config["client_cert"]:
        problems["client_cert"] = N_("a client key needs its client certificate")
    return problems


class HttpPoster(Plugin):
    """POSTs each message to a URL; see the module docstring."""

    type_name = "http_poster"
    roles = frozenset({"target"})
    description = "POSTs each message to an HTTP(S) URL."
    # A worker claims up to 16 due deliveries at once and posts them one after the
    # other (bench/http_post.py: 2.6 ms of CPU per delivery against 9.0 ms claiming one
    # at a time, and 124 against 45 deliveries/s on the same loaded machine). Max
    # Concurrent Deliveries still caps the leases across workers; a destination that
    # hangs holds a batch for up to 16 x timeout, its leases renewed meanwhile.
    claim_batch = 16
    config_schema = [
        Field("url", "string", label="URL", required=True, validate=url_problem,
              help="the destination, e.g. https://erp.example.com/inbound"),
        Field("payload_stage", "choice", label="Payload stage", default="unpacked", choices=STAGES,
              help="which recorded stage of the message is posted"),
        Field("timeout", "number", label="Timeout (seconds)", default=30, min=0.1, max=3600,
              help="seconds to wait for the connection, and for each read of the answer"),
        Field("headers", "json", label="Request headers (JSON)",
              default={}, validate=headers_problem,
              help='fixed extra headers, a JSON object such as {"X-Api-Version": "2"}'),
        Field("content_type", "string", label="Content-Type", default="",
              help="empty: guessed from the message's file name, else "
                   "application/octet-stream"),
        *AUTH_FIELDS,
        Field("follow_redirects", "boolean", label="Follow redirects", default=False,
              help="follow 3xx answers; when off a 3xx fails the delivery"),
        Field("signing_secret", "secret", label="Signing secret",
              default="", validate=_secret_problem,
              help="sign each request with Standard Webhooks headers (whsec_...)"),
        Field("accepted_means", "choice", label="An accepted answer means", default="delivered",
              choices=("delivered", "awaiting_receipt"),
              help="what a 202 Accepted means: delivered, or awaiting the destination's "
                   "callback to the X-B2BHub-Callback-Url"),
        Field("receipt_timeout", "integer", label="Receipt timeout (seconds)", default=86400, min=1,
              help="seconds a delivery waits for its callback before it fails"),
        Field("probe_url", "string", label="Probe URL", default="", validate=_optional_url_problem,
              help="a URL whose 2xx says the destination is online; empty: no probe"),
        Field("probe_method", "choice", label="Probe method",
              default="HEAD", choices=("HEAD", "GET"),
              help="the probe's request method"),
    ]

    @classmethod
    def config_problems(cls, config: dict[str, Any]) -> dict[str, str]:
        return auth_problems(config)

    def __init__(self, instance_name: str, config: dict[str, Any]):
        super().__init__(instance_name, config)
        self.url = config["url"]
        self.stage = config.get("payload_stage") or "unpacked"
        self.timeout = float(config.get("timeout") or 30)
        self.content_type = config.get("content_type") or ""
        self.follow = bool(config.get("follow_redirects"))
        self.awaits = config.get("accepted_means") == "awaiting_receipt"
        self.receipt_timeout = int(config.get("receipt_timeout") or 86400)
        secret = config.get("signing_secret") or ""
        self.signing_key = _signing_key(secret) if secret else None
        self._session: requests.Session | None = None

    @property
    def session(self) -> requests.Session:
        """The instance's session in this process, made at first use."""
        if self._session is None:
            self._session = make_session(self.config)
        return self._session

    # --- deliver ------------------------------------------------------------------------

    def deliver(self, delivery: DeliveryInfo, payload: PayloadReader,
                context: TargetContext) -> Outcome:
        """POST the stage; the outcome its answer (or its lack of one) means."""
        if self.stage not in payload.stages():
            return Outcome.failed(f"the message has no '{self.stage}' payload stage")
        headers = self._headers(delivery, context, payload.size(self.stage))
        started = time.monotonic()
        try:
            response = self._post(payload, headers, context)
        except (PayloadError, requests.RequestException) as exc:
            return self._unanswered(exc, started)
        with response:
            return self._answered(response, started, context)

    def _post(self, payload: PayloadReader, headers: dict[str, str],
              context: TargetContext) -> requests.Response:
        if self.signing_key is not None:
            headers.update(self._signature(headers["Idempotency-Key"], context.now, payload))
        with _Body(payload, self.stage) as body:
            context.wire_started()
            return self.session.post(self.url, data=body, headers=headers,
                                     timeout=self.timeout, allow_redirects=self.follow,
                                     stream=True)

    def _unanswered(self, exc: Exception, started: float) -> Outcome:
        """The outcome of a request that got no answer: its error class and why."""
        unreadable = exc if isinstance(exc, PayloadError) else exc.__context__
        if isinstance(unreadable, PayloadError):
            return Outcome.error("payload", f"could not read the payload: {unreadable}")
        if isinstance(exc, requests.Timeout):
            return Outcome.error("timeout", f"no answer within {self.timeout:g} s "
                                 f"(after {_took(started)})")
        if isinstance(exc, requests.TooManyRedirects):
            return Outcome.failed(f"too many redirects after {_took(started)}: {exc}")
        if isinstance(exc, requests.ConnectionError | requests.exceptions.ChunkedEncodingError):
            return Outcome.error("connection", f"{connection_problem(exc, self.url)} "
                                 f"(after {_took(started)})")
        return Outcome.failed(f"the request could not be made: {exc}")

    def _headers(self, delivery: DeliveryInfo, context: TargetContext,
                 size: int) -> dict[str, str]:
        key = getattr(context, "idempotency_key", None) or f"b2bhub-{delivery.delivery_id}"
        headers = {str(k): str(v) for k, v in (self.config.get("headers") or {}).items()}
        headers.update({
            "Date": format_datetime(context.now.replace(tzinfo=UTC), usegmt=True),
            "Content-Type": self.content_type or _guessed_type(delivery.original_filename),
            "Content-Length": str(size),
            "Idempotency-Key": key,
            "X-B2BHub-Message-Id": str(delivery.message_id),
            "X-B2BHub-Source": delivery.source,
            "X-B2BHub-From": delivery.from_party,
            "X-B2BHub-To": delivery.to_party,
            "X-B2BHub-Attempt": str(delivery.attempt),
        })
        if delivery.external_id:
            headers["X-B2BHub-Original-Message-Id"] = _one_line(delivery.external_id)
        if delivery.correlation_id:
            headers["X-B2BHub-Correlation-Id"] = _one_line(delivery.correlation_id)
            headers["X-Correlation-Id"] = headers["X-B2BHub-Correlation-Id"]
        callback = getattr(context, "callback_url", None)
        if callback:
            headers["X-B2BHub-Callback-Url"] = callback
        return headers

    def _signature(self, webhook_id: str, now: datetime,
                   payload: PayloadReader) -> dict[str, str]:
        """The Standard Webhooks headers: HMAC-SHA256 of ``id.timestamp.body``, the
        body read in chunks."""
        timestamp = str(int(now.replace(tzinfo=UTC).timestamp()))
        mac = hmac.new(self.signing_key, f"{webhook_id}.{timestamp}.".encode(),
                       hashlib.sha256)
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        with payload.open(self.stage) as stream:
            while count := stream.readinto(buffer):
                mac.update(view[:count])
        signature = base64.b64encode(mac.digest()).decode()
        return {"webhook-id": webhook_id, "webhook-timestamp": timestamp,
                "webhook-signature": f"v1,{signature}"}

    def _answered(self, response: requests.Response, started: float,
                  context: TargetContext) -> Outcome:
        """The outcome of an answer, carrying it for the business-error rules."""
        body, cut = _read_start(response)
        status, shown = response.status_code, body_start_text(body)
        head = f"HTTP {status} {response.reason or ''}".rstrip() + f" in {_took(started)}"
        text = head + (f": {shown}" if shown else "") + (f" ({cut})" if cut else "")
        answer = Answer(status, body, response.headers.get("Content-Type", ""),
                        tuple(response.headers.items()))
        return self._by_status(response, head, text, context).with_answer(answer)

    def _by_status(self, response: requests.Response, head: str, text: str,
                   context: TargetContext) -> Outcome:
        status = response.status_code
        if status == 202 and self.awaits:
            ref = getattr(context, "receipt_ref", None) or "callback"
            deadline = context.now + timedelta(seconds=self.receipt_timeout)
            return Outcome.awaiting_receipt(ref, deadline, text=f"{text}; accepted, awaiting "
                                            "the destination's callback")
        if 200 <= status < 300:
            return Outcome.delivered(text, status=status)
        if status >= 500 or status in RETRIED_STATUSES:
            return Outcome(OutcomeKind.ERROR, text, error_class=f"http_{status}",
                           retry_at=_retry_after(response, context.now),
                           data={"status": status})
        if 300 <= status < 400:
            where = response.headers.get("Location") or "no Location"
            return Outcome.failed(f"{head}: redirect to {_one_line(where)} not followed "
                                  "(follow_redirects is off)", status=status)
        return Outcome.failed(text, status=status)

    # --- probe --------------------------------------------------------------------------

    def probe(self) -> bool | None:
        """True when ``probe_url`` answers 2xx, False on any other answer or none; None
        without a probe URL. Same session, authentication and TLS settings as the
        deliveries; the answer's body is not read."""
        url = self.config.get("probe_url") or ""
        if not url:
            return None
        try:
            with self.session.request(self.config.get("probe_method") or "HEAD", url,
                                      timeout=self.timeout,
                                      allow_redirects=self.follow, stream=True) as answer:
                return 200 <= answer.status_code < 300
        except requests.RequestException:
            return False


class _Body:
    """The payload stage as a request body of known length: requests sends it in chunks
    with this Content-Length instead of reading it into memory. A redirect that sends
    the body again rewinds it (``seek(0)``), which opens the stage anew."""

    def __init__(self, payload: PayloadReader, stage: str):
        self._payload, self._stage = payload, stage
        self._size = payload.size(stage)
        self._stream: IO[bytes] | None = None
        self._position = 0

    def __enter__(self) -> _Body:
        self._stream = self._payload.open(self._stage)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def __len__(self) -> int:
        return self._size

    def __iter__(self):
        while chunk := self.read(CHUNK):
            yield chunk

    def read(self, size: int = -1) -> bytes:
        chunk = self._stream.read(CHUNK if size is None or size < 0 else size)
        self._position += len(chunk)
        return chunk

    def tell(self) -> int:
        return self._position

    def seek(self, position: int, whence: int = 0) -> int:
        if (position, whence) != (0, 0):
            raise OSError("a payload body can only be rewound to its start")
        self.close()
        self._stream, self._position = self._payload.open(self._stage), 0
        return 0


def make_session(config: dict[str, Any]) -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # no proxy or .netrc from the environment: the config says
    adapter = HTTPAdapter(pool_connections=1, pool_maxsize=4, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    if config.get("auth") == "basic":
        session.auth = (config.get("username") or "", config.get("password") or "")
    elif config.get("auth") == "bearer":
        session.headers["Authorization"] = f"Bearer {config.get('token') or ''}"
    if config.get("client_cert"):
        session.cert = ((config["client_cert"], config["client_key"])
                        if config.get("client_key") else config["client_cert"])
    if config.get("ca_bundle"):
        session.verify = config["ca_bundle"]
    return session


def _read_start(response: requests.Response) -> tuple[bytes, str]:
    """Up to ANSWER_BODY_LIMIT of the answer's body, and why it stopped short if it did
    (the status decides the outcome even when the rest of the body never came)."""
    parts, size = [], 0
    try:
        for chunk in response.iter_content(64 * 1024):
            parts.append(chunk)
            size += len(chunk)
            if size >= ANSWER_BODY_LIMIT:
                break
    except requests.RequestException as exc:
        return b"".join(parts)[:ANSWER_BODY_LIMIT], f"answer body cut short: {_reason(exc)}"
    return b"".join(parts)[:ANSWER_BODY_LIMIT], ""


def body_start_text(body: bytes) -> str:
    """The start of a body for a history line: at most TEXT_BODY_LIMIT bytes, decoded
    with replacement, control characters but tab and newline replaced."""
    text = body[:TEXT_BODY_LIMIT].decode("utf-8", "replace")
    text = "".join(c if c.isprintable() or c in "\t\n" else "\ufffd" for c in text).strip()
    return text + ("..." if len(body) > TEXT_BODY_LIMIT else "")


def _retry_after(response: requests.Response, now: datetime) -> datetime | None:
    """The moment a Retry-After header names (seconds or an HTTP date), naive UTC."""
    value = (response.headers.get("Retry-After") or "").strip()
    if not value:
        return None
    if value.isdigit():
        return now + timedelta(seconds=int(value))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).replace(tzinfo=None)


def _guessed_type(filename: str | None) -> str:
    guessed = mimetypes.guess_type(filename)[0] if filename else None
    return guessed or "application/octet-stream"


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


def _took(started: float) -> str:
    return f"{time.monotonic() - started:.3f} s"


def connection_problem(exc: Exception, url: str) -> str:
    parts = urlsplit(url)
    where = parts.netloc or url
    return f"connection to {where} failed: {_reason(exc)}"


def _reason(exc: BaseException) -> str:
    """The innermost useful words of a requests/urllib3 exception."""
    inner = exc
    for _ in range(6):
        nxt = getattr(inner, "reason", None) or (inner.args[0] if inner.args else None)
        if isinstance(nxt, BaseException):
            inner = nxt
            continue
        break
    text = str(inner)
    if ": " in text and text.startswith("<"):  # urllib3's "<Connection object>: reason"
        text = text.split(": ", 1)[1]
    return text or type(inner).__name__
