"""Expected-message rules: create, list, delete, and their last windows
(docs/expected-messages.md). Each change is a ``config_changed`` line naming who."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from b2bhub.domain import expected as rules
from b2bhub.domain.i18n import N_, joined
from b2bhub.domain.routing import ANY, validate_document_type, validate_name
from b2bhub.engine.expected import KIND
from b2bhub.engine.history import add_line
from b2bhub.models import Alert, Party, PluginInstance
from b2bhub.models.expected import ExpectedRule, ExpectedWindow
from b2bhub.services.errors import Conflict, NotFound, ServiceError

#: the fields a rule is made of, as the API and fixtures name them
FIELDS = ("name", "description", "direction", "from", "to", "source", "target", "filename",
          "document_type", "schedule", "timezone", "opens_minutes", "after",
          "within_minutes", "enabled")


def rule_shape(rule: ExpectedRule) -> dict:
    """A rule as the API shows it (and fixtures take it)."""
    return {"name": rule.name, "description": rule.description,
            "direction": rule.direction, "from": rule.from_party, "to": rule.to_party,
            "source": rule.source, "target": rule.target, "filename": rule.filename,
            "document_type": rule.document_type, "schedule": rule.schedule,
            "timezone": rule.timezone, "opens_minutes": rule.opens_minutes,
            "after": rule.after, "within_minutes": rule.within_minutes,
            "enabled": rule.enabled, "created_at": rule.created_at,
            "created_by": rule.created_by}


def list_rules(session: Session, party: str | None = None) -> list[ExpectedRule]:
    """Every rule by name; with ``party``, those naming it or ``*`` on either side."""
    stmt = select(ExpectedRule).order_by(ExpectedRule.name)
    if party:
        stmt = stmt.where(or_(ExpectedRule.from_party.in_((party, ANY)),
                              ExpectedRule.to_party.in_((party, ANY))))
    return list(session.scalars(stmt))


def get_rule(session: Session, name: str) -> ExpectedRule:
    rule = session.scalar(select(ExpectedRule).where(ExpectedRule.name == name))
    if rule is None:
        raise NotFound(N_("no expected-message rule named '%(name)s'", name=name))
    return rule


def create_rule(session: Session, data: dict, actor: str, now: datetime) -> ExpectedRule:
    """Check every field, then add the rule; a ServiceError names each bad one."""
    values = _checked(session, data)
    if session.scalar(select(ExpectedRule.id).where(ExpectedRule.name == values["name"])):
        raise Conflict(N_("an expected-message rule named '%(name)s' exists",
                          name=values["name"]),
                       {"name": "taken"})
    rule = ExpectedRule(**values, created_at=now, created_by=actor)
    session.add(rule)
    session.flush()
    add_line(session, None, "config_changed",
             f"{actor}: created expected-message rule {rule.name} ({describe(rule)})",
             actor=actor, now=now, data={"expected_rule": rule.name})
    return rule


def delete_rule(session: Session, name: str, actor: str, now: datetime) -> None:
    """Remove a rule and its windows; its open alerts are resolved (nothing is
    expected any more)."""
    rule = get_rule(session, name)
    session.execute(update(Alert).where(
        Alert.kind == KIND, Alert.subject.like(f"expected:{rule.name}:%"),
        Alert.resolved_at.is_(None)).values(resolved_at=now))
    session.delete(rule)
    add_line(session, None, "config_changed",
             f"{actor}: deleted expected-message rule {name}", actor=actor, now=now,
             data={"expected_rule": name})


def last_windows(session: Session, rule_ids: list[int], per_rule: int = 5
                 ) -> dict[int, list[ExpectedWindow]]:
    """Each rule's latest windows that ended or were met, newest first (one indexed
    read per rule: ``ix_expected_windows_rule_ends``)."""
    return {rule_id: list(session.scalars(
        select(ExpectedWindow).where(ExpectedWindow.rule_id == rule_id)
        .order_by(ExpectedWindow.ends_at.desc()).limit(per_rule))) for rule_id in rule_ids}


def describe(rule: ExpectedRule) -> str:
    """One line: what is expected and when."""
    what = f"{rule.direction} {rule.from_party} → {rule.to_party}"
    if rule.document_type not in ("", ANY):
        what += f" {rule.document_type}"
    if rule.filename not in ("", ANY):
        what += f" {rule.filename}"
    if rule.schedule:
        return f"{what} by '{rule.schedule}' {rule.timezone}"
    after = rule.after or {}
    trigger = " ".join(v for v in (after.get("direction", ""), after.get("document_type", ""),
                                   after.get("filename", "")) if v and v != ANY)
    return f"{what} within {rule.within_minutes} min of each {trigger or 'message'}"


# --- checks -------------------------------------------------------------------------

def _checked(session: Session, data: dict) -> dict:
    problems: dict[str, str] = {}
    name = data.get("name")
    if validate_name(name):
        problems["name"] = validate_name(name)
    values = {"name": name, "description": str(data.get("description") or "")[:255],
              "direction": data.get("direction", ANY), "from_party": data.get("from", ANY),
              "to_party": data.get("to", ANY), "source": data.get("source") or "",
              "target": data.get("target") or "", "filename": data.get("filename") or ANY,
              "document_type": data.get("document_type") or ANY,
              "schedule": data.get("schedule"), "timezone": data.get("timezone") or "UTC",
              "opens_minutes": data.get("opens_minutes"), "after": data.get("after"),
              "within_minutes": data.get("within_minutes"),
              "enabled": data.get("enabled", True) is not False}
    if values["direction"] not in rules.DIRECTIONS:
        problems["direction"] = N_("one of %(choices)s", choices=", ".join(rules.DIRECTIONS))
    _check_names(session, values, problems)
    if values["document_type"] != ANY and validate_document_type(values["document_type"]):
        problems["document_type"] = validate_document_type(values["document_type"])
    _check_window(values, problems)
    if problems:
        raise ServiceError(N_("the rule was not saved: %(problems)s", problems=joined(
            N_("%(field)s: %(problem)s", field=k, problem=v) for k, v in problems.items())),
            problems)
    return values


def _check_names(session: Session, values: dict, problems: dict) -> None:
    for field, key in (("from", "from_party"), ("to", "to_party")):
        name = values[key]
        if name != ANY and not session.scalar(select(Party.id).where(Party.name == name)):
            problems[field] = N_("no party named %(name)r", name=name)
    for field in ("source", "target"):
        name = values[field]
        if name and not session.scalar(select(PluginInstance.id).where(
                PluginInstance.name == name)):
            problems[field] = N_("no instance named %(name)r", name=name)


def _check_window(values: dict, problems: dict) -> None:
    """A schedule (and its zone) or a relation (``after`` and ``within_minutes``),
    not both."""
    schedule, after = values["schedule"], values["after"]
    if (schedule is None) == (after is None):
        problems["schedule"] = N_("give a schedule, or after and within_minutes (not both)")
        return
    if schedule is not None:
        problem = rules.check_schedule(schedule, values["timezone"])
        if problem:
            problems["timezone" if "time zone" in problem else "schedule"] = problem
        if values["opens_minutes"] is not None and not _positive(values["opens_minutes"]):
            problems["opens_minutes"] = N_("a whole number of minutes above 0")
        values["within_minutes"] = None
        return
    if not isinstance(after, dict) or set(after) - {"direction", "document_type", "filename"} \
            or not all(isinstance(v, str) and v for v in after.values()):
        problems["after"] = N_("an object of direction, document_type and filename (text)")
    elif after.get("direction", ANY) not in rules.DIRECTIONS:
        problems["after"] = N_("direction: one of %(choices)s",
                                choices=", ".join(rules.DIRECTIONS))
    if not _positive(values["within_minutes"]):
        problems["within_minutes"] = N_("a whole number of minutes above 0")
    values["opens_minutes"] = None


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 525600
