"""Users: password hashing, login checks, the CLI, and tokens that act as a user."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from b2bhub.cli import main
from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import HistoryLine, User, utcnow
from b2bhub.services.errors import Conflict, ServiceError
from b2bhub.services.tokens import create_token
from b2bhub.services.users import check_login, create_user


def test_a_password_is_stored_only_as_a_kdf_hash_and_checked(session):
    user = create_user(session, "alice", "correct horse", "operator")
    session.commit()
    assert "correct horse" not in user.password_hash
    assert user.password_hash.startswith("scrypt:")
    assert check_login(session, "alice", "correct horse").id == user.id
    assert user.last_login_at is not None
    assert check_login(session, "alice", "wrong horse!") is None
    assert check_login(session, "nobody", "correct horse") is None
    user.disabled_at = utcnow()
    assert check_login(session, "alice", "correct horse") is None


@pytest.mark.parametrize(("name", "password", "role", "field"), [
    ("", "long enough", "viewer", "name"),
    ("has space", "long enough", "viewer", "name"),
    ("bob", "short", "viewer", "password"),
    ("bob", "long enough", "root", "role"),
])
def test_bad_user_input_names_the_field(session, name, password, role, field):
    with pytest.raises(ServiceError) as caught:
        create_user(session, name, password, role)
    assert field in caught.value.details
    assert session.scalar(select(User)) is None


def test_a_user_name_is_taken_once(session):
    create_user(session, "alice", "correct horse")
    with pytest.raises(Conflict, match="a user named 'alice' exists already"):
        create_user(session, "alice", "another one")


def test_cli_creates_a_user_from_stdin_and_a_token_acting_as_that_user(app, session):
    runner = app.test_cli_runner()
    result = runner.invoke(main, args=["user", "create", "carol", "--role", "operator"],
                           input="s3cret-pass\n")
    assert result.exit_code == 0, result.output
    assert check_login(session, "carol", "s3cret-pass").role == "operator"

    refused = runner.invoke(main, args=["user", "create", "dave"], input="short\n")
    assert refused.exit_code != 0
    assert "at least 8 characters" in refused.output
    assert session.scalar(select(User).where(User.name == "dave")) is None

    missing = runner.invoke(main, args=["token", "create", "ci", "--user", "nobody"])
    assert missing.exit_code != 0 and "no user named 'nobody'" in missing.output
    token = runner.invoke(main, args=["token", "create", "ci", "--user", "carol"]).output.strip()
    client = app.test_client()
    response = client.get("/api/v1/messages", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200


def test_a_users_token_names_the_user_in_history_and_follows_the_users_role(
        hub, app, session, record_dir):
    hub.parties(organizations=("mycompany",), partners=("acme",))
    hub.instance("inbox", "manual_source")
    hub.instance("writer", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "writer")
    hub.message()
    now = utcnow()
    [claim] = claiming.claim(session, "writer", "w1", now, 1, 300)
    settlement.settle(session, claim, Outcome.failed("boom"), RetryPolicy(), now)
    user = create_user(session, "erin", "long enough pw", "operator")
    token = create_token(session, "erin-laptop", "admin", user=user)
    session.commit()
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {token}"

    assert client.post(f"/api/v1/deliveries/{claim.delivery_id}/redeliver").status_code == 200
    line = session.scalar(select(HistoryLine).where(HistoryLine.type == "redeliver_requested"))
    assert line.actor == "erin"
    # the token asked for admin, but a user's token has the user's role
    assert client.post("/api/v1/partners", json={"name": "x"}).status_code == 403

    user.role = "viewer"
    session.commit()
    assert client.post(f"/api/v1/deliveries/{claim.delivery_id}/cancel").status_code == 403
    user.disabled_at = utcnow()
    session.commit()
    assert client.get("/api/v1/messages").status_code == 401
