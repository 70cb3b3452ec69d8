"""``GET /partners/<name>/scorecard``: a partner's figures over 7, 30 or 90 days
(docs/scorecard.md); computed by ``b2bhub.services.scorecard``."""

from __future__ import annotations

import math

from marshmallow import Schema, fields, validate

from b2bhub.api.blueprint import bp
from b2bhub.api.schemas import UtcDateTime
from b2bhub.config.extensions import db
from b2bhub.domain.scorecard import BOUNDS, PERIODS, Figures
from b2bhub.models import utcnow
from b2bhub.services import scorecard as svc


class ScorecardArgs(Schema):
    days = fields.Integer(load_default=30, validate=validate.OneOf(PERIODS), metadata={
        "description": "the period: today and the days before it (UTC), 7, 30 or 90"})


def _columns(description: str) -> fields.Nested:
    return fields.Nested(ScorecardWaits, required=True, metadata={
        "description": description})


class ScorecardWaits(Schema):
    on_time = fields.Integer(required=True)
    late = fields.Integer(required=True)
    missing = fields.Integer(required=True)
    waiting = fields.Integer(required=True, metadata={
        "description": "still within their time"})


class ScorecardBucket(Schema):
    le_seconds = fields.Float(required=True, allow_none=True, metadata={
        "description": "the bucket's upper bound; null: over a day"})
    count = fields.Integer(required=True)


class ScorecardFigures(Schema):
    messages = fields.Integer(required=True, metadata={
        "description": "messages created in the period (one sent to two targets counts "
                       "in each target's row)"})
    bytes = fields.Integer(required=True)
    delivered_first_time = fields.Integer(required=True)
    delivered_after_retries = fields.Integer(required=True)
    failed_technical = fields.Integer(required=True)
    failed_business = fields.Integer(required=True)
    pending = fields.Integer(required=True, metadata={"description": "still on their way"})
    median_seconds = fields.Float(required=True, allow_none=True, metadata={
        "description": "median time from receipt to delivery: the upper bound of its "
                       "bucket (durations); null when none was delivered or it is over "
                       "a day"})
    p95_seconds = fields.Float(required=True, allow_none=True, metadata={
        "description": "95th percentile, as median_seconds"})
    durations = fields.List(fields.Nested(ScorecardBucket), required=True)
    receipts = _columns("receipts (those a target's protocol returns, callbacks "
                        "reported through the API)")
    acknowledgments = _columns("EDI acknowledgments expected of the partner")


class ScorecardRow(ScorecardFigures):
    direction = fields.String(required=True, validate=validate.OneOf(svc.DIRECTIONS))
    source = fields.String(required=True)
    target = fields.String(required=True, metadata={
        "description": "the delivery's target; empty for messages without a delivery "
                       "and for acknowledgments (counted per source)"})


class ScorecardExpected(Schema):
    met = fields.Integer(required=True)
    missed = fields.Integer(required=True)
    late = fields.Integer(required=True)


class Scorecard(Schema):
    partner = fields.String(required=True)
    days = fields.Integer(required=True)
    since = UtcDateTime(required=True)
    until = UtcDateTime(required=True)
    stored_through = fields.Date(required=True, allow_none=True, metadata={
        "description": "the last day read from the stored daily figures; the days "
                       "after it were counted from the messages"})
    totals = fields.Dict(keys=fields.String(), values=fields.Nested(ScorecardFigures),
                         required=True, metadata={"description": "per direction"})
    rows = fields.List(fields.Nested(ScorecardRow), required=True)
    expected = fields.Nested(ScorecardExpected, required=True, metadata={
        "description": "expected-message windows of the period by outcome"})


@bp.get("/partners/<name>/scorecard", summary="A partner's scorecard")
@bp.arguments(ScorecardArgs, location="query")
@bp.response(200, Scorecard)
def get_scorecard(args: dict, name: str):
    """Messages and bytes, deliveries (first time, after retries, failed), median and
    p95 time from receipt to delivery, receipts and acknowledgments (on time, late,
    missing) and expected-message windows, per direction, source and target."""
    card = svc.scorecard(db.session, name, args["days"], utcnow())
    return {"partner": card.partner, "days": card.days, "since": card.since,
            "until": card.until, "stored_through": card.stored_through,
            "totals": {d: figures_json(f) for d, f in card.totals.items()},
            "rows": [{"direction": r.direction, "source": r.source, "target": r.target,
                      **figures_json(r.figures)} for r in card.rows],
            "expected": card.expected}


def figures_json(f: Figures) -> dict:
    return {"messages": f.messages, "bytes": f.bytes,
            "delivered_first_time": f.first_time,
            "delivered_after_retries": f.after_retries,
            "failed_technical": f.failed_technical, "failed_business": f.failed_business,
            "pending": f.pending, "median_seconds": _finite(f.median_seconds),
            "p95_seconds": _finite(f.p95_seconds),
            "durations": [{"le_seconds": BOUNDS[i] if i < len(BOUNDS) else None,
                           "count": count} for i, count in enumerate(f.durations)],
            "receipts": f.receipts, "acknowledgments": f.acks}


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else value
