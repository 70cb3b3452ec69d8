"""Plugin types of a package installed apart from b2bhub (see entry_points.txt beside
this file). Worker processes started by the tests find them through their entry points
with this folder on PYTHONPATH, exactly as a third-party package would be found."""

from __future__ import annotations

import hashlib
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from celery import shared_task

from b2bhub.domain.outcome import ANSWER_BODY_LIMIT, Answer, Outcome
from b2bhub.plugin.schema import Field


class ExternalEcho:
    """A target that reports every delivery as delivered."""

    type_name = "external_echo"
    roles = frozenset({"target"})
    config_schema: list = []

    def __init__(self, instance_name: str, config: dict[str, Any]):
        self.instance_name = instance_name
        self.config = config

    def deliver(self, delivery: Any, payload: Any, context: Any) -> Any:
        return Outcome.delivered("echoed")


class Recorder:
    """A target that records every attempt (pid, start, end, the body's SHA-256) as a
    JSON line in a file of its process, so tests can count who attempted what, how many
    ran at once, and how often one document reached the far side."""

    type_name = "recorder"
    roles = frozenset({"target"})
    claim_batch = 1
    config_schema = [
        Field("record_dir", "string", required=True, help="where attempts are recorded"),
        Field("sleep", "number", default=0.0, help="seconds each attempt takes"),
        Field("fail_attempts", "integer", default=0,
              help="the first N attempts of each delivery fail with error_class"),
        Field("error_class", "string", default="connection"),
        Field("claim_batch", "integer", default=1,
              help="deliveries a worker claims at once for this instance"),
    ]

    def __init__(self, instance_name: str, config: dict[str, Any]):
        self.instance_name = instance_name
        self.config = config
        self.claim_batch = int(config.get("claim_batch") or 1)

    def deliver(self, delivery: Any, payload: Any, context: Any) -> Any:
        start = time.time()
        context.wire_started()
        time.sleep(float(self.config.get("sleep") or 0))
        stages = payload.stages()
        body = payload.open("unpacked" if "unpacked" in stages else stages[0]).read()
        record = {"delivery": delivery.delivery_id, "attempt": delivery.attempt,
                  "message": delivery.message_id, "sha256": hashlib.sha256(body).hexdigest(),
                  "pid": os.getpid(), "start": start, "end": time.time(), "size": len(body)}
        path = os.path.join(self.config["record_dir"], f"attempts-{os.getpid()}.jsonl")
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if delivery.attempt <= int(self.config.get("fail_attempts") or 0):
            return Outcome.error(self.config.get("error_class") or "connection",
                                 f"attempt {delivery.attempt} made to fail")
        return Outcome.delivered(f"recorded {len(body)} bytes")


class ProbedPoster:
    """A target that POSTs each delivery to a URL and probes another with a GET.

    For the probe tests, apart from the built-in HTTP poster: ``probe()`` GETs
    ``probe_url`` (2xx: online, any other answer: offline, a connection failure raises,
    with its reason), ``deliver()`` POSTs the payload to ``url``."""

    type_name = "probed_poster"
    roles = frozenset({"target"})
    config_schema = [
        Field("url", "string", required=True, help="where deliveries are POSTed"),
        Field("probe_url", "string", default="", help="GET it to probe; empty: no probe"),
        Field("timeout", "number", default=5.0),
    ]

    def __init__(self, instance_name: str, config: dict[str, Any]):
        self.instance_name = instance_name
        self.config = config

    def probe(self) -> bool | None:
        import requests
        if not self.config.get("probe_url"):
            return None
        answer = requests.get(self.config["probe_url"],
                              timeout=float(self.config.get("timeout") or 5))
        return 200 <= answer.status_code < 300

    def deliver(self, delivery: Any, payload: Any, context: Any) -> Any:
        import requests
        body = payload.open(payload.stages()[0]).read()
        context.wire_started()
        try:
            answer = requests.post(self.config["url"], data=body,
                                   timeout=float(self.config.get("timeout") or 5),
                                   headers={"X-Attempt": str(delivery.attempt)})
        except requests.RequestException as exc:
            return Outcome.error("connection", f"{type(exc).__name__}: {exc}")
        if 200 <= answer.status_code < 300:
            return Outcome.delivered(f"HTTP {answer.status_code}")
        return Outcome.error("http", f"HTTP {answer.status_code}")


class AnswerPoster:
    """A target that POSTs the payload to ``url`` and hands the core the destination's
    answer: delivered on a 2xx, an error of class ``http_<status>`` otherwise, each
    carrying the answer for the instance's business-error rules."""

    type_name = "answer_poster"
    roles = frozenset({"target"})
    claim_batch = 1
    config_schema = [Field("url", "string", required=True, help="where to POST")]

    def __init__(self, instance_name: str, config: dict[str, Any]):
        self.instance_name = instance_name
        self.config = config

    def deliver(self, delivery: Any, payload: Any, context: Any) -> Any:
        body = payload.open(payload.stages()[0]).read()
        request = urllib.request.Request(self.config["url"], data=body, method="POST",
                                         headers={"X-Delivery-Id": str(delivery.delivery_id),
                                                  "Content-Type": "application/octet-stream"})
        context.wire_started()
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                status, headers, content = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            status, headers, content = exc.code, exc.headers, exc.read()
        except OSError as exc:
            return Outcome.error("connection", f"{type(exc).__name__}: {exc}")
        answer = Answer(status, content[:ANSWER_BODY_LIMIT], headers.get("Content-Type", ""),
                        tuple(headers.items()))
        if 200 <= status < 300:
            return Outcome.delivered(f"HTTP {status}").with_answer(answer)
        return Outcome.error(f"http_{status}", f"HTTP {status}").with_answer(answer)


class Noop:
    """A target that does nothing and succeeds: the benchmark's floor of plugin work."""

    type_name = "noop"
    roles = frozenset({"target"})
    config_schema: list = []
    claim_batch = 16

    def __init__(self, instance_name: str, config: dict[str, Any]):
        self.instance_name = instance_name
        self.config = config

    def deliver(self, delivery: Any, payload: Any, context: Any) -> Any:
        return Outcome.delivered("ok")


class ManualSource:
    """A source whose messages the tests store through its context."""

    type_name = "manual_source"
    roles = frozenset({"source"})
    config_schema: list = []

    def __init__(self, instance_name: str, config: dict[str, Any]):
        self.instance_name = instance_name
        self.config = config


@shared_task(name="tests.dispatch", ignore_result=True)
def dispatch(source: str, from_party: str, to_party: str, body: str,
             external_id: str) -> int:
    """Store and dispatch a message inside a worker process (workers load this module
    with ``--include b2bhub_testplugins``), so tests see which routes a worker applies."""
    from b2bhub.engine.dispatch import NewMessage, store_and_dispatch
    from b2bhub.models import utcnow
    from b2bhub.runtime import hub

    stored = hub.store().put(body.encode())
    with hub.new_session() as session:
        message = store_and_dispatch(session, NewMessage(
            source=source, from_party=from_party, to_party=to_party,
            stages={"unpacked": (stored.digest, stored.size)}, external_id=external_id,
            actor="tests.dispatch"), utcnow())
        session.commit()
        return message.id
