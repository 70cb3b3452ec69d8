"""The UI in English and Brazilian Portuguese (issue 40, item 2; docs/i18n.md).

The language is the user's own setting, else the browser's Accept-Language, else
English. Every page renders in pt_BR with Portuguese text, while status identifiers,
API fields and what the database stores stay as they are; dates and numbers take the
language's form; a change made in Portuguese is stored in English and flashed in
Portuguese.
"""

from __future__ import annotations

import re

import pytest
from flask import g
from sqlalchemy import select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import HistoryLine, User, utcnow
from b2bhub.services.users import create_user

PASSWORD = "correct horse battery"
PT = {"Accept-Language": "pt-BR,pt;q=0.9,en;q=0.8"}
PAGES = ["/ui/", "/ui/messages", "/ui/delivery-errors", "/ui/routes", "/ui/routes/new",
         "/ui/plugins", "/ui/parties", "/ui/parties/acme", "/ui/system/services",
         "/ui/system/settings", "/ui/system/notifications", "/ui/logs", "/ui/alerts",
         "/ui/storage", "/ui/messages/send", "/ui/account",
         "/ui/parties/partner/acme", "/ui/parties/partner/acme/as2",
         "/ui/plugins/new/file_poller"]


@pytest.fixture(autouse=True)
def fresh_user_per_request(app):
    @app.before_request
    def forget_user() -> None:
        g.pop("_login_user", None)
        g.pop("_flashes", None)
        g.pop("_flask_babel", None)  # the language is chosen per request


@pytest.fixture
def login(app, session):
    def log_in(role: str, name: str, headers: dict | None = None):
        create_user(session, name, PASSWORD, role)
        session.commit()
        client = app.test_client()
        if headers:
            client.environ_base.update(
                {"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()})
        response = client.post("/ui/login", data={"name": name, "password": PASSWORD})
        assert response.status_code == 302, response.text
        return client
    return log_in


@pytest.fixture
def setup(hub, record_dir, registry):
    from plugins.as2.plugin import As2Receiver, As2Sender
    from plugins.file_poller import FilePoller
    for cls in (FilePoller, As2Receiver, As2Sender):  # ours: their texts are in the catalog
        registry.register(cls)
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    hub.instance("inbox", "manual_source")
    hub.instance("writer_a", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "writer_a")
    return hub


def failed_message(hub, session):
    message = hub.message()
    now = utcnow()
    [claim] = claiming.claim(session, "writer_a", "w1", now, 1, 300)
    settlement.settle(session, claim, Outcome.failed("disk full"), RetryPolicy(), now)
    session.commit()
    return message


def text_of(html: str) -> str:
    """What a reader sees: the page without its tags."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


@pytest.mark.parametrize("path", PAGES)
def test_every_page_renders_in_portuguese(setup, login, path):
    client = login("admin", "ada", PT)
    page = client.get(path)
    assert page.status_code == 200, page.text
    assert '<html lang="pt-BR">' in page.text
    shown = text_of(page.text)
    for word in ("Mensagens", "Erros de entrega", "Participantes", "Configurações", "Sair"):
        assert word in shown  # the navigation
    for english in ("Delivery errors", "Log out", "Settings"):
        assert english not in shown


def test_the_message_pages_show_labels_and_keep_identifiers(setup, login, session):
    message = failed_message(setup, session)
    client = login("operator", "olga", PT)
    listed = client.get("/ui/messages").text
    row = re.search(rf'<tr data-id="{message.id}".*?</tr>', listed, re.S).group(0)
    assert 'class="status s-error" data-status="error">Erro de entrega<' in row
    assert 'data-state="failed">Falhou<' in row
    assert "?status=not_routed" in listed or 'value="not_routed"' in listed  # identifiers
    assert '<option value="not_routed">Sem rota</option>' in listed

    page = client.get(f"/ui/messages/{message.id}").text
    shown = text_of(page)
    assert f"Mensagem {message.id}" in shown and "Entregas" in shown and "Histórico" in shown
    assert "Reprocessar" in shown and "Reencaminhar" in shown
    # the history: the line types as stored, the engine's known texts in Portuguese with
    # the stored text kept in the title
    assert "<td>delivery_changed</td>" in page and "<td>received</td>" in page
    assert "writer_a: na fila" in shown
    assert 'title="writer_a: queued"' in page
    assert "disk full" in shown  # a destination's reason, as stored
    stored = session.scalars(select(HistoryLine.text).where(
        HistoryLine.message_id == message.id)).all()
    assert "writer_a: queued" in stored and not any("fila" in t for t in stored)

    errors = client.get("/ui/delivery-errors").text
    assert "1 encontradas" in text_of(errors) and 'data-status="failed">Falhou<' in errors
    assert 'name="delivery"' in errors and 'name="kind"' in errors  # the form's fields


def test_dates_and_numbers_take_the_languages_form(setup, login, session):
    message = failed_message(setup, session)
    created = message.created_at
    english = login("admin", "ada").get("/ui/messages").text
    assert created.strftime("%Y-%m-%d %H:%M:%S") in english
    portuguese = login("admin", "bia", PT).get("/ui/messages").text
    assert created.strftime("%d/%m/%Y %H:%M:%S") in portuguese
    assert created.strftime("%Y-%m-%d %H:%M:%S") not in portuguese

    with setup.app.test_request_context(headers=PT):
        g.pop("_flask_babel", None)
        from b2bhub.web import _decimal1, _number, _percent, _size
        assert (_number(1234567), _size(1536), _percent(0.666), _decimal1(2.25)) == \
            ("1.234.567", "1,5 KB", "67 %", "2,2")
    with setup.app.test_request_context(headers={"Accept-Language": "en"}):
        g.pop("_flask_babel", None)
        assert (_number(1234567), _size(1536), _percent(0.666)) == \
            ("1,234,567", "1.5 KB", "67 %")


@pytest.mark.parametrize("header, lang", [
    ("pt-BR", "pt-BR"), ("pt", "pt-BR"), ("pt-PT,en;q=0.5", "pt-BR"), ("en-US", "en"),
    ("de-DE", "en"), ("fr, pt;q=0.3", "pt-BR"),
])
def test_the_browsers_language_chooses_the_page(app, client, header, lang):
    page = client.get("/ui/login", headers={"Accept-Language": header})
    assert f'<html lang="{lang}">' in page.text
    assert ("Usuário" in page.text) is (lang == "pt-BR")


def test_no_accept_language_is_english(app, client):
    page = client.get("/ui/login")
    assert '<html lang="en">' in page.text and "User name" in page.text


def test_the_users_setting_wins_and_is_recorded(setup, login, session):
    client = login("viewer", "vic", {"Accept-Language": "en-US"})
    assert "Dashboard" in text_of(client.get("/ui/").text)
    form = client.get("/ui/account").text
    token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', form).group(1)
    saved = client.post("/ui/account", data={"csrf_token": token, "language": "pt_BR"},
                        follow_redirects=True)
    assert saved.status_code == 200
    assert "Idioma salvo." in saved.text and '<html lang="pt-BR">' in saved.text
    assert session.scalar(select(User.language).where(User.name == "vic")) == "pt_BR"
    line = session.scalars(select(HistoryLine).where(HistoryLine.type == "config_changed")
                           .order_by(HistoryLine.id.desc())).first()
    assert (line.actor, line.text) == ("vic", "vic: set the language of user vic to pt_BR")
    # the setting beats the browser's English, on every page
    assert "Painel" in text_of(client.get("/ui/").text)
    # and back to the browser's language
    token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', saved.text).group(1)
    client.post("/ui/account", data={"csrf_token": token, "language": ""})
    assert session.scalar(select(User.language).where(User.name == "vic")) is None
    assert "Dashboard" in text_of(client.get("/ui/").text)
    refused = client.post("/ui/account", data={"csrf_token": token, "language": "xx"})
    assert refused.status_code == 400


def test_a_change_is_stored_in_english_and_flashed_in_portuguese(setup, login, session):
    client = login("admin", "ada", PT)
    form = client.get("/ui/parties").text
    token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', form).group(1)
    done = client.post("/ui/parties/partner", data={
        "partner-csrf_token": token, "partner-name": "initech",
        "partner-display_name": "Initech"}, follow_redirects=True)
    assert "Parceiro initech criado" in text_of(done.text)
    line = session.scalars(select(HistoryLine).where(HistoryLine.type == "config_changed")
                           .order_by(HistoryLine.id.desc())).first()
    assert line.text == "ada: created partner initech"


def test_a_form_with_errors_in_portuguese(setup, login):
    client = login("admin", "ada", PT)
    form = client.get("/ui/plugins/new/file_poller").text
    assert "Diretório base (obrigatório)" in text_of(form)  # a plugin schema's label
    token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', form).group(1)
    refused = client.post("/ui/plugins/new/file_poller", data={
        "csrf_token": token, "name": "poller", "config-base_directory": "/tmp/in",
        "retention_days": "many", "duplicate_days": "30"})
    assert refused.status_code == 400
    assert "deve ser um número inteiro" in text_of(refused.text)
    bad_login = client.application.test_client().post(
        "/ui/login", data={"name": "ada", "password": "wrong"}, headers=PT)
    assert "usuário ou senha incorretos" in bad_login.text


def test_error_pages_in_portuguese(setup, login):
    client = login("viewer", "vic", PT)
    missing = client.get("/ui/messages/999999")
    assert missing.status_code == 404
    assert "a mensagem 999999 não existe" in missing.text and "Não encontrado" in missing.text
    forbidden = client.post("/ui/routes/new")
    assert forbidden.status_code == 403
    assert "isto exige o papel admin" in forbidden.text


def test_the_api_is_never_translated(setup, api, session):
    message = failed_message(setup, session)
    answer = api.get(f"/api/v1/messages/{message.id}", headers=PT).get_json()
    assert answer["status"] == "error"
    assert answer["deliveries"][0]["state"] == "failed"
    missing = api.get("/api/v1/messages/999999", headers=PT).get_json()
    assert "não" not in str(missing)
