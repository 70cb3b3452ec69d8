"""The ``b2bhub`` command: a Flask CLI group (``db`` comes from Flask-Migrate)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys

import click
from flask.cli import FlaskGroup, with_appcontext

from b2bhub import create_app


class _Group(FlaskGroup):
    """Flask's group; ``db upgrade`` goes to every head by default: the core's history
    and each plugin's own branch (b2bhub/plugin/__init__.py, ``migrations``)."""

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        if name == "db" and isinstance(command, click.Group):
            upgrade = command.commands.get("upgrade")
            for param in getattr(upgrade, "params", ()):
                if param.name == "revision" and param.default == "head":
                    param.default = "heads"
        return command


@click.group(cls=_Group, create_app=lambda: create_app(), add_version_option=False)
def main() -> None:
    """b2bhub: the B2B message hub."""


def needs_database(command):
    """Run the command only against a migrated b2bhub database; otherwise say in one
    line where it looked and what to run (instead of a traceback about a missing table,
    and without creating an empty SQLite file where none was)."""
    @functools.wraps(command)
    def checked(*args, **kwargs):
        from flask import current_app
        cfg = current_app.config
        problem = database_problem(cfg)
        if problem:
            if cfg.get("DATA_DIR_MADE"):  # leave no data directory of ours behind
                _remove_made(cfg["DATA_DIR"])
            raise click.ClickException(problem)
        return command(*args, **kwargs)
    return checked


def _remove_made(data_dir: str) -> None:
    """Remove the data directory this process just made, if it holds nothing but the
    secret key it made there too."""
    with contextlib.suppress(OSError):
        if set(os.listdir(data_dir)) <= {"secret_key"}:
            for name in os.listdir(data_dir):
                os.unlink(os.path.join(data_dir, name))
            os.rmdir(data_dir)


def database_problem(cfg) -> str | None:
    """Why the configured database is not a b2bhub database, or None when it is."""
    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from b2bhub.config.extensions import db
    url = make_url(cfg["SQLALCHEMY_DATABASE_URI"])
    where = (f"{url.render_as_string(hide_password=True)} (data directory "
             f"{cfg['DATA_DIR']})")
    hint = ("run `b2bhub db upgrade` (or `make run`) first, or point B2BHUB_DATA_DIR or "
            "B2BHUB_DATABASE_URL at the hub's own")
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
            and not os.path.exists(url.database):
        return f"no b2bhub database at {where}: {hint}"
    try:
        migrated = inspect(db.engine).has_table("alembic_version")
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return f"cannot reach the database {where}: {reason}"
    if not migrated:
        return f"the database {where} has no b2bhub tables: {hint}"
    return None


@main.command("run")
@click.option("--workers", type=int, default=None, help="worker processes (B2BHUB_WORKERS)")
@with_appcontext
def run_command(workers: int | None) -> None:
    """Start web + worker(s) + beat, after migrating the database."""
    from flask import current_app
    from flask_migrate import upgrade

    from b2bhub.runtime.supervisor import Supervisor
    upgrade(revision="heads")
    cfg = current_app.config
    _print_login_hint(cfg)
    sys.exit(Supervisor.for_config(cfg, workers or cfg["WORKERS"]).run())


def _print_login_hint(cfg) -> None:
    """Say where the UI is, and how to make the first user when there is none."""
    from sqlalchemy import func, select

    from b2bhub.config.extensions import db
    from b2bhub.models import User
    click.echo(f"b2bhub UI: http://{cfg['HOST']}:{cfg['PORT']}/ui/")
    if not db.session.scalar(select(func.count(User.id))):
        click.echo("no users yet; create one to log in: "
                   ".venv/bin/b2bhub user create NAME --role admin")
    db.session.rollback()


@main.group("fixtures")
def fixtures_group() -> None:
    """Load organizations, partners, profiles, plugins and routes from JSON."""


@fixtures_group.command("load")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@with_appcontext
@needs_database
def fixtures_load(path: str) -> None:
    """Load a fixtures file; a bad item is named and nothing is created."""
    from b2bhub.config.extensions import db
    from b2bhub.services.errors import ServiceError
    from b2bhub.services.fixtures import load_fixtures
    with open(path, encoding="utf-8") as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise click.ClickException(f"{path} is not valid JSON: {exc}") from exc
    try:
        counts = load_fixtures(db.session, data, actor="fixtures")
    except ServiceError as exc:
        db.session.rollback()
        raise click.ClickException(f"{path}: {exc.message}; nothing was loaded") from exc
    db.session.commit()
    click.echo(", ".join(f"{n} {k}" for k, n in counts.items()))


@main.group("token")
def token_group() -> None:
    """API bearer tokens."""


@token_group.command("create")
@click.argument("name")
@click.option("--role", type=click.Choice(["viewer", "operator", "admin"]), default="admin",
              help="the token's role (ignored with --user: a user's token has the user's role)")
@click.option("--user", "user_name", default=None,
              help="the user the token acts as; history lines name that user")
@click.option("--instance", default=None,
              help="make an intake token of this instance (an http_receiver, say) instead")
@with_appcontext
@needs_database
def token_create(name: str, role: str, user_name: str | None,
                 instance: str | None) -> None:
    """Print a new bearer token (shown once)."""
    from b2bhub.config.extensions import db
    from b2bhub.services.errors import ServiceError
    from b2bhub.services.tokens import create_token
    from b2bhub.services.users import find_user
    if instance is not None:
        from b2bhub.runtime.hub import registry
        from b2bhub.services.intake_tokens import token_keeper
        try:
            keeper = token_keeper(db.session, registry(), instance)
            token = keeper.create_token(db.session, instance, name, _operator())
        except ServiceError as exc:
            raise click.ClickException(str(exc)) from None
        db.session.commit()
        click.echo(token)
        return
    user = None
    if user_name is not None:
        user = find_user(db.session, user_name)
        if user is None:
            raise click.ClickException(f"no user named '{user_name}'")
    token = create_token(db.session, name, role, user=user)
    db.session.commit()
    click.echo(token)


@token_group.command("revoke")
@click.argument("name")
@click.option("--instance", required=True, help="the instance of the token")
@with_appcontext
@needs_database
def token_revoke(name: str, instance: str) -> None:
    """Revoke an intake token of an instance (an http_receiver, say)."""
    from b2bhub.config.extensions import db
    from b2bhub.runtime.hub import registry
    from b2bhub.services.errors import ServiceError
    from b2bhub.services.intake_tokens import token_keeper
    try:
        token_keeper(db.session, registry(), instance).revoke_token(
            db.session, instance, name, _operator())
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from None
    db.session.commit()
    click.echo(f"revoked {name} of {instance}")


def _operator() -> str:
    """The operator a command line action names in its history line."""
    import getpass
    return f"cli:{getpass.getuser()}"


@main.group("user")
def user_group() -> None:
    """People who log in to the UI."""


@user_group.command("create")
@click.argument("name")
@click.option("--role", type=click.Choice(["viewer", "operator", "admin"]), default="viewer")
@with_appcontext
@needs_database
def user_create(name: str, role: str) -> None:
    """Create a user; the password is read from stdin (its first line)."""
    from b2bhub.config.extensions import db
    from b2bhub.services.errors import ServiceError
    from b2bhub.services.users import create_user
    if sys.stdin.isatty():
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    try:
        create_user(db.session, name, password, role)
    except ServiceError as exc:
        db.session.rollback()
        raise click.ClickException(exc.message) from exc
    db.session.commit()
    click.echo(f"user '{name}' created with the {role} role")


@main.command("sweep")
@with_appcontext
@needs_database
def sweep_command() -> None:
    """Run the sweep once (beat runs it every 5 s)."""
    from b2bhub.engine.sweep import run_sweep
    from b2bhub.models import utcnow
    from b2bhub.runtime import hub
    with hub.new_session() as session:
        click.echo(run_sweep(session, utcnow(), hub.process_owner()))


@main.command("cleanup")
@click.option("--dry-run", is_flag=True, help="say what would be removed, remove nothing")
@click.option("--batch", type=click.IntRange(1, 10000), default=None,
              help="messages deleted per transaction, this many each time (default: "
                   "as many as fit in 100 ms, from 500)")
@with_appcontext
def cleanup_command(dry_run: bool, batch: int | None) -> None:
    """Run the nightly cleanup now: messages past retention, unreferenced payload files."""
    from b2bhub.engine.cleanup import BATCH, BATCH_BUDGET, plugin_references, run_cleanup
    from b2bhub.models import utcnow
    from b2bhub.runtime import hub
    with hub.new_session() as session:
        report = run_cleanup(session, hub.store(), utcnow(), hub.process_owner(),
                             dry_run=dry_run, trigger="manual", actor="cli",
                             batch=batch or BATCH, budget=None if batch else BATCH_BUDGET,
                             references=plugin_references(hub.registry()))
    click.echo(report.summary())
    if not report.ran:
        sys.exit(1)
