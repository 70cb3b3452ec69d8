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

class Text(str):
    """A text of ours in English (what it *is*, as a str: what the API answers, the
    database stores and a log shows) that remembers its msgid and parameters, so a page
    can show it in the reader's language (:meth:`shown`). Made by :func:`N_`."""

    msgid: str
    params: dict
    parts: tuple = ()

    def shown(self, gettext) -> str:
        """This text in ``gettext``'s language; parameters that are texts of ours are
        shown in it too, any other parameter (a name, a partner's own words) as it is."""
        if self.parts:
            return self.msgid.join(str(shown(part, gettext)) for part in self.parts)
        params = {key: shown(value, gettext) if isinstance(value, Text) else value
                  for key, value in self.params.items()}
        found = gettext(self.msgid)
        return found % params if params else found


def N_(msgid: str, /, **params) -> Text:  # noqa: N802  (the extraction keyword)
    """Mark ``msgid`` (a whole sentence, ``%(name)s`` for each parameter) for the
    catalog: the result is the English text with ``params`` put in, a :class:`Text`
    that a page shows in the reader's language."""
    made = Text(msgid % params if params else msgid)
    made.msgid, made.params = msgid, params
    return made


def joined(texts, separator: str = "; ") -> Text:
    """Sentences said together (``a; b``): each shown in the reader's language."""
    texts = tuple(texts)
    made = Text(separator.join(texts))
    made.msgid, made.params, made.parts = separator, {}, texts
    return made


def shown(text, gettext) -> str:
    """A text as a page shows it: one of ours (:class:`Text`) in the reader's
    language, any other (a partner's answer, a third-party plugin's) as it is."""
    return text.shown(gettext) if isinstance(text, Text) else text


#: (pattern of a stored text, the msgid it is shown by); named groups are the parameters
HISTORY_TEXTS: list[tuple[re.Pattern, str]] = [
    (re.compile(p), msgid) for p, msgid in [
        (r"^(?P<old>[A-Z][a-z ]+) → (?P<new>[A-Z][a-z ]+)$", N_("%(old)s → %(new)s")),
        (r"^(?P<actor>\S+) cancelled the message$", N_("%(actor)s cancelled the message")),
        (r"^(?P<name>.+) received from (?P<from_party>\S+) for (?P<to_party>\S+) by "
         r"(?P<source>\S+)$", N_("%(name)s received from %(from_party)s for %(to_party)s "
                                  "by %(source)s")),
        (r"^(?P<target>[^:\s]+): queued$", N_("%(target)s: queued")),
        (r"^(?P<target>[^:\s]+): queued \((?P<verb>[a-z ]+)\)$",
         N_("%(target)s: queued (%(verb)s)")),
        (r"^(?P<target>[^:\s]+): cancelled$", N_("%(target)s: cancelled")),
        (r"^(?P<target>[^:\s]+): skipped$", N_("%(target)s: skipped")),
        (r"^(?P<target>[^:\s]+): stalled: woken (?P<count>\d+) times without a claim "
         r"\(target stopped, disabled or overloaded\)$",
         N_("%(target)s: stalled: woken %(count)s times without a claim (target stopped, "
            "disabled or overloaded)")),
        # a settled attempt (b2bhub.engine.machine.settlement); the text is the
        # destination's (a reason we classify is shown through REASON_TEXTS)
        (r"^(?P<target>[^:\s]+): attempt (?P<attempt>\d+) delivered: (?P<text>.*)$",
         N_("%(target)s: attempt %(attempt)s delivered: %(text)s")),
        (r"^(?P<target>[^:\s]+): attempt (?P<attempt>\d+) failed: (?P<text>.*); retrying at "
         r"(?P<when>[\d-]+ [\d:]+) UTC$",
         N_("%(target)s: attempt %(attempt)s failed: %(text)s; retrying at %(when)s UTC")),
        (r"^(?P<target>[^:\s]+): attempt (?P<attempt>\d+) failed: (?P<text>.*) \(error class "
         r"(?P<error_class>\S+) is not retried\)$",
         N_("%(target)s: attempt %(attempt)s failed: %(text)s (error class %(error_class)s "
            "is not retried)")),
        (r"^(?P<target>[^:\s]+): attempt (?P<attempt>\d+) failed: (?P<text>.*) \(attempts "
         r"used up \((?P<most>\d+)\)\)$",
         N_("%(target)s: attempt %(attempt)s failed: %(text)s (attempts used up "
            "(%(most)s))")),
        (r"^(?P<target>[^:\s]+): attempt (?P<attempt>\d+) failed by business rule "
         r"(?P<rule>[^:]+): (?P<text>.*)$",
         N_("%(target)s: attempt %(attempt)s failed by business rule %(rule)s: %(text)s")),
        (r"^(?P<target>[^:\s]+): attempt (?P<attempt>\d+) failed: (?P<text>.*)$",
         N_("%(target)s: attempt %(attempt)s failed: %(text)s")),
        (r"^(?P<target>[^:\s]+): attempt (?P<attempt>\d+) interrupted: (?P<text>.*); "
         r"retrying$", N_("%(target)s: attempt %(attempt)s interrupted: %(text)s; retrying")),
        (r"^(?P<target>[^:\s]+): attempt (?P<attempt>\d+) interrupted: (?P<text>.*)$",
         N_("%(target)s: attempt %(attempt)s interrupted: %(text)s")),
        (r"^(?P<target>[^:\s]+): attempt (?P<attempt>\d+): (?P<text>.*); receipt due by "
         r"(?P<when>[\d-]+ [\d:]+) UTC$",
         N_("%(target)s: attempt %(attempt)s: %(text)s; receipt due by %(when)s UTC")),
        # an operator's actions (b2bhub.engine.operator, blocking)
        (r"^(?P<actor>\S+) asked to redeliver the delivery to (?P<target>\S+)$",
         N_("%(actor)s asked to redeliver the delivery to %(target)s")),
        (r"^(?P<actor>\S+) asked to resubmit the delivery to (?P<target>\S+)$",
         N_("%(actor)s asked to resubmit the delivery to %(target)s")),
        (r"^(?P<actor>\S+) asked to send again the delivery to (?P<target>\S+)$",
         N_("%(actor)s asked to send again the delivery to %(target)s")),
        (r"^(?P<actor>\S+) cancelled the delivery to (?P<target>\S+)$",
         N_("%(actor)s cancelled the delivery to %(target)s")),
        (r"^(?P<actor>\S+) skipped the delivery to (?P<target>\S+)$",
         N_("%(actor)s skipped the delivery to %(target)s")),
        (r"^(?P<actor>\S+) released (?P<target>\S+) \((?P<verb>[a-z ]+) of delivery "
         r"(?P<id>\d+)\): its waiting deliveries go out again$",
         N_("%(actor)s released %(target)s (%(verb)s of delivery %(id)s): its waiting "
            "deliveries go out again")),
        (r"^(?P<actor>[^:\s]+): redispatch: nothing is new$",
         N_("%(actor)s: redispatch: nothing is new")),
        (r"^(?P<actor>[^:\s]+): redispatch: new deliveries to (?P<targets>[^;]+); "
         r"(?P<count>\d+) stalled delivery\(ies\) queued again$",
         N_("%(actor)s: redispatch: new deliveries to %(targets)s; %(count)s stalled "
            "delivery(ies) queued again")),
        (r"^(?P<actor>[^:\s]+): redispatch: new deliveries to (?P<targets>[^;]+)$",
         N_("%(actor)s: redispatch: new deliveries to %(targets)s")),
        (r"^(?P<actor>[^:\s]+): redispatch: (?P<count>\d+) stalled delivery\(ies\) queued "
         r"again$", N_("%(actor)s: redispatch: %(count)s stalled delivery(ies) queued again")),
        # a scheduled source's fetches (b2bhub.engine.collection, dispatch)
        (r"^failed fetch (?P<count>\d+) since (?P<when>[\d-]+ [\d:]+ UTC): (?P<text>.*)$",
         N_("failed fetch %(count)s since %(when)s: %(text)s")),
        (r"^(?P<source>\S+) fetched again after 1 failed fetch since (?P<when>.+)$",
         N_("%(source)s fetched again after 1 failed fetch since %(when)s")),
        (r"^(?P<source>\S+) fetched again after (?P<count>\d+) failed fetches since "
         r"(?P<when>.+)$",
         N_("%(source)s fetched again after %(count)s failed fetches since %(when)s")),
        (r"^message (?P<id>\d+): (?P<source>\S+) could not collect: (?P<text>.*)$",
         N_("message %(id)s: %(source)s could not collect: %(text)s")),
        (r"^no functional acknowledgment: (?P<text>.*)$",
         N_("no functional acknowledgment: %(text)s")),
        # a source's envelope checks (b2bhub.engine.envelope_checks); each envelope
        # error is the inspector's own text about the partner's interchange, as stored
        (r"^envelope errors: (?P<errors>.*) \(accepted, as the source's edi_errors says\)$",
         N_("envelope errors: %(errors)s (accepted, as the source's edi_errors says)")),
        (r"^envelope errors: (?P<errors>[^;]*(?:; (?!duplicate: )[^;]*)*)$",
         N_("envelope errors: %(errors)s")),
        (r"^message (?P<id>\d+): interchange (?P<control>\S+) from (?P<sender>\S+) was "
         r"received before as message (?P<earlier>\d+)$",
         N_("message %(id)s: interchange %(control)s from %(sender)s was received before "
            "as message %(earlier)s")),
        (r"^interchange (?P<control>\S+) from (?P<sender>\S+) was "
         r"received before as message (?P<earlier>\d+)$",
         N_("interchange %(control)s from %(sender)s was received before as message "
            "%(earlier)s")),
        (r"^duplicate: interchange (?P<control>\S+) from (?P<sender>\S+) was received "
         r"before as message (?P<earlier>\d+)$",
         N_("duplicate: interchange %(control)s from %(sender)s was received before as "
            "message %(earlier)s")),
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


#: the operator actions' words a history line names (b2bhub.engine.operator)
VERBS = (N_("redeliver"), N_("resubmit"), N_("send again"), N_("skip"), N_("redispatch"))

def _pattern_of(msgid: str) -> re.Pattern:
    """The pattern of the stored texts of ``msgid``: its words as they are, each
    ``%(name)s`` any text."""
    parts = re.split(r"%\((\w+)\)s", msgid)
    return re.compile("^" + "".join(re.escape(part) if n % 2 == 0 else f"(?P<{part}>.*)"
                                    for n, part in enumerate(parts)) + "$")


#: the reasons our own code gives (a destination's classified failure, an envelope
#: check's error): (pattern, msgid) as HISTORY_TEXTS; any other reason is the
#: destination's own words, shown as it said them
REASON_TEXTS: list[tuple[re.Pattern, str]] = [
    (re.compile(p), msgid) for p, msgid in [
        (r"^delivered$", N_("delivered")),
        # the file, HTTP, AS2 and SFTP targets' classified failures
        (r"^the message has no '(?P<stage>\w+)' payload stage$",
         N_("the message has no '%(stage)s' payload stage")),
        (r"^could not read the payload: (?P<why>.*)$",
         N_("could not read the payload: %(why)s")),
        (r"^could not write (?P<file>.+) below (?P<base>\S+): (?P<why>.*)$",
         N_("could not write %(file)s below %(base)s: %(why)s")),
        (r"^(?P<file>.+) exists and overwrite is off$",
         N_("%(file)s exists and overwrite is off")),
        (r"^no answer within (?P<most>[\d.]+) s \(after (?P<took>[\d.]+ s)\)$",
         N_("no answer within %(most)s s (after %(took)s)")),
        (r"^connection to (?P<where>\S+) failed: (?P<why>.*) \(after (?P<took>[\d.]+ s)\)$",
         N_("connection to %(where)s failed: %(why)s (after %(took)s)")),
        (r"^connection to (?P<where>\S+) failed: (?P<why>.*)$",
         N_("connection to %(where)s failed: %(why)s")),
    ]
] + [(_pattern_of(msgid), msgid) for msgid in (
    # a reason whose one parameter (if any) is the rest of the text
    N_("the request could not be made: %(why)s"), N_("TLS failed: %(why)s"),
    N_("timed out: %(why)s"), N_("connection failed: %(why)s"), N_("no answer in time"),
    N_("host key mismatch"), N_("authentication failed: %(why)s"),
    N_("cannot resolve the host: %(why)s"), N_("connection lost: %(why)s"),
    N_("permission denied"), N_("no space left on the server"),
    N_("no such file or directory"), N_("the server said: %(why)s"),
    N_("the connection was lost twice"),
    # an instance whose stored business rules no longer parse (b2bhub.engine.runner)
    N_("the instance's business rules are invalid: %(why)s"),
    # an SFTP login with a private key that cannot be used (plugins/sftp/connection.py)
    N_("the private key needs its passphrase"),
    N_("the passphrase does not open the private key"),
    N_("the private key cannot be read: %(why)s"),
    # a connection test's step that failed (plugins/as2/selftest.py)
    N_("could not connect: %(why)s"), N_("%(host)s cannot be resolved: %(why)s"),
    N_("the POST failed: %(why)s"), N_("TLS failed while sending: %(why)s"),
    N_("the test message could not be built: %(why)s"))]

# the lines of receipts, late outcomes, OpenPGP stages, acknowledgments, cleanup runs,
# instances started or stopped and intake tokens: HISTORY_TEXTS as above
HISTORY_TEXTS += [(re.compile(p), msgid) for p, msgid in [
    # a receipt that settles nothing, one reported through the API, one that never came
    # (b2bhub.engine.machine.receipts, b2bhub.engine.operator.record_receipt)
    (r"^(?P<target>[^:\s]+): receipt (?P<ref>\S+) is unattributable: the delivery is "
     r"(?P<state>[A-Z][a-z ]+); (?P<text>.*)$",
     N_("%(target)s: receipt %(ref)s is unattributable: the delivery is %(state)s; "
        "%(text)s")),
    (r"^(?P<target>[^:\s]+): (?P<text>\S+ reported the receipt: .*)$",
     N_("%(target)s: %(text)s")),
    (r"^(?P<target>[^:\s]+): no receipt within (?P<waited>\d+[hms])$",
     N_("%(target)s: no receipt within %(waited)s")),
    # an attempt's outcome that came after the delivery moved on (machine.settlement)
    (r"^(?P<target>[^:\s]+): outcome '(?P<outcome>[^']*)' of attempt (?P<attempt>\d+) "
     r"arrived after the delivery moved on \(now (?P<state>[A-Z][a-z ]+), attempt "
     r"(?P<current>\S+)\); ignored$",
     N_("%(target)s: outcome '%(outcome)s' of attempt %(attempt)s arrived after the "
        "delivery moved on (now %(state)s, attempt %(current)s); ignored")),
    # the OpenPGP stages (b2bhub.engine.openpgp_stages)
    (r"^OpenPGP for (?P<target>\S+): encrypted to (?P<recipient>\S+)'s key (?P<key>\S*) "
     r"and signed with (?P<sender>\S+)'s key (?P<own_key>\S*); stored as the sent stage$",
     N_("OpenPGP for %(target)s: encrypted to %(recipient)s's key %(key)s and signed with "
        "%(sender)s's key %(own_key)s; stored as the sent stage")),
    (r"^OpenPGP for (?P<target>\S+): encrypted to (?P<recipient>\S+)'s key (?P<key>\S*); "
     r"stored as the sent stage$",
     N_("OpenPGP for %(target)s: encrypted to %(recipient)s's key %(key)s; stored as the "
        "sent stage")),
    (r"^OpenPGP for (?P<target>\S+): signed with (?P<sender>\S+)'s key (?P<own_key>\S*); "
     r"stored as the sent stage$",
     N_("OpenPGP for %(target)s: signed with %(sender)s's key %(own_key)s; stored as the "
        "sent stage")),
    (r"^OpenPGP: decrypted$", N_("OpenPGP: decrypted")),
    (r"^OpenPGP: signature of (?P<partner>\S+) verified$",
     N_("OpenPGP: signature of %(partner)s verified")),
    (r"^OpenPGP: decrypted and signature of (?P<partner>\S+) verified$",
     N_("OpenPGP: decrypted and signature of %(partner)s verified")),
    # an acknowledgment sent for a received interchange (b2bhub.engine.acks); its
    # outcome and detail are the inspector's words
    (r"^(?P<document_type>\S+) sent as message (?P<id>\d+): (?P<outcome>[^:]+)$",
     N_("%(document_type)s sent as message %(id)s: %(outcome)s")),
    (r"^(?P<document_type>\S+) sent as message (?P<id>\d+): (?P<outcome>[^:]+): "
     r"(?P<detail>.*)$",
     N_("%(document_type)s sent as message %(id)s: %(outcome)s: %(detail)s")),
    # a cleanup run (b2bhub.engine.cleanup)
    (r"^(?P<actor>[^:\s]+): cleanup removed (?P<messages>\d+) messages \((?P<rows>\d+) "
     r"bytes of payload rows\), (?P<files>\d+) payload files \((?P<bytes>\d+) bytes on "
     r"disk, (?P<orphans>\d+) of them referenced by no row before the run\)$",
     N_("%(actor)s: cleanup removed %(messages)s messages (%(rows)s bytes of payload "
        "rows), %(files)s payload files (%(bytes)s bytes on disk, %(orphans)s of them "
        "referenced by no row before the run)")),
    (r"^(?P<actor>[^:\s]+): cleanup would remove (?P<messages>\d+) messages "
     r"\((?P<rows>\d+) bytes of payload rows\), (?P<files>\d+) payload files "
     r"\((?P<bytes>\d+) bytes on disk, (?P<orphans>\d+) of them referenced by no row "
     r"before the run\)$",
     N_("%(actor)s: cleanup would remove %(messages)s messages (%(rows)s bytes of payload "
        "rows), %(files)s payload files (%(bytes)s bytes on disk, %(orphans)s of them "
        "referenced by no row before the run)")),
    (r"^(?P<actor>[^:\s]+): cleanup not run: another process is running it$",
     N_("%(actor)s: cleanup not run: another process is running it")),
    (r"^(?P<actor>[^:\s]+): cleanup failed: (?P<text>.*)$",
     N_("%(actor)s: cleanup failed: %(text)s")),
    # an instance stopped or started by an operator (b2bhub.engine.instances)
    (r"^(?P<actor>[^:\s]+) stopped (?P<instance>\S+)$",
     N_("%(actor)s stopped %(instance)s")),
    (r"^(?P<actor>[^:\s]+): (?P<instance>\S+) was stopped already$",
     N_("%(actor)s: %(instance)s was stopped already")),
    (r"^(?P<actor>[^:\s]+) started (?P<instance>\S+)$",
     N_("%(actor)s started %(instance)s")),
    (r"^(?P<actor>[^:\s]+): (?P<instance>\S+) was not stopped \((?P<word>[a-z]+)\)$",
     N_("%(actor)s: %(instance)s was not stopped (%(word)s)")),
    # an HTTP receiver's intake tokens (plugins/http_receiver.py)
    (r"^(?P<actor>\S+) created intake token '(?P<name>[^']*)' of (?P<instance>\S+)$",
     N_("%(actor)s created intake token '%(name)s' of %(instance)s")),
    (r"^(?P<actor>\S+) revoked intake token '(?P<name>[^']*)' of (?P<instance>\S+)$",
     N_("%(actor)s revoked intake token '%(name)s' of %(instance)s")),
]]

#: the reported receipts' words (b2bhub.engine.operator.record_receipt), inside a line
REASON_TEXTS += [(_pattern_of(msgid), msgid) for msgid in (
    N_("%(actor)s reported the receipt: completed: %(text)s"),
    N_("%(actor)s reported the receipt: failed: %(text)s"),
    N_("%(actor)s reported the receipt: completed"),
    N_("%(actor)s reported the receipt: failed"))]

#: the changes of configuration a ``config_changed`` line names after its actor
#: (``ada: created partner acme``): the services' and the UI's (a lazy text stored in
#: English), each shown through the catalog, its parameters as stored
CHANGE_TEXTS: list[tuple[re.Pattern, str]] = [(_pattern_of(msgid), msgid) for msgid in (
    # the UI's (b2bhub.web)
    N_("created %(type)s instance %(name)s"),
    N_("changed %(type)s instance %(name)s"),
    N_("enabled instance %(name)s"),
    N_("disabled instance %(name)s"),
    N_("deleted instance %(name)s"),
    N_("deleted route %(id)s"),
    N_("created organization %(name)s"),
    N_("created partner %(name)s"),
    N_("changed organization %(name)s"),
    N_("changed partner %(name)s"),
    N_("deleted organization %(name)s"),
    N_("deleted partner %(name)s"),
    N_("created the %(protocol)s profile of organization %(name)s%(more)s"),
    N_("changed the %(protocol)s profile of organization %(name)s%(more)s"),
    N_("created the %(protocol)s profile of partner %(name)s%(more)s"),
    N_("changed the %(protocol)s profile of partner %(name)s%(more)s"),
    N_("deleted the %(protocol)s profile of organization %(name)s"),
    N_("deleted the %(protocol)s profile of partner %(name)s"),
    N_("changed delivery settings: nothing"),
    N_("changed delivery settings: %(names)s"),
    N_("saved %(route)s"),
    # the services' (b2bhub.services)
    N_("intake checks of instance %(name)s: %(changes)s"),
    N_("EDI identities of organization %(name)s: %(identities)s (were %(before)s)"),
    N_("EDI identities of partner %(name)s: %(identities)s (were %(before)s)"),
    N_("EDI acknowledgments of organization %(name)s: %(acks)s (were %(before)s)"),
    N_("EDI acknowledgments of partner %(name)s: %(acks)s (were %(before)s)"),
    N_("created expected-message rule %(name)s (%(rule)s)"),
    N_("deleted expected-message rule %(name)s"),
    N_("created notification channel %(name)s (%(url)s; every alert kind)"),
    N_("created notification channel %(name)s (%(url)s; %(kinds)s)"),
    N_("deleted notification channel %(name)s"),
    N_("sent a test notification to channel %(name)s: sent"),
    N_("sent a test notification to channel %(name)s: failed: %(text)s"))]


#: a route's description (b2bhub.domain.routing.Route.describe) inside a line
ROUTE_TEXTS = [(_pattern_of(msgid), msgid) for msgid in (
    N_("route %(id)s: %(source)s, %(from_party)s -> %(to_party)s, %(document_type)s, "
       "%(target)s"),
    N_("new route: %(source)s, %(from_party)s -> %(to_party)s, %(document_type)s, "
       "%(target)s"),
    N_("route %(id)s: %(source)s, %(from_party)s -> %(to_party)s, %(target)s"),
    N_("new route: %(source)s, %(from_party)s -> %(to_party)s, %(target)s"))]
# a route created or deleted through the API (b2bhub.api.routing)
CHANGE_TEXTS += [
    (re.compile(r"^created (?P<route>(?:route \d+|new route): .*)$"), N_("created %(route)s")),
    (re.compile(r"^deleted (?P<route>route \d+: .*)$"), N_("deleted %(route)s")),
    (_pattern_of(N_("replaced route %(id)s by %(route)s")),
     N_("replaced route %(id)s by %(route)s")),
    # an instance's action (b2bhub.services.config.run_instance_action): its text the
    # type's, shown through the catalog when it is one of the texts here
    (re.compile(r"^instance (?P<name>[^:\s]+): (?P<text>.*)$"),
     N_("instance %(name)s: %(text)s"))]
# a host key fetched, pinned or removed by an operator: a party's profile's, or an
# instance's action (``instance %(name)s: %(text)s``); the protocol is a parameter
CHANGE_TEXTS += [(_pattern_of(msgid), msgid) for msgid in (
    N_("fetched the host key of %(where)s for the %(protocol)s profile of organization "
       "%(name)s: %(key)s (not pinned)"),
    N_("fetched the host key of %(where)s for the %(protocol)s profile of partner "
       "%(name)s: %(key)s (not pinned)"),
    N_("removed the pinned host key of the %(protocol)s profile of organization %(name)s"),
    N_("removed the pinned host key of the %(protocol)s profile of partner %(name)s"),
    N_("pinned the pasted host key %(key)s of %(where)s for the %(protocol)s profile of "
       "organization %(name)s"),
    N_("pinned the pasted host key %(key)s of %(where)s for the %(protocol)s profile of "
       "partner %(name)s"),
    N_("pinned the fetched host key %(key)s of %(where)s for the %(protocol)s profile of "
       "organization %(name)s"),
    N_("pinned the fetched host key %(key)s of %(where)s for the %(protocol)s profile of "
       "partner %(name)s"),
    N_("fetched the host key of %(where)s: %(key)s (not pinned)"),
    N_("pinned the pasted host key %(key)s of %(where)s"),
    N_("pinned the fetched host key %(key)s of %(where)s"))]


def _show_route(text: str, gettext) -> str:
    """A route's description in the reader's language, its names as stored."""
    for pattern, msgid in ROUTE_TEXTS:
        found = pattern.match(text)
        if found is not None:
            return gettext(msgid) % found.groupdict()
    return text


#: the operating system's words for the common failures, inside a reason of ours
#: (``[Errno 111] Connection refused``)
OS_ERRORS = (N_("Connection refused"), N_("Connection reset by peer"),
             N_("Connection timed out"), N_("No route to host"),
             N_("Name or service not known"), N_("Permission denied"),
             N_("No space left on device"), N_("No such file or directory"),
             N_("Read-only file system"), N_("Network is unreachable"))


def show_reason(text: str, gettext, prefixed: bool = True) -> str:
    """A reason inside a history line or alert: one of ours (:data:`REASON_TEXTS`, also
    after a ``what it was doing: `` prefix) through the catalog, else as stored (a
    destination's own words)."""
    for pattern, msgid in REASON_TEXTS:
        found = pattern.match(text)
        if found is not None:
            params = {key: _os_words(value, gettext) if key == "why" else value
                      for key, value in found.groupdict().items()}
            return gettext(msgid) % params if params else gettext(msgid)
    doing, colon, rest = text.partition(": ")
    if prefixed and colon and (shown_rest := show_reason(rest, gettext, False)) != rest:
        return f"{doing}: {shown_rest}"
    return text


def _os_words(text: str, gettext) -> str:
    for words in OS_ERRORS:
        if words in text:
            return text.replace(words, gettext(words))
    return text


def show_history_text(text: str | None, gettext) -> str:
    """A stored history line or alert text as a page shows it: a known form through
    ``gettext`` (status labels in it too), else as stored."""
    from b2bhub.domain.states import LABELS
    if not text:
        return ""
    by_label = {label: key for key, label in LABELS.items()}
    if text in by_label:  # a status line that is the new status alone ("Refused")
        return status_label(by_label[text], gettext)
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
        if params.get("verb") in VERBS:  # an operator action's word
            params["verb"] = gettext(params["verb"])
        for key in ("text", "reason"):  # a destination's words, or a reason of ours
            if key in params:
                params[key] = show_reason(params[key], gettext)
        if "word" in params:  # a lower-case state's word
            params["word"] = state_word(params["word"], gettext)
        return gettext(msgid) % params
    head, duplicate, tail = text.partition("; duplicate: ")
    if duplicate:  # refused for its envelope errors and as a duplicate at once
        return (f"{show_history_text(head, gettext)}; "
                f"{show_history_text('duplicate: ' + tail, gettext)}")
    actor, colon, change = text.partition(": ")
    shown_change = _show_change(change, gettext) if colon and " " not in actor else None
    if shown_change is not None:
        return gettext("%(actor)s: %(change)s") % {"actor": actor, "change": shown_change}
    return text


def _show_change(text: str, gettext) -> str | None:
    """A change of configuration (:data:`CHANGE_TEXTS`) in the reader's language, or
    None for a text that is none of them."""
    for pattern, msgid in CHANGE_TEXTS:
        found = pattern.match(text)
        if found is not None:
            params = {key: (_show_change(value, gettext) or show_reason(value, gettext))
                      if key == "text" else _show_route(value, gettext) if key == "route"
                      else value for key, value in found.groupdict().items()}
            return gettext(msgid) % params if params else gettext(msgid)
    return None


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
