"""The partner scorecard against a fixture counted by hand: the same figures from the
message rows (the days not yet folded) and from the stored daily figures, through the
service and ``GET /api/v1/partners/<name>/scorecard``; and its arithmetic."""

from __future__ import annotations

from datetime import timedelta

import pytest

from b2bhub.domain import scorecard as rules
from b2bhub.models import (
    AckWait,
    Delivery,
    HistoryLine,
    Message,
    Party,
    ScorecardDay,
    utcnow,
)
from b2bhub.services import scorecard as svc
from b2bhub.services.users import create_user

# noon today: the API's period ends at the clock's now, in the same day (the dates below
# are relative to it)
NOW = utcnow().replace(hour=12, minute=0, second=0, microsecond=0)
TODAY = NOW.replace(hour=0)
OUT_AT = NOW - timedelta(days=10)  # folded once rolled up
IN_AT = NOW - timedelta(hours=4)  # today: always counted from the rows


# --- the arithmetic ---------------------------------------------------------------------

def test_buckets_and_percentiles():
    assert [rules.bucket(s) for s in (0, 1, 1.01, 2, 86400, 86401)] == [0, 0, 1, 1, 13, 14]
    counts = [0] * (len(rules.BOUNDS) + 1)
    assert rules.percentile(counts, 0.5) is None
    counts[0], counts[2], counts[14] = 2, 2, 1  # 2 x <=1 s, 2 x <=5 s, 1 over a day
    assert rules.percentile(counts, 0.5) == 5  # rank 3 of 5
    assert rules.percentile(counts, 0.4) == 1  # rank 2 exactly
    assert rules.percentile(counts, 0.95) == float("inf")


def test_how_outcomes_receipts_and_acknowledgments_count():
    assert rules.outcome("delivered", None, 1) == rules.FIRST_TIME
    assert rules.outcome("delivered", None, 2) == rules.AFTER_RETRIES
    assert rules.outcome("failed", "business", 1) == rules.FAILED_BUSINESS
    assert rules.outcome("failed", "technical", 4) == rules.FAILED_TECHNICAL
    assert rules.outcome("retrying", None, 1) == rules.PENDING
    assert rules.outcome("cancelled", None, 1) is None
    assert rules.receipt("delivered", None, "", False) is None
    assert rules.receipt("awaiting_receipt", "r1", "", False) == rules.WAITING
    assert rules.receipt("failed", "r1", "no receipt within 24h", False) == rules.MISSING
    assert rules.receipt("failed", "r1", "no receipt within 24h", True) == rules.LATE
    assert rules.receipt("failed", "r1", "negative MDN", False) == rules.ON_TIME
    assert [rules.acknowledgment(*a) for a in (("acknowledged", False), (
        "rejected", True), ("awaiting", True), ("awaiting", False))] == [
        rules.ON_TIME, rules.LATE, rules.MISSING, rules.WAITING]


# --- the fixture ------------------------------------------------------------------------

def _message(session, at, direction="outbound", partner="acme", source="erp", size=1000,
             deliveries=()):
    frm, to = ("hub", partner) if direction == "outbound" else (partner, "hub")
    m = Message(source=source, from_party=frm, to_party=to, direction=direction,
                status="delivered", size=size, created_at=at, updated_at=at)
    session.add(m)
    session.flush()
    for d in deliveries:
        settled = d.pop("after", None)
        session.add(Delivery(message_id=m.id, created_at=at, updated_at=at,
                             settled_at=at + timedelta(seconds=settled)
                             if settled is not None else None, **d))
    session.flush()
    return m


def _delivered(target, seconds, attempt=1, **extra):
    return {"target": target, "state": "delivered", "attempt": attempt, "after": seconds,
            **extra}


def _fixture(session):
    session.add_all([Party(name="acme", kind="partner"), Party(name="globex", kind="partner"),
                     Party(name="hub", kind="organization")])
    at = iter(OUT_AT + timedelta(minutes=i) for i in range(100))
    # ids grow with time, as the hub writes them: first one out of a 30-day period
    _message(session, NOW - timedelta(days=40), deliveries=[_delivered("as2out", 1)])
    # outbound, erp -> as2out: 10 delivered first time, 5 of them receipted in time
    for i, seconds in enumerate((0.5, 0.5, 3, 3, 3, 8, 8, 20, 45, 100)):
        _message(session, next(at), deliveries=[_delivered(
            "as2out", seconds, receipt_ref=f"r{i}" if i < 5 else None)])
    for _ in range(4):  # 4 after retries, 400 s each
        _message(session, next(at), deliveries=[_delivered("as2out", 400, attempt=3)])
    for i in range(3):  # 3 failed, technical; 2 of them for want of a receipt
        m = _message(session, next(at), deliveries=[{
            "target": "as2out", "state": "failed", "failure_kind": "technical",
            "attempt": 1, "after": 90000,
            "receipt_ref": f"x{i}" if i < 2 else None,
            "last_result": "no receipt within 24h" if i < 2 else "connection refused"}])
        if i == 0:  # ... the first one's receipt came after all: late
            session.add(HistoryLine(message_id=m.id, delivery_id=m.deliveries[0].id,
                                    type="mdn_refused", text="late", created_at=NOW))
    for _ in range(2):  # 2 failed by a business rule
        _message(session, next(at), deliveries=[{
            "target": "as2out", "state": "failed", "failure_kind": "business",
            "attempt": 1, "after": 5}])
    _message(session, next(at), deliveries=[{"target": "as2out", "state": "retrying",
                                             "attempt": 2}])
    _message(session, next(at), deliveries=[{
        "target": "as2out", "state": "awaiting_receipt", "attempt": 1, "receipt_ref": "w"}])
    _message(session, next(at), deliveries=[{"target": "as2out", "state": "cancelled",
                                             "attempt": 1}])
    # one message to two targets: 2 s to as2out, failed to sftpout
    _message(session, next(at), size=500, deliveries=[
        _delivered("as2out", 2), {"target": "sftpout", "state": "failed",
                                  "failure_kind": "technical", "attempt": 1, "after": 1}])
    # acknowledgments of four of them: 2 in time, 1 late, 1 missing
    waits = (("acknowledged", False), ("acknowledged", False), ("rejected", True),
             ("awaiting", True))
    for n, (state, overdue) in enumerate(waits):
        m = _message(session, next(at), deliveries=[_delivered("as2out", 2)])
        session.add(AckWait(message_id=m.id, partner="acme", standard="X12",
                            our_identity="ZZ:HUB", partner_identity="ZZ:ACME",
                            interchange_control=str(n), control=str(n), functional_id="PO",
                            state=state, overdue=overdue, result="", codes=[],
                            created_at=m.created_at))
    # inbound, as2in -> erpdrop: 6 delivered in 2 s; one not routed (no delivery)
    for i in range(6):
        _message(session, IN_AT + timedelta(seconds=i), "inbound", source="as2in", size=200,
                 deliveries=[_delivered("erpdrop", 2)])
    _message(session, IN_AT, "inbound", source="as2in", size=200)
    # not acme's
    _message(session, OUT_AT, partner="globex", deliveries=[_delivered("as2out", 1)])
    session.commit()


# the figures, counted by hand from the fixture above
AS2OUT = {"messages": 27, "bytes": 26500, "first_time": 15, "after_retries": 4,
          "failed_technical": 3, "failed_business": 2, "pending": 2,
          # <=1: 2, <=2: 5 (2 s x5), <=5: 3, <=10: 2, <=30: 1, <=60: 1, <=120: 1, <=600: 4
          "durations": [2, 5, 3, 2, 1, 1, 1, 0, 4, 0, 0, 0, 0, 0, 0],
          "receipts": {"on_time": 5, "late": 1, "missing": 1, "waiting": 1}}


def _check(card):
    rows = {(r.direction, r.source, r.target): r.figures for r in card.rows}
    assert set(rows) == {("outbound", "erp", "as2out"), ("outbound", "erp", "sftpout"),
                         ("outbound", "erp", ""), ("inbound", "as2in", "erpdrop"),
                         ("inbound", "as2in", "")}
    out = rows[("outbound", "erp", "as2out")]
    assert {k: getattr(out, k) for k in AS2OUT} == AS2OUT
    # 19 delivered: the median is the 10th (a <=5 s one), p95 the 19th (<=600 s)
    assert (out.median_seconds, out.p95_seconds) == (5, 600)
    sftp = rows[("outbound", "erp", "sftpout")]
    assert (sftp.messages, sftp.bytes, sftp.failed_technical, sftp.delivered) == (1, 500, 1, 0)
    assert rows[("outbound", "erp", "")].acks == {"on_time": 2, "late": 1, "missing": 1,
                                                 "waiting": 0}
    inbound = rows[("inbound", "as2in", "erpdrop")]
    assert (inbound.messages, inbound.bytes, inbound.first_time) == (6, 1200, 6)
    assert (inbound.median_seconds, inbound.p95_seconds) == (2, 2)
    assert (rows[("inbound", "as2in", "")].messages, rows[("inbound", "as2in", "")].pending
            ) == (1, 0)
    assert card.totals["outbound"].messages == 28
    assert card.totals["inbound"].messages == 7
    assert card.expected == {"met": 0, "missed": 0, "late": 0}


def test_scorecard_from_the_rows_and_from_the_stored_days(session, api, app):
    _fixture(session)
    _check(svc.scorecard(session, "acme", 30, NOW))  # nothing rolled up: all from rows

    # from the first message's day (40 days ago) to the last one 3 days old
    assert svc.roll_up(session, NOW, limit=100) == 38
    session.commit()
    assert svc.roll_up(session, NOW) == 0  # the day after is not yet 3 days old
    assert svc.rolled_through(session) == TODAY - timedelta(days=3)
    assert session.query(ScorecardDay).filter_by(partner="acme").count() == 4
    card = svc.scorecard(session, "acme", 30, NOW)
    assert card.stored_through == (TODAY - timedelta(days=3)).date()
    assert card.live_since == TODAY - timedelta(days=2)
    _check(card)
    assert svc.scorecard(session, "acme", 90, NOW).totals["outbound"].messages == 29
    assert svc.scorecard(session, "acme", 7, NOW).totals["outbound"].messages == 0

    answer = api.get("/api/v1/partners/acme/scorecard?days=30")
    assert answer.status_code == 200, answer.json
    body = answer.json
    assert body["days"] == 30
    assert body["stored_through"] == (TODAY - timedelta(days=3)).date().isoformat()
    row = next(r for r in body["rows"] if r["target"] == "as2out")
    assert (row["messages"], row["delivered_first_time"], row["delivered_after_retries"],
            row["failed_technical"], row["failed_business"], row["pending"]) == (
        27, 15, 4, 3, 2, 2)
    assert (row["median_seconds"], row["p95_seconds"]) == (5, 600)
    assert row["receipts"] == AS2OUT["receipts"]
    assert [b["count"] for b in row["durations"]] == AS2OUT["durations"]
    assert row["durations"][-1]["le_seconds"] is None
    assert body["expected"] == {"met": 0, "missed": 0, "late": 0}

    # the partner page shows the same rows to a viewer, with the period's choice
    create_user(session, "vera", "viewer-pass", "viewer")
    session.commit()
    ui = app.test_client()
    assert ui.post("/ui/login", data={"name": "vera", "password": "viewer-pass"}
                   ).status_code == 302
    page = ui.get("/ui/parties/acme?days=30")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    row = html.split('data-target="as2out"', 1)[1].split("</tr>", 1)[0]
    cells = [c.split(">", 1)[1] for c in row.split("</td>")[:-1]]
    assert cells[3:10] == ["27", "26,500", "15", "4", "3", "2", "2"]
    assert "5.0 s" in cells[10] and "10.0 min" in cells[11]
    assert cells[12:] == ["5 / 1 / 1", "0 / 0 / 0"]
    assert 'href="/ui/parties/acme?days=90#scorecard-title"' in html
    assert ui.get("/ui/parties/acme?days=8").status_code == 400


@pytest.mark.parametrize(("path", "status"), [
    ("/api/v1/partners/nobody/scorecard", 404),
    ("/api/v1/partners/acme/scorecard?days=8", 400)])
def test_scorecard_refusals(session, api, path, status):
    session.add(Party(name="acme", kind="partner"))
    session.commit()
    answer = api.get(path)
    assert answer.status_code == status
    assert answer.json["error"]["code"] in ("not_found", "invalid")


def test_expected_message_windows_are_counted_for_the_partner(session):
    """Judged windows of the period whose rule (or whose relation's request) names the
    partner, by state; open windows and other partners' and older windows are not."""
    from b2bhub.models.expected import ExpectedRule, ExpectedWindow
    session.add_all([Party(name="acme", kind="partner"), Party(name="globex", kind="partner"),
                     Party(name="mycompany", kind="organization")])
    nightly = ExpectedRule(name="nightly", from_party="acme", to_party="mycompany",
                           schedule="0 6 * * *", timezone="UTC")
    acks = ExpectedRule(name="acks", from_party="*", to_party="*",
                        after={"document_type": "850"}, within_minutes=240)
    other = ExpectedRule(name="globex", from_party="globex", to_party="mycompany",
                         schedule="0 6 * * *", timezone="UTC")
    session.add_all([nightly, acks, other])
    session.flush()

    def window(rule, days_ago, state, **parties):
        end = NOW - timedelta(days=days_ago)
        session.add(ExpectedWindow(rule_id=rule.id, key=f"{rule.name}-{days_ago}-{state}",
                                   starts_at=end - timedelta(hours=1), ends_at=end,
                                   state=state, **parties))
    for days_ago, state in ((1, "met"), (2, "met"), (3, "missed"), (4, "late"),
                            (40, "missed")):  # the last one is outside 30 days
        window(nightly, days_ago, state)
    window(nightly, 0, "open")
    window(acks, 5, "missed", from_party="acme", to_party="mycompany")  # acme's request
    window(acks, 5, "met", from_party="globex", to_party="mycompany")
    window(other, 1, "missed")
    session.commit()
    assert svc.scorecard(session, "acme", 30, NOW).expected == {
        "met": 2, "missed": 2, "late": 1}
    assert svc.scorecard(session, "globex", 30, NOW).expected == {
        "met": 1, "missed": 1, "late": 0}
