"""Business-error rules (SPEC 10, seed 003): checked on every answer a target attaches to
its outcome, a 200 included, before the status decides; a match fails the delivery as a
business error with no retry; ``block`` parks the sequence or holds back the instance
until an operator resubmits or skips the blocking delivery.

The destination is a real HTTP server on loopback (``tests/answering_peer.py``); the
target is the test package's ``answer_poster``, which posts to it and hands the core the
answer; the worker is the real :class:`TargetRunner` in this process (the processes
test is ``test_business_rules_processes.py``)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import b2bhub_testplugins as testplugins
import pytest
from sqlalchemy import select

from b2bhub.domain import business_rules as br
from b2bhub.domain.outcome import Answer, Outcome, OutcomeKind
from b2bhub.engine import operator
from b2bhub.engine.runner import TargetRunner
from b2bhub.engine.settings import load_settings
from b2bhub.engine.sweep import run_sweep
from b2bhub.models import Alert, Delivery, Message, PluginInstance, utcnow
from b2bhub.runtime.hub import new_session
from tests import test_ui
from tests.answering_peer import PeerAnswer, running_peer
from tests.enginekit import deliveries, lines

# the UI tests' fixtures: a logged-in client, and a fresh user per request
login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request
REJECTED = {"name": "rejected", "status": "2xx", "json_path": "$.status",
            "json_value": "ERR"}


# --- the rules as a pure function -------------------------------------------------------

def _answer(body: bytes | str, status: int = 200, content_type: str = "application/json"):
    return Answer(status, body.encode() if isinstance(body, str) else body, content_type)


def test_a_rule_by_status_matches_the_exact_status_or_its_class():
    rules = br.parse_rules([{"name": "gone", "status": 410},
                            {"name": "client", "status": "4XX"}])
    assert br.check(rules, _answer("", 410)).rule.name == "gone"
    assert br.check(rules, _answer("", 404)).rule.name == "client"
    assert br.check(rules, _answer("", 404)).text == "HTTP 404"
    assert br.check(rules, _answer("", 200)) is None
    assert br.check(rules, Answer(None)) is None  # no HTTP status at all


def test_a_rule_by_regular_expression_reports_the_matched_text():
    rules = br.parse_rules([{"name": "edi_error", "body_regex": r"ERR-\d{3}"}])
    match = br.check(rules, _answer("<ack><code>ERR-042</code></ack>", 200, "text/xml"))
    assert (match.rule.name, match.text) == ("edi_error", "body matched 'ERR-042'")
    assert br.check(rules, _answer("<ack><code>OK</code></ack>")) is None


def test_a_rule_by_json_path_with_and_without_an_expected_value():
    rules = br.parse_rules([{"name": "err", "json_path": "$.status", "json_value": "ERR"},
                            {"name": "has_errors", "json_path": "$.errors[*].code"}])
    assert br.check(rules, _answer('{"status": "ERR"}')).text == '$.status = "ERR"'
    assert br.check(rules, _answer('{"status": "OK"}')) is None
    match = br.check(rules, _answer('{"status": "OK", "errors": [{"code": 17}]}'))
    assert (match.rule.name, match.text) == ("has_errors", "$.errors[*].code = 17")
    # a body that is not JSON never matches a json_path rule, and nothing breaks
    assert br.check(rules, _answer("<html>ERR</html>", 200, "text/html")) is None
    assert br.check(rules, _answer(b"\xff\xfe\x00garbage")) is None


def test_every_condition_of_a_rule_must_hold_and_the_first_rule_wins():
    rules = br.parse_rules([
        {"name": "both", "status": 200, "body_regex": "duplicate", "block": "sequence"},
        {"name": "any_dup", "body_regex": "dup"}])
    assert br.check(rules, _answer("duplicate order", 201)).rule.name == "any_dup"
    match = br.check(rules, _answer("duplicate order", 200))
    assert match.rule.name == "both"
    assert match.text == "HTTP 200; body matched 'duplicate'"
    outcome = br.apply(rules, Outcome.delivered("HTTP 200").with_answer(
        _answer("duplicate order", 200)))
    assert (outcome.kind, outcome.rule, outcome.block) == (
        OutcomeKind.BUSINESS_ERROR, "both", "sequence")
    untouched = Outcome.delivered("HTTP 200").with_answer(_answer("fine", 200))
    assert br.apply(rules, untouched) is untouched


def test_the_body_is_decoded_by_its_charset():
    rules = br.parse_rules([{"name": "umlaut", "body_regex": "Fehler: Größe"}])
    body = "Fehler: Größe".encode("latin-1")
    assert br.check(rules, Answer(200, body, "text/plain; charset=ISO-8859-1")) is not None
    assert br.check(rules, Answer(200, body, "text/plain; charset=no-such")) is None


def test_block_is_one_of_its_choices_or_left_out():
    for left_out in ({}, {"block": None}, {"block": ""}):
        [rule] = br.parse_rules([{"name": "x", "status": 500, **left_out}])
        assert rule.block == "none"
    for wrong in (False, 0, "never", []):
        with pytest.raises(br.RulesError, match="block must be one of"):
            br.parse_rules([{"name": "x", "status": 500, "block": wrong}])



@pytest.mark.parametrize(("rules", "where", "reason"), [
    ([{"name": "x", "body_regex": "(unclosed"}], "rule 1 (x)",
     "body_regex is not a valid regular expression: missing ) at position 9"),
    ([{"name": "x", "json_path": "$.["}], "rule 1 (x)", "json_path is not a valid JSONPath"),
    ([{"name": "x", "status": 200, "block": "everything"}], "rule 1 (x)",
     "block must be one of none, sequence, instance, not 'everything'"),
    ([{"name": "x"}], "rule 1 (x)",
     "give at least one condition: status, body_regex or json_path"),
    ([{"name": "x", "status": 200}, {"name": "x", "status": 500}], "rule 2 (x)",
     "the name 'x' is used by an earlier rule"),
    ([{"status": 200}], "rule 1", "name is required"),
    ([{"name": "x", "status": 700}], "rule 1 (x)", "status must be an HTTP status"),
    ([{"name": "x", "json_value": 1, "status": 200}], "rule 1 (x)",
     "json_value needs a json_path"),
    ([{"name": "x", "status": 200, "regex": "a"}], "rule 1 (x)", "unknown field(s) regex"),
    ({"name": "x"}, "business_rules", "must be a list of rule objects"),
])


def test_bad_rules_are_refused_with_the_reason(rules, where, reason):
    with pytest.raises(br.RulesError) as refused:
        br.parse_rules(rules)
    assert reason in refused.value.errors[where]


def test_stored_rules_spell_out_their_status_and_block():
    assert br.normalize([{"name": " a ", "status": "404", "body_regex": ""},
                         {"name": "b", "status": "5XX", "block": "instance"}]) == [
        {"name": "a", "status": 404, "block": "none"},
        {"name": "b", "status": "5xx", "block": "instance"}]
    assert br.normalize([]) is None and br.normalize(None) is None


# --- the core applies them: a real destination, the real runner ---------------------------

@pytest.fixture
def peer():
    with running_peer() as peer:
        yield peer


@pytest.fixture
def poster(hub, registry, peer):
    """Source inbox → target ``poster`` (answer_poster to the peer), one at a time."""
    registry.register(testplugins.AnswerPoster)
    hub.parties()
    hub.instance("inbox", "manual_source")

    def make(rules: list[dict], concurrent: int = 1):
        hub.instance("poster", "answer_poster", config={"url": peer.url},
                     business_rules=rules, max_concurrent_deliveries=concurrent)
        hub.route("inbox", "*", "*", "poster")
        return hub
    return make


def _drain(hub, registry) -> None:
    TargetRunner(new_session, registry, hub.store, "worker-t").drain("poster", budget=10)


def _rejected_by(session, message_id: int) -> Delivery:
    [delivery] = deliveries(session, message_id)
    return delivery


@pytest.mark.parametrize(("rule", "answer", "matched"), [
    ({"name": "by_status", "status": 200}, PeerAnswer(200, b"accepted", "text/plain"),
     "HTTP 200"),
    ({"name": "by_regex", "body_regex": r"REJECTED: [a-z ]+"},
     PeerAnswer(200, b"<r>REJECTED: unknown article</r>", "text/xml"),
     "body matched 'REJECTED: unknown article'"),
    ({"name": "by_json_path", "json_path": "$.result.code", "json_value": "E17"},
     PeerAnswer(200, b'{"result": {"code": "E17", "text": "no such GTIN"}}'),
     '$.result.code = "E17"'),
])
def test_a_rule_turns_a_200_answer_into_a_business_error(
        poster, peer, session, registry, rule, answer, matched):
    hub = poster([rule])
    peer.answers[b"ORDER"] = answer
    message = hub.message(body=b"ORDER 1")
    _drain(hub, registry)

    delivery = _rejected_by(session, message.id)
    assert (delivery.state, delivery.failure_kind) == ("failed", "business")
    assert delivery.attempt == 1 and peer.received == [b"ORDER 1"]  # no retry
    assert session.get(Message, message.id).status == "business_error"
    failed = lines(session, message.id, "delivery_changed")[-1]
    assert failed.text == (f"poster: attempt 1 failed by business rule {rule['name']}: "
                           f"{matched}")
    assert failed.data["business_rule"] == rule["name"]
    assert [a.kind for a in session.scalars(select(Alert).where(
        Alert.message_id == message.id, Alert.resolved_at.is_(None)))] == ["message_failed"]
    # nothing comes due again for it: the sweep leaves a business error alone
    run_sweep(session, utcnow() + timedelta(hours=1), "beat")
    assert _rejected_by(session, message.id).state == "failed"


def test_an_answer_no_rule_matches_is_decided_by_its_status(poster, peer, session, registry):
    hub = poster([REJECTED, {"name": "server_down", "status": 503, "body_regex": "never"}])
    peer.answers[b"FINE"] = PeerAnswer(200, b'{"status": "OK"}')
    peer.answers[b"DOWN"] = PeerAnswer(503, b"maintenance", "text/plain")
    fine = hub.message(body=b"FINE")
    down = hub.message(body=b"DOWN")
    _drain(hub, registry)
    assert _rejected_by(session, fine.id).state == "delivered"
    retrying = _rejected_by(session, down.id)
    assert (retrying.state, retrying.failure_kind) == ("retrying", None)


def test_a_rule_is_checked_before_an_error_status_is(poster, peer, session, registry):
    hub = poster([{"name": "validation", "status": "4xx", "json_path": "$.errors"}])
    peer.answers[b"X"] = PeerAnswer(422, b'{"errors": ["qty < 0"]}')
    message = hub.message(body=b"X")
    _drain(hub, registry)
    assert lines(session, message.id, "delivery_changed")[-1].text == (
        'poster: attempt 1 failed by business rule validation: HTTP 422; $.errors = ["qty < 0"]')


def test_block_sequence_parks_the_rest_of_the_sequence(poster, peer, session, registry):
    hub = poster([{**REJECTED, "block": "sequence"}])
    peer.answers[b"BAD"] = PeerAnswer(200, b'{"status": "ERR"}')
    ids = [hub.message(body=body, filename=f"{n}.edi").id
           for n, body in enumerate([b"BAD 1", b"ok 2", b"ok 3"])]
    # the first one's answer parks the two behind it before anyone attempts them
    runner = TargetRunner(new_session, registry, hub.store, "worker-t")
    runner.drain("poster", budget=10)
    assert [_rejected_by(session, i).state for i in ids] == ["failed", "deferred", "deferred"]
    assert peer.received == [b"BAD 1"]
    assert session.get(Message, ids[1]).status == "deferred"


# --- block: "instance" --------------------------------------------------------------------

def _blocked_hub(poster, peer, session, registry):
    hub = poster([{**REJECTED, "block": "instance"}])
    peer.answers[b"BAD"] = PeerAnswer(200, b'{"status": "ERR", "text": "unknown GTIN"}')
    first = hub.message(body=b"BAD 1", filename="1.edi")
    _drain(hub, registry)
    later = [hub.message(body=f"ok {n}".encode(), filename=f"{n}.edi") for n in (2, 3, 4)]
    blocker = _rejected_by(session, first.id)
    return hub, blocker, [_rejected_by(session, m.id).id for m in later]


def test_block_instance_holds_back_every_later_delivery(poster, peer, session, registry):
    hub, blocker, later = _blocked_hub(poster, peer, session, registry)
    assert (blocker.state, blocker.failure_kind) == ("failed", "business")
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "poster"))
    assert row.blocked_by_delivery_id == blocker.id
    line = lines(session, blocker.message_id, "instance_blocked")[0]
    assert line.text == (f"poster: blocked by business rule rejected: its further "
                         f"deliveries wait until delivery {blocker.id} is resubmitted or "
                         "skipped")

    _drain(hub, registry)  # woken: claims nothing
    assert peer.received == [b"BAD 1"]
    # the sweep neither wakes nor stalls them, however long they wait
    settings = load_settings(session)
    dispatched = [session.get(Delivery, i).wake_count for i in later]
    for minutes in range(1, 60, 3):
        run_sweep(session, utcnow() + timedelta(minutes=minutes), "beat", settings)
    session.expire_all()
    waiting = [session.get(Delivery, i) for i in later]
    assert [(d.state, d.attempt) for d in waiting] == [("queued", 0)] * 3
    assert [d.wake_count for d in waiting] == dispatched  # never woken by the sweep
    assert session.scalars(select(Alert.kind).where(Alert.kind == "delivery_stalled")
                           ).all() == []


def test_resubmit_releases_the_instance_and_the_blocker_goes_first(
        poster, peer, session, registry, wakeups):
    hub, blocker, later = _blocked_hub(poster, peer, session, registry)
    peer.answers.clear()  # the destination's data was fixed
    result = operator.resubmit(session, blocker.id, "alice", utcnow())
    session.commit()
    assert result.changed
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "poster"))
    session.refresh(row)
    assert row.blocked_by_delivery_id is None
    released = lines(session, blocker.message_id, "instance_released")[0]
    assert (released.actor, released.text) == (
        "alice", f"alice released poster (resubmit of delivery {blocker.id}): its waiting "
                 "deliveries go out again")
    assert wakeups[-1][1] == "poster"

    _drain(hub, registry)
    assert peer.received == [b"BAD 1", b"BAD 1", b"ok 2", b"ok 3", b"ok 4"]
    assert [_rejected_by(session, session.get(Delivery, i).message_id).state
            for i in [blocker.id, *later]] == ["delivered"] * 4


def test_skip_releases_the_instance_and_the_rest_go_out_in_order(
        poster, peer, session, registry):
    hub, blocker, later = _blocked_hub(poster, peer, session, registry)
    operator.skip(session, blocker.id, "bob", utcnow())
    session.commit()
    assert lines(session, blocker.message_id, "skip_requested")[0].actor == "bob"
    assert lines(session, blocker.message_id, "instance_released")[0].actor == "bob"
    _drain(hub, registry)
    assert peer.received == [b"BAD 1", b"ok 2", b"ok 3", b"ok 4"]
    session.expire_all()
    assert session.get(Delivery, blocker.id).state == "skipped"
    assert [session.get(Delivery, i).state for i in later] == ["delivered"] * 3


def test_redeliver_of_the_blocker_counts_as_resubmit(poster, peer, session, registry):
    hub, blocker, later = _blocked_hub(poster, peer, session, registry)
    operator.redeliver(session, blocker.id, "carol", utcnow())
    session.commit()
    # still rejected: the instance is blocked again by the same delivery
    _drain(hub, registry)
    assert peer.received == [b"BAD 1", b"BAD 1"]
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "poster"))
    session.refresh(row)
    assert row.blocked_by_delivery_id == blocker.id
    assert [session.get(Delivery, i).state for i in later] == ["queued"] * 3


def test_the_rest_of_a_claimed_batch_is_put_back_unattempted(
        poster, peer, session, registry, monkeypatch):
    monkeypatch.setattr(testplugins.AnswerPoster, "claim_batch", 4)
    hub = poster([{**REJECTED, "block": "instance"}], concurrent=4)
    peer.answers[b"BAD"] = PeerAnswer(200, b'{"status": "ERR"}')
    ids = [hub.message(body=body).id for body in (b"BAD 1", b"ok 2", b"ok 3")]
    _drain(hub, registry)
    assert peer.received == [b"BAD 1"]
    assert [_rejected_by(session, i).state for i in ids] == ["failed", "queued", "queued"]
    put_back = lines(session, ids[1], "delivery_changed")[-1].text
    assert put_back == ("poster: attempt 1 interrupted: the target is blocked by a "
                        "business rule")


def test_the_blocked_state_shows_in_the_api_stats_and_pages(
        poster, peer, session, registry, api, login):
    _hub, blocker, _later = _blocked_hub(poster, peer, session, registry)
    shape = api.get("/api/v1/plugins/configs/poster").get_json()
    assert shape["blocked_by"] == {
        "delivery_id": blocker.id, "message_id": blocker.message_id,
        "resubmit": f"/api/v1/deliveries/{blocker.id}/resubmit",
        "skip": f"/api/v1/deliveries/{blocker.id}/skip"}
    assert shape["business_rules"] == [{**REJECTED, "block": "instance"}]
    items = api.get("/api/v1/stats?series=none").get_json()["instances"]
    assert items["blocked"] == 1
    assert {i["name"]: i["blocked_by"] for i in items["items"]} == {
        "inbox": None, "poster": blocker.id}
    assert "b2bhub_instances_blocked 1.0" in api.get("/metrics").text

    client = login("operator")
    link = f'/ui/messages/{blocker.message_id}#delivery-{blocker.id}'
    for page in ("/ui/", "/ui/plugins", "/ui/system/services"):
        html = client.get(page).text
        row = re.search(r'<tr[^>]*>\s*<td>poster</td>.*?</tr>', html, re.S)
        assert row is not None, page
        assert f'data-blocked-by="{blocker.id}">Blocked</strong>' in row.group(0), page
        assert f'href="{link}">delivery {blocker.id}</a>' in row.group(0), page
    message_page = client.get(f"/ui/messages/{blocker.message_id}").text
    assert f"/ui/deliveries/{blocker.id}/resubmit" in message_page
    assert f"/ui/deliveries/{blocker.id}/skip" in message_page

    api.post(f"/api/v1/deliveries/{blocker.id}/skip")
    assert api.get("/api/v1/plugins/configs/poster").get_json()["blocked_by"] is None
    assert "Blocked</strong>" not in client.get("/ui/plugins").text


# --- saving rules: API, fixtures and form ------------------------------------------------

def test_the_api_saves_rules_and_refuses_bad_ones_with_the_reason(api, registry, session):
    registry.register(testplugins.AnswerPoster)
    body = {"name": "poster", "type": "answer_poster", "config": {"url": "http://x"},
            "business_rules": [REJECTED, {"name": "dup", "body_regex": "(dup"}]}
    refused = api.post("/api/v1/plugins/configs", json=body)
    assert refused.status_code == 422  # a regular expression only the hub can judge
    error = refused.get_json()["error"]
    assert error["details"]["business_rules"] == {
        "rule 2 (dup)": "body_regex is not a valid regular expression: missing ) at "
                        "position 4"}
    assert "rule 2 (dup)" in error["message"]
    assert session.scalar(select(PluginInstance.id)) is None

    body["business_rules"][1]["body_regex"] = "dup(licate)?"
    created = api.post("/api/v1/plugins/configs", json=body)
    assert created.status_code == 201, created.text
    assert created.get_json()["business_rules"][1] == {
        "name": "dup", "body_regex": "dup(licate)?", "block": "none"}
    bad_path = api.put("/api/v1/plugins/configs/poster", json={
        "config": {"url": "http://x"}, "business_rules": [{"name": "p", "json_path": "$..["}]})
    assert bad_path.status_code == 422  # a JSONPath only the hub can judge
    assert "json_path is not a valid JSONPath" in bad_path.get_json()["error"]["details"][
        "business_rules"]["rule 1 (p)"]
    not_a_list = api.put("/api/v1/plugins/configs/poster", json={
        "config": {"url": "http://x"}, "business_rules": {"name": "x", "status": 500}})
    assert not_a_list.get_json()["error"]["details"] == {
        "business_rules": "must be a list of rule objects"}
    cleared = api.put("/api/v1/plugins/configs/poster", json={
        "config": {"url": "http://x"}, "business_rules": []})
    assert cleared.get_json()["business_rules"] == []
    source = api.post("/api/v1/plugins/configs", json={
        "name": "inbox", "type": "manual_source", "business_rules": [REJECTED]})
    assert source.status_code == 422  # rules on a source: the type's role decides
    assert source.get_json()["error"]["details"] == {
        "business_rules": "only a target instance takes them"}


def test_fixtures_carry_rules(session, registry):
    from b2bhub.services.fixtures import load_fixtures
    registry.register(testplugins.AnswerPoster)
    load_fixtures(session, {"plugins": [{"name": "poster", "type": "answer_poster",
                                         "config": {"url": "http://x"},
                                         "business_rules": [REJECTED]}]}, registry=registry)
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "poster"))
    assert row.business_rules == [{**REJECTED, "block": "none"}]


def test_the_form_edits_rules_and_shows_each_refusal_beside_the_field(
        login, registry, session):
    registry.register(testplugins.AnswerPoster)
    client = login("admin")
    assert 'name="business_rules"' in client.get("/ui/plugins/new/answer_poster").text
    typed = json.dumps([{"name": "err", "json_path": "$.status", "json_value": "ERR"},
                        {"name": "bad", "body_regex": "[unclosed"}])
    form = {"name": "poster", "enabled": "y", "config-url": "http://127.0.0.1:9/x",
            "max_concurrent_deliveries": "1", "retry_policy": "", "business_rules": typed}
    bad = client.post("/ui/plugins/new/answer_poster", data=form)
    assert bad.status_code == 400
    field = re.search(r'<div class="field\s+has-error">\s*<label for="business_rules".*?</div>',
                      bad.text, re.S)
    assert field is not None
    assert ('<span class="error">rule 2 (bad): body_regex is not a valid regular '
            'expression: unterminated character set at position 9</span>') in field.group(0)
    assert "[unclosed" in field.group(0)  # what was typed is kept
    assert session.scalar(select(PluginInstance.id)) is None

    both = client.post("/ui/plugins/new/answer_poster", data={**form, "config-url": ""})
    assert re.search(r'config-url.*?<span class="error">required</span>', both.text, re.S)
    assert "rule 2 (bad): body_regex is not a valid regular expression" in both.text

    broken = client.post("/ui/plugins/new/answer_poster",
                         data={**form, "business_rules": '[{"name": "x",'})
    assert broken.status_code == 400 and "invalid JSON" in broken.text

    good = client.post("/ui/plugins/new/answer_poster", data={
        **form, "business_rules": json.dumps([{"name": "err", "json_path": "$.status",
                                               "json_value": "ERR", "block": "instance"}])})
    assert good.status_code == 302, good.text
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "poster"))
    assert row.business_rules == [{"name": "err", "json_path": "$.status",
                                   "json_value": "ERR", "block": "instance"}]
    edit = client.get("/ui/plugins/poster/edit").text
    assert "&#34;json_value&#34;: &#34;ERR&#34;" in edit or "&quot;json_value&quot;" in edit
