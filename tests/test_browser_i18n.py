"""The UI in Brazilian Portuguese in a real browser against a real hub on loopback
(gunicorn, a worker and beat): issue 40, item 2; docs/i18n.md.

A browser that asks for pt-BR gets the dashboard, the messages list, a failed message,
the delivery errors and a refused form in Portuguese, with the status identifiers and
field names a script relies on untouched; a browser that asks for English gets English;
a user's own setting wins over the browser's. Screenshots go to ``test-artifacts/``
(``i18n-*``) for a person to read.
"""

from __future__ import annotations

import shutil

import pytest
from sqlalchemy import select

from b2bhub.models import Delivery, User
from tests import test_browser as kit
from tests.procs import wait_until

pytestmark = pytest.mark.processes
hub_url, shot, drop, wait_for_message, fresh = (kit.hub_url, kit.shot, kit.drop,
                                                kit.wait_for_message, kit.fresh)


@pytest.fixture
def files(hub, registry, tmp_path):
    """poller (``{to}/{filename}``) → writer, one attempt per delivery."""
    from plugins.file_poller import FilePoller
    from plugins.file_writer import FileWriter

    for cls in (FilePoller, FileWriter):
        registry.register(cls)
    hub.parties(organizations=("mycompany",), partners=("acme",))
    inbox, out = tmp_path / "in", tmp_path / "out"
    hub.instance("poller", "file_poller", config={
        "base_directory": str(inbox), "polling_interval": 1, "path_pattern": "{to}/{filename}"})
    hub.instance("writer", "file_writer", config={
        "base_directory": str(out), "filename_pattern": "{to}/{original_filename}"},
        retry_policy={"strategy": "fixed", "base_delay": 1, "max_attempts": 1})
    hub.route("poller", "*", "*", "writer")
    return inbox, out


def page_in(browser, url: str, user: str, locale: str):
    """A browser whose language is ``locale`` (its Accept-Language), logged in."""
    context = browser.new_context(viewport={"width": 1366, "height": 800}, base_url=url,
                                  locale=locale)
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.goto("/ui/")
    page.fill("#name", user)
    page.fill("#password", kit.PASSWORD)
    page.click("form button")
    page.wait_for_url("**/ui/")
    return page


def nav(page) -> list[str]:
    return page.locator("header nav a").all_inner_texts()


def test_the_pages_in_brazilian_portuguese(browser, hub_url, files):
    inbox, out = files
    page = page_in(browser, hub_url, "ada", "pt-BR")
    assert page.get_attribute("html", "lang") == "pt-BR"
    assert nav(page)[:3] == ["Painel", "Mensagens", "Erros de entrega"]

    drop(inbox, "pedido-1.edi", b"UNB+UNOA:2+ACME'")
    first = wait_for_message("pedido-1.edi")
    wait_until(lambda: (out / "acme" / "pedido-1.edi").exists(), 60, "delivered")
    shutil.rmtree(out / "acme")
    (out / "acme").write_text("a file where the writer wants a directory")
    drop(inbox, "pedido-2.edi", b"UNB+UNOA:2+ACME'2")
    second = wait_for_message("pedido-2.edi")
    wait_until(lambda: fresh(select(Delivery.id).where(
        Delivery.message_id == second, Delivery.state == "failed")), 60, "failed")

    # the dashboard: labels in Portuguese, each card still says which status it counts
    page.goto("/ui/")
    assert page.inner_text("h1") == "Painel"
    assert page.inner_text('#status-counts [data-status="delivered"] .status') == "Entregue"
    assert page.inner_text('#status-counts [data-status="error"] .status') == \
        "Erro de entrega"
    assert page.get_attribute('#status-counts [data-status="error"] a', "href") == \
        "/ui/messages?status=error"
    assert "Mensagens recebidas e entregues por minuto" in page.inner_text("#charts")
    shot(page, "i18n-01-dashboard-pt_BR")

    # the messages list: the row's label, the identifier in its class and the filter
    page.click("nav >> text=Mensagens")
    assert page.inner_text(f'#messages tr[data-id="{first}"] td.st .status') == "Entregue"
    assert page.locator(f'#messages tr[data-id="{second}"] .s-error').count() == 1
    assert page.inner_text("#messages thead").split("\t")[:3] == ["#", "Criada em (UTC)",
                                                                   "Status"]
    assert page.inner_text('select[name=status] option[value="not_routed"]') == "Sem rota"
    page.select_option("select[name=status]", "error")
    page.click("form.filters button:has-text('Filtrar')")
    page.wait_for_url("**/ui/messages?status=error*")  # the filter sends the identifier
    page.wait_for_selector(f'#messages tr[data-id="{second}"]')
    assert page.locator("#messages tbody tr").count() == 1
    shot(page, "i18n-02-messages-pt_BR")

    # a failed message
    page.goto(f"/ui/messages/{second}")
    assert page.inner_text("h1").startswith(f"Mensagem {second}")
    assert page.inner_text("#message-live h1 .status") == "Erro de entrega"
    assert "Motivo:" in page.inner_text("#why")
    deliveries = page.inner_text("#deliveries")
    assert "Falhou" in deliveries and "Reprocessar" in deliveries
    history = page.inner_text("#history")
    assert "delivery_changed" in history and "status_changed" in history  # types as stored
    assert "writer: na fila" in history
    shot(page, "i18n-03-message-pt_BR")

    # delivery errors
    page.click("nav >> text=Erros de entrega")
    assert page.inner_text("h1").startswith("Erros de entrega")
    row = page.locator("#errors tbody tr").first
    assert row.locator(".status").inner_text() == "Falhou"
    assert row.locator(".status").get_attribute("data-status") == "failed"
    [delivery_id] = [d for (d,) in fresh(select(Delivery.id).where(
        Delivery.message_id == second))]
    page.check(f'input[name=delivery][value="{delivery_id}"]')
    shot(page, "i18n-04-delivery-errors-pt_BR")
    (out / "acme").unlink()
    page.click("#redeliver-selected")
    assert "Reprocessar a 1 entrega selecionada?" in page.inner_text("#confirm")
    page.click("#confirm-yes")
    assert "1 entrega colocada de novo na fila" in page.inner_text("main")
    wait_until(lambda: (out / "acme" / "pedido-2.edi").exists(), 60, "redelivered")

    # a form with errors: every mistake beside its field, in Portuguese, the fields'
    # names (what a script posts) untouched
    page.goto("/ui/plugins/new/file_writer")
    assert "Diretório base (obrigatório)" in page.inner_text("form.stacked")
    page.fill("#name", "Writer 2")  # the service's refusal, written once in English
    page.fill("#config-base_directory", str(out / "two"))
    page.fill("#max_concurrent_deliveries", "muitas")
    page.fill("#probe_interval", "sempre")
    page.click("button:has-text('Salvar')")
    errors = page.locator(".field.has-error .error").all_inner_texts()
    assert errors == ["deve ter de 1 a 64 caracteres entre a-z, 0-9, '_' e '-'",
                      "deve ser um número inteiro", "deve ser um número inteiro"]
    assert page.locator(".field.has-error #name").count() == 1
    assert page.locator(".field.has-error #max_concurrent_deliveries").count() == 1
    assert page.input_value("#max_concurrent_deliveries") == "muitas"
    shot(page, "i18n-05-form-errors-pt_BR")


def test_the_browsers_language_and_the_users_own(browser, hub_url):
    english = page_in(browser, hub_url, "vic", "en-US")
    assert english.get_attribute("html", "lang") == "en"
    assert nav(english)[:3] == ["Dashboard", "Messages", "Delivery errors"]

    portuguese = page_in(browser, hub_url, "ada", "pt-BR")
    assert nav(portuguese)[:3] == ["Painel", "Mensagens", "Erros de entrega"]
    portuguese_only = page_in(browser, hub_url, "ada", "pt")
    assert nav(portuguese_only)[0] == "Painel"

    # vic's own setting wins over an English browser, and leaves ada's alone
    english.click("#account")
    shot(english, "i18n-06-account-en")
    english.select_option("#language", "pt_BR")
    english.click("#account-form button")
    assert "Idioma salvo." in english.inner_text("main")
    assert nav(english)[:3] == ["Painel", "Mensagens", "Erros de entrega"]
    assert fresh(select(User.language).where(User.name == "vic")) == [("pt_BR",)]
    english.goto("/ui/delivery-errors")
    assert english.inner_text("h1").startswith("Erros de entrega")
    ada_in_english = page_in(browser, hub_url, "ada", "en-GB")
    assert nav(ada_in_english)[0] == "Dashboard"

    # back to the browser's language
    english.goto("/ui/account")
    english.select_option("#language", "")
    english.click("#account-form button")
    assert nav(english)[0] == "Dashboard"
    assert fresh(select(User.language).where(User.name == "vic")) == [(None,)]
