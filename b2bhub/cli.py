"""The ``b2bhub`` command: a Flask CLI group (``db`` comes from Flask-Migrate)."""

from __future__ import annotations

import json
import sys

import click
from flask.cli import FlaskGroup, with_appcontext

from b2bhub import create_app


class _Group(FlaskGroup):
    """Flask's group; ``db upgrade`` goes to every head by default: the core's history
    and each plugin's own branch (b2bhub/plugin_api.py, ``migrations``)."""

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


@main.command("run")
@click.option("--workers", type=int, default=None, help="worker processes (B2BHUB_WORKERS)")
@with_appcontext
def run_command(workers: int | None) -> None:
    """Start web + worker(s) + beat, after migrating the database."""
    from flask import current_app
    from flask_migrate import upgrade

    from b2bhub.supervisor import Supervisor
    upgrade(revision="heads")
    cfg = current_app.config
    _print_login_hint(cfg)
    sys.exit(Supervisor.for_config(cfg, workers or cfg["WORKERS"]).run())


def _print_login_hint(cfg) -> None:
    """Say where the UI is, and how to make the first user when there is none."""
    from sqlalchemy import func, select

    from b2bhub.extensions import db
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
def fixtures_load(path: str) -> None:
    """Load a fixtures file; a bad item is named and nothing is created."""
    from b2bhub.extensions import db
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
@with_appcontext
def token_create(name: str, role: str, user_name: str | None) -> None:
    """Print a new bearer token (shown once)."""
    from b2bhub.extensions import db
    from b2bhub.services.tokens import create_token
    from b2bhub.services.users import find_user
    user = None
    if user_name is not None:
        user = find_user(db.session, user_name)
        if user is None:
            raise click.ClickException(f"no user named '{user_name}'")
    token = create_token(db.session, name, role, user=user)
    db.session.commit()
    click.echo(token)


@main.group("user")
def user_group() -> None:
    """People who log in to the UI."""


@user_group.command("create")
@click.argument("name")
@click.option("--role", type=click.Choice(["viewer", "operator", "admin"]), default="viewer")
@with_appcontext
def user_create(name: str, role: str) -> None:
    """Create a user; the password is read from stdin (its first line)."""
    from b2bhub.extensions import db
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
def sweep_command() -> None:
    """Run the sweep once (beat runs it every 5 s)."""
    from b2bhub import hub
    from b2bhub.engine.sweep import run_sweep
    from b2bhub.models import utcnow
    with hub.new_session() as session:
        click.echo(run_sweep(session, utcnow(), hub.process_owner()))
