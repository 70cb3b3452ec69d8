"""The UI's catalogs stay complete (issue 40, item 3; docs/i18n.md).

A text a page, a form, a flash or a notification shows is marked for translation, is in
every committed catalog, and has its Brazilian Portuguese translation; the compiled
``.mo`` files the hub reads are those of the ``.po`` files beside them; and no template
shows a visible word that bypasses the catalog. A colleague who adds a page and forgets
one of these finds out here, with the texts named.
"""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from babel.messages.mofile import read_mo
from babel.messages.pofile import read_po
from jinja2 import Environment

from b2bhub.domain import i18n
from b2bhub.domain.states import LABELS, DeliveryState, MessageStatus

ROOT = Path(__file__).resolve().parent.parent
CATALOGS = ROOT / "b2bhub" / "translations"
#: the languages whose every text must be translated
COMPLETE = ["pt_BR"]
TEMPLATES = sorted([*ROOT.joinpath("templates", "ui").rglob("*.html"),
                    *ROOT.joinpath("plugins").rglob("templates/*.html")])


def catalog(language: str):
    path = CATALOGS / language / "LC_MESSAGES" / "messages.po"
    with path.open("rb") as fh:
        return read_po(fh, locale=language)


def key(message) -> str:
    return message.id if isinstance(message.id, str) else message.id[0]


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    """What ``make i18n`` would extract now, into a temporary template."""
    pot = tmp_path_factory.mktemp("i18n") / "messages.pot"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("pybabel")), "extract", "--no-location",
         "--omit-header", "-F", "babel.cfg", "-k", "_l", "-k", "lazy_gettext", "-k", "N_",
         "-o", str(pot), "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with pot.open("rb") as fh:
        found = read_po(fh)
    return {key(m): m for m in found if m.id}


def test_extraction_finds_the_pages_forms_and_notifications(extracted):
    # a marker of each place the catalog must cover: a template, a form label, a flash,
    # a plugin schema's label and help, an e-mail notification, a status label
    for text in ("Delivery errors", "Acknowledgment expected within (hours)",
                 "Message %(id)s stored", "Base directory",
                 "the directory scanned; created when the instance starts",
                 "Alert %(kind)s opened: %(text)s", "Not routed", "wrong user name or password"):
        assert text in extracted, text


UI_CODE = sorted([*ROOT.joinpath("b2bhub", "web").rglob("*.py"),
                  ROOT / "b2bhub" / "domain" / "i18n.py",
                  ROOT / "b2bhub" / "engine" / "notifications.py",
                  *ROOT.joinpath("plugins").rglob("*.py")])
MARKERS = {"_", "_l", "gettext", "lazy_gettext", "ngettext", "N_"}


def test_extraction_misses_no_marked_text_in_the_code(extracted):
    """Every gettext call of the UI's code reaches the catalog: one inside an f-string
    is invisible to the extractor (and its text would never be translated)."""
    import ast
    missed = []
    for path in UI_CODE:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in MARKERS
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                    and node.args[0].value not in extracted):
                missed.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.args[0].value!r}")
    assert not missed


@pytest.mark.parametrize("language", ["en", *COMPLETE])
def test_every_text_is_in_the_committed_catalog(extracted, language):
    held = {key(m) for m in catalog(language) if m.id}
    missing = sorted(set(extracted) - held)
    assert not missing, (f"not in the {language} catalog (run `make i18n`, then translate): "
                         f"{missing}")
    gone = sorted(held - set(extracted))
    assert not gone, f"the {language} catalog holds texts no code uses any more: {gone}"


@pytest.mark.parametrize("language", COMPLETE)
def test_every_text_has_its_translation(language):
    untranslated = []
    for message in catalog(language):
        if not message.id:
            continue
        forms = [message.string] if isinstance(message.string, str) else list(message.string)
        if message.fuzzy or not forms or not all(f.strip() for f in forms):
            untranslated.append(key(message))
    assert not untranslated, f"no {language} translation for: {untranslated}"


@pytest.mark.parametrize("language", COMPLETE)
def test_translations_keep_every_parameter(language):
    """A translation that drops or misspells %(name)s would fail when the page shows it."""
    wrong = []
    for message in catalog(language):
        if not message.id:
            continue
        ids = [message.id] if isinstance(message.id, str) else list(message.id)
        strings = [message.string] if isinstance(message.string, str) else list(message.string)
        wanted = set(re.findall(r"%\(\w+\)[sdr]", ids[-1]))
        for text in strings:
            if set(re.findall(r"%\(\w+\)[sdr]", text)) != wanted:
                wrong.append((ids[0], text))
    assert not wrong


@pytest.mark.parametrize("language", ["en", *COMPLETE])
def test_the_compiled_catalog_is_the_po_file(language):
    """The committed .mo is what `make i18n` compiles from the committed .po."""
    def translated(messages) -> dict:
        found = {}
        for m in messages:
            forms = (m.string,) if isinstance(m.string, str) else tuple(m.string)
            ids = (m.id,) if isinstance(m.id, str) else tuple(m.id)
            if m.id and any(forms) and forms != ids:  # compiled English falls back to ids
                found[key(m)] = forms
        return found

    with (CATALOGS / language / "LC_MESSAGES" / "messages.mo").open("rb") as fh:
        compiled = translated(read_mo(fh))
    assert compiled == translated(catalog(language))


def test_every_status_and_state_has_a_translated_label():
    assert set(i18n.STATUS_LABELS) == set(LABELS)
    assert {*MessageStatus, *DeliveryState} <= set(i18n.STATUS_LABELS)
    portuguese = i18n.translations("pt_BR").gettext
    for value, english in LABELS.items():
        assert i18n.status_label(value, lambda text: text) == english
        assert i18n.status_label(value, portuguese) not in ("", english), value


# --- visible text in templates -------------------------------------------------------------

#: words a page may show as they are: the product's name, units, protocol and standard
#: names that read the same in every language
ALLOWED = {"b2bhub", "PID", "sha256", "URL", "UTC", "s", "ms", "min", "h", "p95", "X12",
           "EDIFACT", "CONTRL", "AS2", "MDN", "TLS", "ID"}
#: attributes whose values people read
READ_ATTRIBUTES = {"title", "placeholder", "aria-label", "alt"}
#: single words that are visible text when written as a literal in an expression
VISIBLE_WORDS = {"yes", "no", "none", "any", "ok", "expired", "valid", "ends", "ended"}
HOLE = " \x00 "  # where a {{ }} or {% %} was: not text of the template's own


def _unallowed(text: str) -> list[str]:
    """The words of ``text`` a reader reads: with a lower-case letter (codes such as
    ORDERS, ISA13 or NAME are identifiers), not in :data:`ALLOWED`."""
    words = re.findall(r"[^\W\d_][\w'’-]*", text.replace("\x00", " "))
    return [w for w in words if w not in ALLOWED and re.search(r"[a-zà-ÿ]", w)]


class _TextNodes(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "code"):  # code: commands and identifiers
            self._skip += 1
        for name, value in attrs:
            if name in READ_ATTRIBUTES and value and _unallowed(value):
                self.found.append(f'{name}="{value}"')

    def handle_endtag(self, tag):
        if tag in ("script", "style", "code"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip and _unallowed(data):
            self.found.append(data.strip())


def visible_literals(source: str) -> list[str]:
    """The words a template shows that do not go through the catalog: text between its
    tags and in the attributes people read (Jinja's lexer tells the template's own text
    from its expressions), and string literals in its expressions that read as words,
    outside a ``_()``/``ngettext()`` call."""
    env = Environment(extensions=["jinja2.ext.i18n"])
    text, found = [], []
    calls: list[bool] = []  # for each open bracket: whether it is a gettext call's
    previous = None  # the token before, as (kind, value)
    pending = None  # a literal that reads as words, unless the next token makes it a key
    for _lineno, kind, value in env.lex(source):
        if kind == "whitespace":
            continue
        if pending is not None and not (kind == "operator" and value == ":"):
            found.append(pending)  # not a dict's key ({'ok': ...}): shown
        pending = None
        if kind == "data":
            text.append(value)
            previous = None
            continue
        if kind in ("variable_begin", "block_begin"):
            text.append(HOLE)
            calls = []
        if kind == "operator" and value in "([{":
            calls.append(value == "(" and previous in (("name", "_"), ("name", "gettext"),
                                                       ("name", "ngettext")))
        elif kind == "operator" and value in ")]}" and calls:
            calls.pop()
        elif kind == "string" and not (calls and calls[-1]) and _reads_as_words(value) \
                and previous not in (("operator", "=="), ("operator", "!=")):
            pending = value  # compared with ('== "none"'): an identifier, not shown
        previous = (kind, value)
    if pending is not None:
        found.append(pending)
    parser = _TextNodes()
    parser.feed("".join(text))
    parser.close()
    return parser.found + found


def _reads_as_words(literal: str) -> bool:
    """A string literal in an expression that a page would show as words: a capitalized
    word ('Blocked'), one of the common short answers ('yes'), or words with a space
    ('Send again'); not an identifier, endpoint, format or separator."""
    value = literal[1:-1].strip() if literal[:1] in "'\"" else literal.strip()
    words = re.findall(r"[^\W\d_]+", value)
    return bool(value in VISIBLE_WORDS or re.fullmatch(r"[A-Z][a-z]+", value)
                or (" " in value and any(len(w) > 1 and re.search(r"[a-z]", w)
                                         and w not in ALLOWED for w in words)))


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: str(p.relative_to(ROOT)))
def test_templates_show_no_text_outside_the_catalog(template):
    found = visible_literals(template.read_text(encoding="utf-8"))
    assert not found, f"wrap these in {{{{ _('...') }}}}: {found}"


@pytest.mark.parametrize("snippet, flagged", [
    ("<h1>Messages</h1>", True),
    ("<h1>{{ _('Messages') }}</h1>", False),
    ('<input placeholder="PO or invoice number">', True),
    ("<input placeholder=\"{{ _('PO or invoice number') }}\">", False),
    ("<td>{{ 'yes' if r.enabled else 'no' }}</td>", True),
    ("<td>{{ _('yes') if r.enabled else _('no') }}</td>", False),
    ("{{ button(url, 'Send again', 'secondary') }}", True),
    ("{{ url_for('ui.messages', status='collection_error') }}", False),
    ("{{ {'ok': _('ok'), 'failed': _('failed')}.get(s) }}", False),
    ("{{ _('none') if acks == 'none' else acks }}", False),
    ("{{ {'ok': 'all good'}.get(s) }}", True),
    ("<th class=\"num\">PID</th><a class=\"brand\">b2bhub</a>", False),
    ("<option{% if x %} selected{% endif %}>{{ n }}</option>", False),
    ("<p>Run <code>b2bhub user create NAME</code></p>", True),
    ("<p>{{ _('Run') }} <code>b2bhub user create NAME</code></p>", False),
    ("{{ ngettext('%(num)s file', '%(num)s files', n) }}", False),
    ("<script>const x = 'Live';</script>{# a comment with words #}", False),
])
def test_the_template_check_tells_literal_text_from_marked_text(snippet, flagged):
    assert bool(visible_literals(snippet)) is flagged


def test_the_history_forms_show_through_the_catalog():
    portuguese = i18n.translations("pt_BR").gettext
    shown = i18n.show_history_text("Received → Delivered", portuguese)
    assert shown == "Recebida → Entregue"
    assert i18n.show_history_text("erp: queued", portuguese) == "erp: na fila"
    assert i18n.show_history_text("erp: attempt 2 started", portuguese) == \
        "erp: tentativa 2 iniciada"
    # a text that is no known form, and a status-like form with an unknown label, as stored
    assert i18n.show_history_text("erp: HTTP 500 Internal Server Error",
                                  portuguese) == "erp: HTTP 500 Internal Server Error"
    assert i18n.show_history_text("Foo → Bar", portuguese) == "Foo → Bar"
    assert i18n.show_history_text("erp: queued", lambda t: t) == "erp: queued"
    # alert texts too
    assert i18n.show_history_text("message 7 ended Error", portuguese) == \
        "mensagem 7 terminou em Erro de entrega"
    assert i18n.show_history_text("erp is offline: HTTP 503", portuguese) == \
        "erp está fora do ar: HTTP 503"
    # a plugin of ours: the AS2 connection test's result, its step's label translated
    assert i18n.show_history_text("the AS2 connection test of acme failed at TCP connect: "
                                  "connection refused", portuguese) == \
        "o teste de conexão AS2 de acme falhou em Conexão TCP: connection refused"


def test_a_notification_reads_in_the_hubs_language(monkeypatch):
    from b2bhub.engine import notifications

    class Alert:
        id, kind, subject, text, message_id = 1, "message_failed", "message 7", "erp: HTTP 500", 7

    monkeypatch.setenv("B2BHUB_LANGUAGE", "pt_BR")
    body = notifications._body(Alert, "opened", "error")
    assert body.splitlines()[0] == "Alerta message_failed aberto: erp: HTTP 500"
    assert "Alertas abertos: /ui/alerts" in body
    # the status and its seed identifier are identifiers: never translated
    assert "Status: error (ERRO_ENTREGA)" in body
    monkeypatch.setenv("B2BHUB_LANGUAGE", "en")
    assert notifications._body(Alert, "opened", None).splitlines()[0] == \
        "Alert message_failed opened: erp: HTTP 500"


@pytest.mark.parametrize("header, chosen", [
    ("pt-BR,pt;q=0.9,en;q=0.8", "pt_BR"), ("pt", "pt_BR"), ("pt-PT", "pt_BR"),
    ("en-US,en;q=0.9", "en"), ("de-DE,fr;q=0.5", None), ("de, pt;q=0.4", "pt_BR"),
])
def test_accept_language_picks_a_language_the_hub_has(header, chosen):
    from werkzeug.datastructures import LanguageAccept
    from werkzeug.http import parse_accept_header
    assert i18n.from_accept_language(parse_accept_header(header, LanguageAccept)) == chosen



def test_the_forms_name_rule_is_the_services():
    """The forms say the name rule in the user's words; in English, the very text the
    services refuse a name with (a form hides its help when the error repeats it)."""
    from b2bhub.domain.routing import NAME_RULE
    from b2bhub.web.forms import NAME_RULE as SHOWN
    assert str(SHOWN) == NAME_RULE
