"""The UI's languages (docs/i18n.md): which one a request is shown in, the catalogs the
pages, forms, flashes and e-mail notifications read, and the history lines written by
the engine shown through the catalog.

Only what people read is translated. Status identifiers (``delivered``, ``not_routed``),
API fields, history line types and what the database stores never are: a page shows a
translated *label* beside or instead of an identifier, the identifier stays in the
markup (``data-*``, ``s-<status>`` classes, query strings) and in every API answer.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from babel.support import NullTranslations, Translations

#: where the catalogs live (``<lang>/LC_MESSAGES/messages.po`` and its compiled ``.mo``)
TRANSLATIONS_DIR = Path(__file__).resolve().parent.parent / "translations"
DEFAULT = "en"
#: every language the UI is shown in, by its locale name, as its own speakers name it
LANGUAGES = {"en": "English", "pt_BR": "Português (Brasil)"}


def supported(language: str | None) -> str | None:
    """The locale of ``language`` (``pt-BR``, ``pt_br``, ``pt``, ``en-GB`` ...) among
    :data:`LANGUAGES`, or None: a regional variant we lack falls back to the language's
    one locale we have (``pt`` and ``pt-PT`` to ``pt_BR``, ``en-US`` to ``en``)."""
    if not language:
        return None
    tag = language.strip().replace("-", "_")
    by_lower = {name.lower(): name for name in LANGUAGES}
    if tag.lower() in by_lower:
        return by_lower[tag.lower()]
    base = tag.split("_", 1)[0].lower()
    for name in LANGUAGES:
        if name.split("_", 1)[0].lower() == base:
            return name
    return None


def hub_language(setting: str | None) -> str:
    """The hub's own language from its setting (B2BHUB_LANGUAGE, English unless set):
    the e-mail notifications' and that of a visitor whose browser asks for none we
    have."""
    return supported(setting) or DEFAULT


def from_accept_language(accepted) -> str | None:
    """The first language of a browser's ``Accept-Language`` (werkzeug's
    :class:`~werkzeug.datastructures.LanguageAccept`, best first) that we have."""
    for value, quality in accepted:
        if quality > 0 and (found := supported(value)):
            return found
    return None


@cache
def translations(language: str) -> NullTranslations:
    """The compiled catalog of ``language``; English is the source text itself."""
    if language == DEFAULT or language not in LANGUAGES:
        return NullTranslations()
    return Translations.load(str(TRANSLATIONS_DIR), [language])


# --- history lines and alerts written by the engine ------------------------------------
#
# The engine writes its history lines and alert texts in English, and they stay so in the
# database (the API and the notifications answer them as stored; a search finds them as
# written). A page shows a text that is one of these known forms through the catalog, its
# parameters put back in; any other text is shown as stored.

def N_(text: str) -> str:  # noqa: N802  (the extraction keyword of a deferred msgid)
    return text


#: (pattern of a stored text, the msgid it is shown by); named groups are the parameters
HISTORY_TEXTS: list[tuple[re.Pattern, str]] = [
    (re.compile(p), msgid) for p, msgid in [
        (r"^(?P<old>[A-Z][a-z ]+) → (?P<new>[A-Z][a-z ]+)$", N_("%(old)s → %(new)s")),
        (r"^(?P<actor>\S+) cancelled the message$", N_("%(actor)s cancelled the message")),
        (r"^(?P<name>.+) received from (?P<from_party>\S+) for (?P<to_party>\S+) by "
         r"(?P<source>\S+)$", N_("%(name)s received from %(from_party)s for %(to_party)s "
                                  "by %(source)s")),
        (r"^(?P<target>[^:\s]+): queued$", N_("%(target)s: queued")),
        (r"^(?P<target>[^:\s]+): attempt (?P<attempt>\d+) started$",
         N_("%(target)s: attempt %(attempt)s started")),
        (r"^(?P<target>[^:\s]+): (?P<state>[A-Z][a-z ]+)$", N_("%(target)s: %(state)s")),
        (r"^no route from (?P<source>\S+) matches (?P<from_party>\S+) → (?P<to_party>\S+)$",
         N_("no route from %(source)s matches %(from_party)s → %(to_party)s")),
        # a protocol's connection test's result (plugins/as2/selftest.py); the core
        # names no protocol: it is a word of capitals and digits
        (r"^every step passed: (?P<partner>\S+) takes (?P<protocol>[A-Z0-9]+) messages at "
         r"(?P<url>\S+)$",
         N_("every step passed: %(partner)s takes %(protocol)s messages at %(url)s")),
        (r"^the (?P<protocol>[A-Z0-9]+) connection test of (?P<partner>\S+) failed at "
         r"(?P<step>[^:]+): (?P<text>.*)$",
         N_("the %(protocol)s connection test of %(partner)s failed at %(step)s: %(text)s")),
        (r"^the test message reached (?P<partner>\S+) \((?P<url>\S+)\); its asynchronous "
         r"MDN has not come yet$", N_("the test message reached %(partner)s (%(url)s); its "
                                      "asynchronous MDN has not come yet")),
        # alert texts
        (r"^message (?P<id>\d+) ended (?P<status>[A-Z][a-z ]+)$",
         N_("message %(id)s ended %(status)s")),
        (r"^message (?P<id>\d+): no route matched$", N_("message %(id)s: no route matched")),
        (r"^delivery (?P<id>\d+) to (?P<target>\S+) is stalled$",
         N_("delivery %(id)s to %(target)s is stalled")),
        (r"^(?P<name>[^:\s]+) is offline: (?P<reason>.*)$",
         N_("%(name)s is offline: %(reason)s")),
    ]
]


def show_history_text(text: str | None, gettext) -> str:
    """A stored history line or alert text as a page shows it: a known form through
    ``gettext`` (status labels in it too), else as stored."""
    from b2bhub.domain.states import LABELS
    if not text:
        return ""
    by_label = {label: key for key, label in LABELS.items()}
    for pattern, msgid in HISTORY_TEXTS:
        found = pattern.match(text)
        if found is None:
            continue
        params = found.groupdict()
        labels = [k for k in ("old", "new", "state", "status") if k in params]
        if any(params[k] not in by_label for k in labels):
            continue
        params.update({k: status_label(by_label[params[k]], gettext) for k in labels})
        if "step" in params:  # a step's label, through the catalog too
            params["step"] = gettext(params["step"])
        if params.get("name") == "a message":
            params["name"] = gettext("a message")
        return gettext(msgid) % params
    return text


# --- the display labels of statuses and states ----------------------------------------

#: each message status and delivery state's label (the identifier is never shown
#: translated: the label is)
STATUS_LABELS = {
    "received": N_("Received"), "in_progress": N_("In progress"),
    "retrying": N_("Retrying"), "awaiting_receipt": N_("Awaiting receipt"),
    "deferred": N_("Deferred"), "stalled": N_("Stalled"), "delivered": N_("Delivered"),
    "not_routed": N_("Not routed"), "refused": N_("Refused"), "cancelled": N_("Cancelled"),
    "collection_error": N_("Collection error"), "business_error": N_("Business error"),
    "error": N_("Error"), "queued": N_("Queued"), "failed": N_("Failed"),
    "skipped": N_("Skipped"),
}


def status_label(value: str | None, gettext) -> str:
    """The label of a status or state identifier in the current language; an unknown
    identifier is shown as it is."""
    if not value:
        return ""
    msgid = STATUS_LABELS.get(value)
    return gettext(msgid) if msgid else value


#: the states of instances, processes, cleanup runs and notifications, shown in lower
#: case as words of a sentence
STATE_WORDS = {
    "disabled": N_("disabled"), "enabled": N_("enabled"), "running": N_("running"),
    "stopped": N_("stopped"), "error": N_("error"), "gone": N_("gone"),
    "finished": N_("finished"), "failed": N_("failed"), "pending": N_("pending"),
    "sent": N_("sent"), "ok": N_("ok"),
}


def state_word(value: str | None, gettext) -> str:
    """A lower-case state's word in the current language; an unknown one as it is."""
    if not value:
        return ""
    msgid = STATE_WORDS.get(value)
    return gettext(msgid) if msgid else value


# --- extraction (babel.cfg, ``make i18n``) ---------------------------------------------

def extract_python_and_fields(fileobj, keywords, comment_tags, options):
    """Babel's Python extraction, plus the texts of plugin configuration schemas: each
    ``Field(...)``'s label (else the title its name makes) and help, which the forms
    drawn from a schema show through the catalog (b2bhub.web.forms)."""
    import ast

    from babel.messages.extract import extract_python
    source = fileobj.read()
    fileobj.seek(0)
    yield from extract_python(fileobj, keywords, comment_tags, options)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (getattr(func, "id", None) or getattr(func, "attr", None)) != "Field":
            continue
        given = {kw.arg: kw.value for kw in node.keywords}
        label = _text(given.get("label"))
        if not label and node.args and _text(node.args[0]):
            label = _text(node.args[0]).replace("_", " ").capitalize()
        for text in (label, _text(given.get("help"))):
            if text:
                yield node.lineno, None, text, ["a plugin configuration field"]


def _text(node) -> str:
    if node is None:
        return ""
    import ast
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) \
        else ""
