"""Login, logout and the user behind a session."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from flask import flash, redirect, render_template, request, url_for
from flask_babel import gettext as _
from flask_login import login_user, logout_user

from b2bhub.config.extensions import db, login_manager
from b2bhub.models import User
from b2bhub.web.forms import LoginForm
from b2bhub.web.kit import bp, requires


@dataclass(frozen=True)
class SessionUser:
    """What a request knows of its user: read from the database on every request."""

    id: int
    name: str
    role: str
    language: str | None = None
    is_authenticated: bool = True
    is_active: bool = True
    is_anonymous: bool = False

    def get_id(self) -> str:
        return str(self.id)


@login_manager.user_loader
def load_user(user_id: str) -> SessionUser | None:
    user = db.session.get(User, int(user_id)) if user_id.isdigit() else None
    if user is None or user.disabled_at is not None:
        return None
    return SessionUser(user.id, user.name, user.role, user.language)


@bp.route("/login", methods=["GET", "POST"])
def login():
    form = LoginForm()
    if form.validate_on_submit():
        from b2bhub.services.users import check_login
        user = check_login(db.session, form.name.data, form.password.data)
        if user is not None:
            db.session.commit()
            login_user(SessionUser(user.id, user.name, user.role, user.language))
            return redirect(_safe_next(form.next.data))
        form.password.errors.append(_("wrong user name or password"))
    elif request.method == "GET":
        form.next.data = request.args.get("next", "")
    return render_template("ui/login.html", form=form), 200 if not form.errors else 400


def _safe_next(target: str | None) -> str:
    """Only a path on this site: a login link must not send the user elsewhere."""
    parts = urlsplit(target or "")
    if parts.scheme or parts.netloc or not (target or "").startswith("/") or \
            target.startswith(("//", "/\\")):
        return url_for("ui.dashboard")
    return target


@bp.post("/logout")
@requires("viewer")
def logout():
    logout_user()
    flash(_("You are logged out."))
    return redirect(url_for("ui.login"))
