"""An installation made before protocols became plugins upgrades in place: ``b2bhub db
upgrade`` on a database at the old head (0007) keeps its AS2 profiles, certificates,
messages and AS2 records, and adds the plugins' own branches (the echo test plugin's
table)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from b2bhub import create_app
from b2bhub.models import Certificate, Message, ProtocolProfile, utcnow
from plugins.as2.models import As2Inbound, As2Outbound
from plugins.as2.profile_kind import AS2_PROFILES
from plugins.as2.profiles import save_profile
from tests.as2kit import make_pair
from tests.conftest import IS_POSTGRES, PG_URL, _config

ROOT = Path(__file__).resolve().parent.parent
OLD_HEAD = "0007_deliveries_claimable"


@pytest.fixture
def fresh_database(backend, tmp_path):
    """A database of its own (PostgreSQL: created and dropped here)."""
    if not IS_POSTGRES:
        yield f"sqlite:///{tmp_path / 'old.sqlite'}"
        return
    name = f"b2bhub_upgrade_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(make_url(PG_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _app(backend, url: str, tmp_path):
    return create_app(_config(backend, SQLALCHEMY_DATABASE_URI=url,
                              DATA_DIR=str(tmp_path / "data"),
                              PAYLOAD_DIR=str(tmp_path / "payloads")))


def _make_old_installation(app) -> None:
    from flask_migrate import upgrade

    from b2bhub.config.extensions import db
    from b2bhub.services import config as svc
    upgrade(revision=OLD_HEAD)
    session = db.session
    # the parties and the AS2 profile are written by today's code, through today's models,
    # whose parties have columns added since the old head (the acknowledgment settings):
    # those are there only while it writes, and dropped before the upgrade adds them
    later = ("functional_acks VARCHAR(8) NOT NULL DEFAULT 'none'", "ack_hours INTEGER")
    for column in later:
        session.execute(text(f"ALTER TABLE parties ADD COLUMN {column}"))
    svc.create_party(session, "organization", "mycompany", "")
    svc.create_party(session, "partner", "acme", "")
    cert, key = make_pair("acme.example")
    save_profile(session, "partner", "acme", {"as2_id": "ACME", "url": "https://acme/as2",
                                              "certificate": {"pem": cert}})
    session.flush()
    for column in later:
        session.execute(text(f"ALTER TABLE parties DROP COLUMN {column.split()[0]}"))
    # rows as the old head's code wrote them, in SQL: today's models may have columns
    # the old schema lacks (the upgrade is what adds them)
    now = utcnow()
    message_id = session.execute(text(
        "INSERT INTO messages (source, from_party, to_party, direction, external_id, size, "
        "status, status_text, created_at, updated_at) VALUES ('as2in', 'acme', "
        "'mycompany', 'inbound', '<m1@acme>', 0, 'not_routed', '', :now, :now) "
        "RETURNING id"), {"now": now}).scalar()
    session.execute(text(
        "INSERT INTO alerts (kind, subject, text, message_id, created_at) VALUES "
        "('message_not_routed', :subject, 'no route matched', :id, :now)"),
        {"subject": f"message:{message_id}", "id": message_id, "now": now})
    session.add(As2Inbound(instance="as2in", partner="acme", as2_message_id="<m1@acme>",
                           accepted_key="acme <m1@acme>", message_id=message_id,
                           mdn_state="none", mdn_attempts=0, mdn_last_error=""))
    session.add(As2Outbound(message_id=message_id, target="as2out", partner="acme",
                            as2_message_id="<o1@hub>", mdn_signed=True))
    # what the code of the old head named the profiles version
    session.execute(text("DELETE FROM settings WHERE key = 'profiles_version'"))
    session.execute(text("INSERT INTO settings (key, value, updated_at) VALUES "
                         "('as2_profiles_version', '\"v1\"', :now)"), {"now": utcnow()})
    session.commit()
    db.engine.dispose()


def _core_head() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    config = Config()
    config.set_main_option("script_location", str(ROOT / "migrations"))
    [head] = ScriptDirectory.from_config(config).get_heads()
    return head


def test_b2bhub_db_upgrade_keeps_the_as2_data_of_an_old_installation(
        backend, fresh_database, tmp_path):
    app = _app(backend, fresh_database, tmp_path)
    with app.app_context():
        _make_old_installation(app)
    env = {**os.environ, "B2BHUB_DATABASE_URL": fresh_database,
           "B2BHUB_DATA_DIR": str(tmp_path / "data"),
           "B2BHUB_BROKER_URL": backend["broker_url"], "B2BHUB_SECRET_KEY": "test"}
    done = subprocess.run([str(Path(sys.executable).with_name("b2bhub")), "db", "upgrade"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    app = _app(backend, fresh_database, tmp_path)
    with app.app_context():
        from b2bhub.config.extensions import db
        session = db.session
        heads = {r[0] for r in session.execute(text("SELECT version_num FROM alembic_version"))}
        assert heads == {_core_head(), "e001_echo_receipts"}
        shown = AS2_PROFILES.get(session, "partner", "acme")
        assert shown["as2_id"] == "ACME" and shown["url"] == "https://acme/as2"
        assert [c["subject"] for c in shown["certificates"]] == ["CN=acme.example"]
        assert session.scalar(select(Certificate.pem)).startswith("-----BEGIN CERTIFICATE")
        assert session.scalar(select(ProtocolProfile.protocol)) == "as2"
        message = session.scalar(select(Message))
        assert message.external_id == "<m1@acme>"
        alert = session.scalar(text("SELECT notified_at FROM alerts"))
        assert alert is not None  # an old alert counts as notified: no flood at upgrade
        inbound = session.scalar(select(As2Inbound))
        assert (inbound.message_id, inbound.accepted_key) == (message.id, "acme <m1@acme>")
        assert session.scalar(select(As2Outbound.as2_message_id)) == "<o1@hub>"
        keys = set(session.scalars(text("SELECT key FROM settings")))
        assert "profiles_version" in keys and "as2_profiles_version" not in keys
        assert session.execute(text("SELECT count(*) FROM echo_receipts")).scalar() == 0
        db.engine.dispose()
