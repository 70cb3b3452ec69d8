"""One writer of delivery state: only the state machine (the package
b2bhub/engine/machine/, one module per part of a delivery's life) writes
``deliveries.state``, so fencing, history, status and alerts are in one place; a failed
receipt parks its sequence the same way whichever path settles it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine import operator
from b2bhub.engine.machine import receipts, settlement
from b2bhub.models import Delivery, utcnow
from tests.test_sequences import _claim, _send, _states, seq  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent
MACHINE = ROOT / "b2bhub" / "engine" / "machine"
#: the modules of the state machine that write ``deliveries.state``, each the transitions
#: ``b2bhub/engine/__init__.py`` gives it; its other modules (lanes, common) write none.
#: A new module of the machine that writes state must be named here on purpose.
WRITERS = {MACHINE / f"{name}.py" for name in (
    "claiming", "settlement", "recovery", "receipts", "wake", "sequence")}


def _writes_of_state(path: Path) -> list[str]:
    """Places in ``path`` that set ``deliveries.state``: ``update(Delivery)...values(
    state=...)`` (or ``**values`` holding it), ``<delivery>.state = ...`` and SQL text
    ``UPDATE deliveries SET ... state``. Making a new row (``Delivery(state=...)``, an
    INSERT) is no transition and not counted."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "values" and _updates_deliveries(node.func.value) \
                and any(k.arg in ("state", None) for k in node.keywords):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .values(state=...)")
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "state" \
                        and "deliver" in ast.unparse(target.value).lower():
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .state =")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.search(r"\bUPDATE\s+deliveries\b[^;]*\bSET\b[^;]*\bstate\b",
                              node.value, re.IGNORECASE):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: SQL SET state")
    return found


def _updates_deliveries(chain: ast.AST) -> bool:
    """Whether an expression chain starts with ``update(Delivery)``."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
               and n.func.id == "update" and n.args and isinstance(n.args[0], ast.Name)
               and n.args[0].id == "Delivery" for n in ast.walk(chain))


def test_only_the_state_machine_writes_delivery_state():
    places = [p for p in sorted((ROOT / "b2bhub").rglob("*.py")) + sorted(
        (ROOT / "plugins").rglob("*.py")) if p not in WRITERS]
    others = [w for p in places for w in _writes_of_state(p)]
    assert others == []
    # the check sees the writes where they are: in every one of the writers
    assert [p.name for p in sorted(WRITERS) if not _writes_of_state(p)] == []


@pytest.fixture
def awaiting(seq, session):  # noqa: F811
    """Two deliveries of one sequence of an ordered target: the first awaits its
    receipt, the second waits behind it."""
    ids = _send(seq, 2)
    [first] = _claim(session)
    settlement.settle(session, first, Outcome.awaiting_receipt("R-1"), RetryPolicy(), utcnow())
    session.commit()
    return ids


def test_a_failed_receipt_through_the_mdn_path_parks_the_sequence(awaiting, session):
    assert receipts.settle_receipt(session, awaiting[0], "R-1", False,
                                   "negative MDN: decryption-failed", utcnow(), kind="mdn")
    session.commit()
    assert _states(session, awaiting) == ["failed", "deferred"]


def test_a_failed_receipt_through_the_api_parks_the_sequence_the_same_way(awaiting,
                                                                         session):
    operator.record_receipt(session, awaiting[0], False, "job failed", "erp", utcnow())
    session.commit()
    assert _states(session, awaiting) == ["failed", "deferred"]
    parked = session.get(Delivery, awaiting[1])
    assert parked.next_wake_at is None
