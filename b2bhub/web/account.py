"""The user's own settings: the language the UI is shown in (docs/i18n.md)."""

from __future__ import annotations

from contextlib import nullcontext

from flask import flash, g, redirect, render_template, url_for
from flask_babel import force_locale
from flask_babel import gettext as _
from flask_babel import lazy_gettext as _l
from flask_login import current_user
from flask_wtf import FlaskForm
from wtforms import SelectField

from b2bhub.config.extensions import db
from b2bhub.domain import i18n
from b2bhub.models import User
from b2bhub.web.kit import bp, form_status, record_change, requires


class LanguageForm(FlaskForm):
    language = SelectField(
        _l("Language"), validate_choice=True,
        description=_l("the language of these pages; the browser's: the first language "
                       "your browser asks for that the hub has, else English"))


def _describe(language: str | None) -> str:
    return i18n.LANGUAGES.get(language or "", "the browser's")


@bp.route("/account", methods=["GET", "POST"])
@requires("viewer")
def account():
    form = LanguageForm(data={"language": current_user.language or ""})
    form.language.choices = [("", _("The browser's language"))] + [
        (code, name) for code, name in i18n.LANGUAGES.items()]
    if form.validate_on_submit():
        user = db.session.get(User, current_user.id)
        user.language = form.language.data or None
        # the history line as the database keeps every line: in English
        record_change(f"set the language of user {user.name} to "
                      f"{user.language or _describe(None)}")
        db.session.commit()
        # said in the language the next page is shown in
        with force_locale(user.language) if user.language else nullcontext():
            flash(_("Language saved."))
        return redirect(url_for("ui.account"))
    return render_template("ui/account.html", form=form, user=current_user,
                           actor=g.actor), form_status(form)
