"""A trading partner simulated with pyas2lib, run as a separate process on loopback.

``python -m tests.as2_partner CONFIG.json`` serves, on the port it prints:

* ``POST /as2``: AS2 messages from the hub, answered with a sync MDN, or 200 and an
  async MDN posted afterwards to the URL the hub asked for (per the request headers),
  signed when the hub asked for a signed one. ``GET /received`` lists them.
* ``POST /send`` (JSON): builds a message to the hub with the given choices, posts it,
  verifies a sync MDN and its MIC; async MDNs come back to ``POST /mdn`` and are verified
  there (``GET /mdns``). Quirks on request: ``micalg`` spelled ``sha-256`` in the
  signed-receipt options, async MDNs without Original-Recipient, MDNs signed with
  another key than the partner's (``mdn_signer``: cert and key).

With ``tls`` (cert, key, and ``client_ca`` to require a client certificate it issued)
it serves HTTPS instead; the handshake runs on each request's thread.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests
from pyas2lib import Mdn, Message, Organization, Partner

CONFIG: dict = {}
RECEIVED: list[dict] = []
MDNS: list[dict] = []
SENT: dict[str, Message] = {}
HELD: list[tuple] = []
LOCK = threading.Lock()


def org(mdn_url=None) -> Organization:
    key = (CONFIG["key"] + CONFIG["cert"]).encode()
    signer = CONFIG.get("mdn_signer")  # an MDN signed with a key the hub does not know
    sign = (signer["key"] + signer["cert"]).encode() if signer else key
    return Organization(as2_name=CONFIG["as2_id"], sign_key=sign, decrypt_key=key,
                        mdn_url=mdn_url, domain="acme.example")  # its Message-IDs


def hub(**choices) -> Partner:
    return Partner(as2_name=CONFIG["hub_as2_id"], verify_cert=CONFIG["hub_cert"].encode(),
                   encrypt_cert=CONFIG["hub_cert"].encode(), validate_certs=False, **choices)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _body(self) -> bytes:
        if CONFIG.get("content_length_only"):
            # as a WSGI stack that reads by Content-Length alone: a chunked body reads
            # as empty (and the connection is not reused, the chunks being unread)
            self.close_connection = True
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            if CONFIG.get("refuse_chunked"):
                return None
            parts = []
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reply(self, status: int, body: bytes = b"", headers: dict | None = None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            if k.lower() not in ("content-length", "transfer-encoding"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, data) -> None:
        self._reply(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

    def do_GET(self):
        with LOCK:
            self._json(RECEIVED if self.path == "/received" else MDNS)

    def do_POST(self):
        body = self._body()
        if body is None:
            self._reply(411, b"chunked transfer encoding is not taken here")
            return
        raw = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items()).encode() \
            + b"\r\n" + body
        if self.path == "/as2":
            self._receive(raw)
        elif self.path == "/mdn":
            self._mdn(raw)
        elif self.path == "/send":
            self._json(send(json.loads(body)))
        elif self.path == "/busy":
            self._reply(503, b"busy")
        elif self.path == "/release":
            with LOCK:
                held = HELD[:]
                HELD.clear()
            for job in held:
                _post_mdn(*job)
            self._json({"posted": len(held)})
        elif self.path == "/config":
            CONFIG.update(json.loads(body))
            self._json({"ok": True})
        else:
            self._reply(404)

    def _receive(self, raw: bytes) -> None:
        message = Message()
        status, (exc, _tb), mdn = message.parse(
            raw, find_org_cb=lambda _i: org(), find_partner_cb=lambda _i: hub())
        with LOCK:
            RECEIVED.append({"message_id": message.message_id, "status": status,
                             "error": repr(exc) if exc else None,
                             "content": base64.b64encode(message.content or b"").decode()
                             if status == "processed" else None,
                             "signed": message.signed, "encrypted": message.encrypted,
                             "compressed": message.compressed,
                             "wire": base64.b64encode(raw).decode(),
                             "chunked": self.headers.get("Transfer-Encoding", "").lower()
                             == "chunked"})
        mdn = _quirk(message, mdn)
        if mdn is None:
            self._reply(200, b"ok")
        elif mdn.mdn_mode == "SYNC":
            headers = dict(mdn.headers)
            if CONFIG.get("micalg_dash") and "micalg=" in headers.get("Content-Type", ""):
                headers["Content-Type"] = headers["Content-Type"].replace(
                    "micalg=sha256", "micalg=sha-256")
            content = mdn.content
            if CONFIG.get("mdn_quirk") == "bad_signature":  # the signed report altered
                content = content.replace(b"MDN-sent-automatically", b"MDN-sent-automaticallY", 1)
            self._reply(200, content, headers)
        else:
            self._reply(200, b"ok")
            content = mdn.content
            if CONFIG.get("async_no_original_recipient"):
                content = _drop_original_recipient(mdn)
            job = (mdn.mdn_url, dict(mdn.headers), content)
            if CONFIG.get("hold_async"):
                with LOCK:
                    HELD.append(job)
            else:
                threading.Thread(target=_post_mdn, args=job, daemon=True).start()

    def _mdn(self, raw: bytes) -> None:
        result = Mdn().parse(raw, lambda mid, _r: SENT.get(mid))
        with LOCK:
            MDNS.append({"status": result[0], "detail": result[1],
                         "wire": base64.b64encode(raw).decode()})
        self._reply(200, b"ok")


def _quirk(message, mdn):
    """The MDN built again as a partner may get it wrong (``mdn_quirk``): no
    Received-Content-MIC, a MIC that differs, a negative disposition."""
    quirk = CONFIG.get("mdn_quirk")
    if mdn is None or quirk not in ("no_mic", "wrong_mic", "negative"):
        return mdn
    status, detail = "processed", None
    if quirk == "no_mic":
        message.mic = None
    elif quirk == "wrong_mic":
        message.mic = base64.b64encode(b"\0" * 32)
    else:
        status, detail = "processed/Error", "decryption-failed"
    again = Mdn(mdn_mode=mdn.mdn_mode, mdn_url=mdn.mdn_url, digest_alg=mdn.digest_alg)
    again.build(message, status, detail)
    return again


def _drop_original_recipient(mdn) -> bytes:
    """An unsigned MDN without Original-Recipient (some partners send it so)."""
    return b"\r\n".join(line for line in mdn.content.split(b"\r\n")
                        if not line.startswith(b"Original-Recipient"))


def _post_mdn(url: str, headers: dict, content: bytes) -> None:
    try:
        requests.post(url, data=content, headers=headers, timeout=30)
    except requests.RequestException:
        pass


def send(order: dict) -> dict:
    mode = order.get("mdn_mode")
    receiver = hub(sign=order.get("sign", False), encrypt=order.get("encrypt", False),
                   compress=order.get("compress", False),
                   enc_alg=order.get("enc_alg", "aes_256_cbc"),
                   digest_alg=order.get("digest_alg", "sha256"),
                   sign_alg=order.get("sign_alg", "rsassa_pkcs1v15"),
                   mdn_mode={"sync": "SYNC", "async": "ASYNC"}.get(mode),
                   mdn_digest_alg="sha256" if order.get("mdn_signed") else None)
    message = Message(org(CONFIG["url"] + "/mdn"), receiver)
    message.build(base64.b64decode(order["data"]), filename=order.get("filename"),
                  content_type="application/edi-x12", message_id=order.get("message_id"))
    headers = dict(message.headers)
    if order.get("micalg_dash") and "disposition-notification-options" in headers:
        headers["disposition-notification-options"] = headers[
            "disposition-notification-options"].replace("sha256", "sha-256")
    SENT[message.message_id] = message
    answer = requests.post(order["hub_url"], data=message.content, headers=headers,
                           timeout=30)
    result = {"http_status": answer.status_code, "message_id": message.message_id,
              "text": answer.text if not answer.headers.get("Content-Type", "").startswith(
                  "multipart") else "", "mdn_status": None}
    if mode == "sync" and answer.headers.get("Content-Type", "").startswith("multipart"):
        raw = "".join(f"{k}: {v}\r\n" for k, v in answer.headers.items()).encode() \
            + b"\r\n" + answer.content
        mdn = Mdn()
        status, detail = mdn.parse(raw, lambda mid, _r: SENT.get(mid))
        result.update(mdn_status=status, mdn_detail=detail,
                      mdn_wire=base64.b64encode(raw).decode(),
                      mdn_signed=answer.headers["Content-Type"].startswith("multipart/signed"))
    return result


class TlsServer(ThreadingHTTPServer):
    """HTTPS: each accepted connection wrapped, its handshake on the request's thread
    (a client that fails it fails alone)."""

    context: ssl.SSLContext

    def get_request(self):
        sock, address = super().get_request()
        return self.context.wrap_socket(sock, server_side=True,
                                        do_handshake_on_connect=False), address

    def handle_error(self, request, client_address):  # refused handshakes: expected
        pass


def _tls_context(tls: dict) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "server.pem")
        with open(path, "w") as f:
            f.write(tls["key"] + tls["cert"])
        context.load_cert_chain(path)
    if tls.get("client_ca"):
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=tls["client_ca"])
    return context


def main() -> None:
    with open(sys.argv[1]) as f:
        CONFIG.update(json.load(f))
    if CONFIG.get("tls"):
        server = TlsServer(("127.0.0.1", 0), Handler)
        server.context = _tls_context(CONFIG["tls"])
        CONFIG["url"] = f"https://localhost:{server.server_port}"
    else:
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        CONFIG["url"] = f"http://127.0.0.1:{server.server_port}"
    print(server.server_port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
