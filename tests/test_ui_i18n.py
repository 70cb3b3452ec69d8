"""The UI in English and Brazilian Portuguese (issue 40, item 2; docs/i18n.md).

The language is the user's own setting, else the browser's Accept-Language, else
English. Every page renders in pt_BR with Portuguese text, while status identifiers,
API fields and what the database stores stay as they are; dates and numbers take the
language's form; a change made in Portuguese is stored in English and flashed in
Portuguese.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

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


def test_a_services_refusals_in_portuguese_and_in_english_in_the_api(setup, login, api):
    """The services' refusals (a taken name, an unknown party, a bad configuration
    value, a name against the rule) are written once, in English: the API answers them
    so, a Portuguese page shows them in Portuguese, beside their fields."""
    client = login("admin", "ada", PT)

    def seen(response) -> str:
        return html.unescape(text_of(response.text))

    def post(path, page, data, prefix=""):
        token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"',
                          client.get(page).text).group(1)
        return client.post(path, data={f"{prefix}csrf_token": token, **data})

    taken = post("/ui/parties/partner", "/ui/parties", {
        "partner-name": "acme", "partner-display_name": "Acme"}, "partner-")
    assert "já existe uma parte chamada 'acme'" in seen(taken)
    unknown = post("/ui/routes/new", "/ui/routes/new", {
        "source": "inbox", "from_party": "nobody", "to_party": "*", "target": "writer_a",
        "document_type": "*"})
    assert unknown.status_code == 400
    assert "from: não há parte chamada 'nobody'" in seen(unknown)
    bad = post("/ui/plugins/new/file_poller", "/ui/plugins/new/file_poller", {
        "name": "Poller One", "config-base_directory": "/tmp/in",
        "config-polling_interval": "0", "duplicate_days": "30"})
    shown = seen(bad)
    assert "deve ter de 1 a 64 caracteres" in shown  # the name rule, beside Name
    assert "deve ser no mínimo" in shown  # a configuration field's bound
    assert "must " not in shown and "exists already" not in seen(taken)
    answer = api.post("/api/v1/partners", json={"name": "acme"}, headers=PT).get_json()
    assert answer["error"]["message"] == "a party named 'acme' exists already"
    # the patterns' own rules: a poller's path pattern, a writer's file name pattern
    pattern = post("/ui/plugins/new/file_poller", "/ui/plugins/new/file_poller", {
        "name": "poller_two", "config-base_directory": "/tmp/in",
        "config-polling_interval": "10", "config-path_pattern": "/abs/{filename}",
        "duplicate_days": "30"})
    assert "'/abs/{filename}' é absoluto; informe um caminho relativo ao diretório base" \
        in seen(pattern)
    from babel.support import Translations

    from b2bhub.domain.i18n import shown as shown_in
    from plugins.file_writer import FileWriter
    [check] = [f.validate for f in FileWriter.config_schema if f.name == "filename_pattern"]
    portuguese = Translations.load(str(Path(__file__).resolve().parent.parent / "b2bhub"
                                       / "translations"), ["pt_BR"])
    assert shown_in(check("{nope}.xml"), portuguese.gettext).startswith(
        "marcador desconhecido {nope} no padrão de nome de arquivo")
    policy = post("/ui/plugins/new/as2_sender", "/ui/plugins/new/as2_sender", {
        "name": "as2_out", "max_concurrent_deliveries": "4",
        "retry_policy": '{"max_attempts": 0}'})
    assert "max_attempts precisa ser um número inteiro >= 1, recebido 0" in seen(policy)
    refused = api.post("/api/v1/plugins/configs", json={
        "name": "poller_three", "type": "file_poller",
        "config": {"base_directory": "/tmp/in", "path_pattern": "/abs/{filename}"}},
        headers=PT).get_json()
    assert "'/abs/{filename}' is absolute" in json.dumps(refused), refused


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


def test_business_rule_refusals_in_portuguese_and_in_english_in_the_api(setup, login, api,
                                                                         registry):
    """A target's business rules refused on save: each bad rule and why, beside the
    field in Portuguese; the API answers the same refusal in English."""
    import b2bhub_testplugins as testplugins
    registry.register(testplugins.AnswerPoster)
    client = login("admin", "ada", PT)
    page = client.get("/ui/plugins/new/answer_poster").text
    token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', page).group(1)
    rules = [{"name": "bad", "body_regex": "[unclosed"}, {"name": "far", "status": 700},
             {"name": "odd", "status": 200, "regex": "a"}, {"status": 500}]
    refused = client.post("/ui/plugins/new/answer_poster", data={
        "csrf_token": token, "name": "poster", "enabled": "y",
        "config-url": "http://127.0.0.1:9/x", "max_concurrent_deliveries": "1",
        "retry_policy": "", "business_rules": json.dumps(rules)})
    assert refused.status_code == 400
    shown = html.unescape(text_of(refused.text))
    assert ("regra 1 (bad): body_regex não é uma expressão regular válida: "
            "unterminated character set at position 9") in shown
    assert ("regra 2 (far): status deve ser um status HTTP (100-599) ou uma classe como "
            "'2xx', não 700") in shown
    assert ("regra 3 (odd): campo(s) desconhecido(s) regex (conhecidos: name, status, "
            "body_regex, json_path, json_value, block)") in shown
    assert "regra 4: o nome é obrigatório" in shown
    assert "rule 1" not in shown and "is not a valid" not in shown
    answer = api.post("/api/v1/plugins/configs", json={
        "name": "poster", "type": "answer_poster", "config": {"url": "http://x"},
        "business_rules": rules}, headers=PT).get_json()
    assert answer["error"]["details"]["business_rules"]["rule 2 (far)"] == (
        "status must be an HTTP status (100-599) or a class such as '2xx', not 700")
    assert "rule 1 (bad): body_regex is not a valid regular expression" in \
        answer["error"]["message"]


def test_certificate_upload_refusals_in_portuguese_and_in_english_in_the_api(setup, login,
                                                                            api):
    """A file that is not a certificate, a key pair without its key: refused beside the
    upload in Portuguese; the API refuses the same upload in English."""
    import io

    from tests.as2kit import make_pair
    client = login("admin", "ada", PT)
    form = {"as2_id": "ACME", "url": "https://acme.example/as2", "sign": "y",
            "digest_alg": "sha256", "encrypt": "y", "encryption_alg": "aes_256_cbc",
            "mdn_mode": "sync", "mdn_signed": "y", "mdn_digest_alg": "sha256",
            "receipt_timeout": "86400", "chunked": "y",
            "content_type": "application/edi-consent", "subject": "AS2 Message"}

    def post(url, **files):
        return client.post(url, data={**form, **files}, content_type="multipart/form-data")

    def error_beside(page, field) -> str:
        found = re.search(rf'id="{field}".*?<span class="error">(.*?)</span>', page.text,
                          re.S)
        return html.unescape(found.group(1))

    text = post("/ui/parties/partner/acme/as2",
                certificate_file=(io.BytesIO(b"just some text\n"), "notes.txt"))
    assert text.status_code == 400
    assert error_beside(text, "certificate_file") == (
        "não é um certificado: esperava-se um certificado PEM ou DER ou um arquivo PKCS#12 "
        "(.p12, .pfx)")
    cert, _key = make_pair("p12.example")
    unkeyed = post("/ui/parties/organization/mycompany/as2",
                   certificate_file=(io.BytesIO(cert.encode()), "ours.crt"))
    assert unkeyed.status_code == 400
    assert error_beside(unkeyed, "certificate_file") == (
        "o nosso próprio certificado deve vir com a sua chave privada")
    bad_pem = post("/ui/parties/partner/acme/as2",
                   certificate_file=(io.BytesIO(b"-----BEGIN CERTIFICATE-----\nxx\n"),
                                     "bad.pem"))
    assert error_beside(bad_pem, "certificate_file").startswith(
        "não é um certificado PEM: ")
    answer = api.put("/api/v1/partners/acme/profiles/as2", json={
        "as2_id": "ACME", "url": "https://acme.example/as2",
        "certificate": {"pem": cert, "role": "everything"}}, headers=PT).get_json()
    assert answer["error"]["message"] == (
        "a certificate's role must be one of both, signing, encryption")


def test_plugin_and_service_refusals_in_portuguese(setup, login, session):
    """Refusals of the expected-message rules, the AS2 connection test, the HTTP
    receiver's tokens and the SFTP writer's actions: English as the API and the command
    line answer them, Portuguese on a page read in Portuguese."""
    from babel.support import Translations

    from b2bhub.domain.i18n import shown as shown_in
    from b2bhub.services.errors import ServiceError
    from plugins import http_receiver
    from plugins.sftp.writer import SftpWriter
    client = login("admin", "ada", PT)

    def token_of(page) -> str:
        return re.search(r'name="csrf_token"[^>]*value="([^"]+)"', page).group(1)

    rule = client.post("/ui/alerts/expected", data={
        "csrf_token": token_of(client.get("/ui/alerts").text), "name": "invoices",
        "direction": "inbound", "from_party": "nobody", "to_party": "*", "filename": "*",
        "document_type": "*", "schedule": "every day", "timezone": "UTC",
        "after_direction": ""})
    assert rule.status_code == 400
    seen = html.unescape(text_of(rule.text))
    assert "nenhum participante chamado 'nobody'" in seen
    assert "o agendamento 'every day' não é uma expressão cron de cinco campos" in seen
    untested = client.post("/ui/parties/partner/acme/as2/test", data={
        "csrf_token": token_of(client.get("/ui/parties/partner/acme/as2").text)},
        follow_redirects=True)
    assert "o parceiro 'acme' não tem perfil AS2" in html.unescape(text_of(untested.text))

    portuguese = Translations.load(str(Path(__file__).resolve().parent.parent / "b2bhub"
                                       / "translations"), ["pt_BR"]).gettext
    with pytest.raises(ServiceError) as no_receiver:
        http_receiver.create_token(session, "inbox", "ci", "ada")
    assert no_receiver.value.message == "no http_receiver instance named 'inbox'"
    assert shown_in(no_receiver.value.message, portuguese) == (
        "não há instância http_receiver chamada 'inbox'")
    with pytest.raises(ServiceError) as by_partner:
        SftpWriter.action_refused({"connection": "partner"})
    assert shown_in(by_partner.value.message, portuguese) == (
        "este gravador se conecta como diz o perfil SFTP de cada parceiro: fixe a chave do "
        "host no perfil do parceiro")


def test_a_receipt_that_settles_nothing_is_a_portuguese_line_on_the_message_page(
        setup, login, session):
    """The engine's line for a receipt reported for a delivery already delivered, stored
    in English, on the message page of a Portuguese reader."""
    from b2bhub.engine import operator
    message = setup.message()
    now = utcnow()
    [claim] = claiming.claim(session, "writer_a", "w1", now, 1, 300)
    settlement.settle(session, claim, Outcome.delivered(), RetryPolicy(), now)
    with pytest.raises(operator.ReceiptRefused):
        operator.record_receipt(session, claim.delivery_id, False, "", "erp", now)
    session.commit()
    client = login("viewer", "vic", PT)
    shown = html.unescape(text_of(client.get(f"/ui/messages/{message.id}").text))
    assert ("writer_a: o recibo None não pode ser atribuído: a entrega está Entregue; erp "
            "informou o recibo: falhou") in shown


def test_a_route_named_in_a_sentence_is_described_in_portuguese(setup, login, session,
                                                                 record_dir):
    """A route's description inside the refusal of a redundant route, the flash of its
    save and its history line: Portuguese on the page, English as stored."""
    from b2bhub.domain.i18n import show_history_text, translations
    setup.instance("writer_b", "recorder", config={"record_dir": str(record_dir)})
    client = login("admin", "ada", PT)
    portuguese = translations("pt_BR").gettext

    def post(data):
        token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"',
                          client.get("/ui/routes/new").text).group(1)
        return html.unescape(text_of(client.post(
            "/ui/routes/new", data={"csrf_token": token, **data}, follow_redirects=True
        ).text))

    route = {"source": "inbox", "from_party": "acme", "to_party": "mycompany",
             "document_type": "850"}
    redundant = post({**route, "target": "writer_a"})
    assert "redundante com a rota 1: inbox, * -> *, writer_a" in redundant
    assert "redundant with" not in redundant
    saved = post({**route, "target": "writer_b"})
    line = session.scalars(select(HistoryLine.text).where(
        HistoryLine.type == "config_changed").order_by(HistoryLine.id.desc())).first()
    number = re.search(r"route (\d+)", line).group(1)
    assert line == f"ada: saved route {number}: inbox, acme -> mycompany, 850, writer_b"
    assert f"Rota {number}: inbox, acme -> mycompany, 850, writer_b salva" in saved
    assert show_history_text(line, portuguese) == (
        f"ada: rota {number}: inbox, acme -> mycompany, 850, writer_b salva")
    assert show_history_text("ada: created route 7: inbox, * -> acme, writer_a",
                             portuguese) == "ada: rota 7: inbox, * -> acme, writer_a criada"


def test_sftp_key_refusals_in_portuguese(setup, login, registry):
    """A private key that cannot be read and a host key that is not one: refused on a
    partner's SFTP profile page in Portuguese; the refusal's text is English as such."""
    from plugins.sftp.connection import HostKey, host_key_problem
    from plugins.sftp.writer import SftpWriter
    registry.register(SftpWriter)
    client = login("admin", "ada", PT)
    page = client.get("/ui/parties/partner/acme/sftp").text
    token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', page).group(1)
    form = html.unescape(text_of(page))
    assert "Tempo limite de conexão (segundos)" in form  # the form's labels
    for english in ("Connect timeout (seconds)", "Close when idle",
                    "leave empty to keep the stored one"):
        assert english not in form, english
    refused = client.post("/ui/parties/partner/acme/sftp", data={
        "csrf_token": token, "host": "127.0.0.1", "port": "22", "username": "acme",
        "private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n"})
    assert refused.status_code == 400
    shown = html.unescape(text_of(refused.text))
    assert "não foi possível ler a chave privada: " in shown, shown
    assert "cannot be read" not in shown
    with pytest.raises(ValueError) as garbage:
        HostKey.parse("ssh-ed25519 !!")
    assert garbage.value.args[0] == "the key after the type is not base64"
    from b2bhub.domain.i18n import shown as shown_in
    from b2bhub.domain.i18n import translations
    assert shown_in(host_key_problem("one\ntwo"), translations("pt_BR").gettext) == (
        "informe uma única chave de host (uma linha)")


def test_stopping_a_disabled_instance_is_refused_in_portuguese(setup, login, record_dir):
    """The engine's refusal to stop an instance that is disabled, flashed on the
    Services page in Portuguese."""
    setup.instance("writer_off", "recorder", enabled=False,
                   config={"record_dir": str(record_dir)})
    client = login("admin", "ada", PT)
    token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"',
                      client.get("/ui/system/services").text).group(1)
    refused = client.post("/ui/system/instances/writer_off/stop",
                          data={"csrf_token": token}, follow_redirects=True)
    shown = html.unescape(text_of(refused.text))
    assert 'writer_off está desativada; ative-a primeiro (PUT com "enabled": true)' in shown


def test_the_route_testers_reasons_in_portuguese(setup, login, api):
    """Why a route does not take a message, on the route tester's page in Portuguese;
    the API's answer in English."""
    client = login("viewer", "vic", PT)
    page = client.get("/ui/routes", query_string={
        "test_source": "other", "test_from": "acme", "test_to": "mycompany",
        "test_types": "850"})
    shown = html.unescape(text_of(page.text))
    assert "source 'other' não corresponde a 'inbox'" in shown
    assert "does not match" not in shown
    answer = api.post("/api/v1/routes/test", json={
        "source": "other", "from": "acme", "to": "mycompany"}, headers=PT).get_json()
    assert answer["routes"][0]["reason"] == "source 'other' does not match 'inbox'"
