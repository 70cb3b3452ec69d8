"""Certificate Exchange Messaging with a partner (docs/as2.md "Certificate exchange (CEM)").

Outbound: the operator's ``cem_request`` action sends our new certificate (with its key)
to a partner in a CEM request (:mod:`.cem_xml`). Once the partner's MDN confirms it, the
certificate is a row of the organization's profile (with its own start), *gated*: it
decrypts for every partner from then on (a partner that took it may encrypt with it
before its response reaches us), and signs for none. Offered to a second partner, the
same row serves (its role widened if the second request asks for more usages). The
partner's CEM response comes to our AS2 receiver like any message and is consumed here
(:func:`consume`): accepted for signing, the certificate signs what we send that partner
(messages and MDNs) from the later of its own start and the response's arrival, and
only that partner: for the others the previous signing certificate signs until they
accept it too (``profiles.choose_certs``). The gate is kept in the organization's
profile settings (``profiles.GATES``: certificate id -> its fingerprint, the partners it
signs for with their dates, the requests still open); the old certificate still
decrypts and verifies until it ends. When no ungated certificate, nor one the partner
accepted, is valid any more (the old one ended), a gated one signs for every partner,
with a warning line on each message: a partner that did not accept it may fail to
verify it, but the ended one would fail everywhere. Rejected, the request ends
``rejected`` with the partner's reason; the row goes when no partner took it and no
other request for it is open. A request with no answer by its RespondByDate is
``overdue`` and raises ``cem_unanswered``. A certificate an operator uploaded to the
organization's profile is not gated: offering it by CEM changes nothing of who it
signs for.

Inbound: a partner's CEM request is ``pending`` for an operator's ``cem_accept`` or
``cem_reject``, or accepted at once when the partner's profile has ``cem_auto_accept``;
either way our CEM response is owed and sent by the ``as2_cem`` job (or at once by the
operator's action). An accepted certificate joins the partner's profile when our
response was taken (its MDN positive), ``not_before`` the later of its start and that
moment; the partner's old certificate still verifies until it ends.

TLS (``tls`` among an operator's usages; CEM's ``tlsServer`` and ``tlsClient``): a
partner's certificate accepted for ``tlsServer`` is appended to its profile's
``tls_ca_bundle`` when our response was taken (the ones the bundle held kept), so our
sender verifies its new HTTPS server (:mod:`.tls` trusts a bundle's CA-issued leaf);
``tlsClient`` is noted only (our receiver checks no client certificate). Ours sent for
``tls`` is no AS2 certificate of the organization: accepted, it becomes the partner
profile's TLS client certificate from the later of its start and the response
(``tls_pending``, with its key, until the job switches it when that is later).

The requests are kept in the partner's profile settings (``cem``, a list), steps and
all, where the partner page reads them (an accepted request of ours with ``effective``,
from when it signs for that partner): a few per partner, removed with the profile;
no table, so no migration. Each step is also a history line (``cem``), naming the
operator when one acted. CEM messages are never routed: they are the AS2 plugin's.
They ask for a synchronous MDN whatever the profile says (there is no message row for
an asynchronous one to settle).
"""

from __future__ import annotations

import copy
import io
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

import requests
from cryptography import x509
from sqlalchemy.orm import Session

from b2bhub.plugin import (
    N_,
    ORGANIZATION,
    PARTNER,
    NewCertificate,
    NotFound,
    ServiceError,
    add_line,
    get_protocol_profile,
    joined,
    no_profile,
    profile_parties,
    raise_alert,
    resolve_alert,
    save_protocol_profile,
    utcnow,
)
from plugins.as2 import cem_xml, lib, mdn_in, profiles, sender, stream
from plugins.as2.cem_xml import CemFormatError, CemRequest, CemResponse, TrustRequest
from plugins.as2.certs import CertificateError, read_upload
from plugins.as2.tls import TLS_CLIENT

log = logging.getLogger(__name__)
ALERT = "cem_unanswered"
JOB = "as2_cem"
ACTIONS = ("cem_request", "cem_accept", "cem_reject")
SETTING = "cem"
#: what an operator's ``cem_request`` may ask of a partner: trust our certificate for
#: AS2 signing, encryption, and TLS (our HTTPS server's certificate and our client
#: certificate: CEM's ``tlsServer`` and ``tlsClient``)
USAGES = ("signing", "encryption", "tls")
#: the usages of a ``cem_request`` that names none
DEFAULT_USAGES = ("signing", "encryption")
AS2_USAGES = ("signing", "encryption")
#: CEM's usages (``cem_xml``'s words) of our ``tls``
TLS_WIRE = ("tls_server", "tls_client")
#: the usages of a partner's request we take: AS2 signing and encryption, its server's
#: certificate (into the profile's TLS CA bundle) and its client certificate (noted)
TAKEN = ("signing", "encryption", "tls_server", "tls_client")
DEFAULT_RESPOND_DAYS = 14
TIMEOUT = (10.0, 60.0)
#: how many requests a partner's profile keeps (the oldest settled ones go first)
KEEP = 20


@dataclass
class _Sent:
    """What the MDN check needs of a CEM message we sent (as :class:`As2Outbound`)."""

    as2_message_id: str
    mic: str | None
    digest_alg: str | None
    mdn_signed: bool


class CemError(Exception):
    """A CEM message could not be sent or was refused; the text says why."""


# --- the requests kept in the partner's profile -----------------------------------

def _profile(session: Session, name: str):
    found = get_protocol_profile(session, profiles.PROTOCOL, "partner", name)
    if found is None:
        raise NotFound(no_profile(PARTNER, name, "AS2"))
    return found


def records(settings: dict) -> list[dict]:
    return [dict(r) for r in settings.get(SETTING) or []]


def _store(session: Session, name: str, changed: dict, add=(), remove=(),
           settings: dict | None = None) -> None:
    """Write one request back into the partner's settings (and certificates, and the
    other ``settings`` given)."""
    found = _profile(session, name)
    kept = [r for r in records(found.settings) if r["id"] != changed["id"]] + [changed]
    settled = [r for r in kept if r["state"] not in ("sent", "pending", "overdue")
               and not r.get("tls_pending")]
    while len(kept) > KEEP and settled:
        kept.remove(settled.pop(0))
    settings = {**found.settings, **(settings or {}), SETTING: kept}
    save_protocol_profile(session, profiles.PROTOCOL, "partner", name, found.address,
                          settings, remove=remove, add=add)
    profiles.bump_profiles_version(session)


def _step(session: Session, record: dict, text: str, now: datetime, actor: str = "") -> None:
    record.setdefault("steps", []).append([_iso(now), text])
    add_line(session, None, "cem", text, actor=actor, now=now,
             data={"partner": record["partner"], "request_id": record["request_id"]})


def _iso(moment: datetime | None) -> str | None:
    return moment.replace(microsecond=0).isoformat() + "Z" if moment else None


def _when(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.rstrip("Z")) if text else None


def _org_profile(session: Session, organization: str | None):
    if organization:
        org = profiles.by_party(session, organization)
        if org is None or org.kind != ORGANIZATION:
            raise NotFound(no_profile(ORGANIZATION, organization, "AS2"))
        return org
    names = profile_parties(session, profiles.PROTOCOL, ORGANIZATION)
    if len(names) != 1:
        raise ServiceError(N_("name the organization whose certificate it is (%(names)s)",
                              names=", ".join(names)) if names else
                           N_("name the organization whose certificate it is (no "
                              "organization has an AS2 profile)"),
                           {"organization": "required"})
    return profiles.by_party(session, names[0])


def _role(usages) -> str:
    """The certificate role of AS2 ``usages`` (not empty)."""
    return "both" if {"signing", "encryption"} <= set(usages) else _as2(usages)[0]


def _as2(usages) -> list[str]:
    """The AS2 usages (signing, encryption) among ``usages``."""
    return [u for u in usages if u in AS2_USAGES]


# --- sending a CEM message ----------------------------------------------------------

def _send(store, org, partner, content_type: str, params: dict, body: bytes,
          subject: str) -> str:
    """Send one CEM document to the partner as an AS2 message built as its profile says
    (a synchronous MDN asked for); its AS2 Message-ID, or CemError with the reason."""
    refused = lib.refusal(org, "signing", partner=partner.party) if partner.get("sign") \
        else None
    refused = refused or (lib.refusal(partner, "encryption") if partner.get("encrypt")
                          else None)
    if refused:
        raise CemError(refused)
    if not partner.get("url"):
        raise CemError(f"the AS2 profile of '{partner.party}' has no url")
    made = copy.copy(lib.partner(partner))
    made.mdn_mode = "SYNC"
    sent_by = lib.organization(org, partner=partner.party)
    ws = stream.Workspace(store.root)
    try:
        built = stream.build(
            ws, io.BytesIO(body), sender=sent_by, receiver=made, filename=None,
            content_type=content_type, subject=subject, message_id=None,
            disposition_notification_to=lib.disposition_notification_to(org),
            key_encryption=partner.get("key_encryption"),
            sign_with=lib.sign_pair(sent_by) if made.sign else None,
            encrypt_for=lib.encrypt_cert(made) if made.encrypt else None,
            type_params=params)
        headers = {**built.headers, "User-Agent": lib.PRODUCT}
        try:
            answer, _note = sender.post(partner, headers, built.body,
                                        bool(partner.get("chunked")), TIMEOUT)
        except requests.RequestException as exc:
            raise CemError(f"the POST to {partner.get('url')} failed: {exc}") from None
    finally:
        ws.close()
    if not 200 <= answer.status_code < 300:
        raise CemError(f"HTTP {answer.status_code} from {partner.get('url')}: "
                       f"{answer.text[:200]}")
    raw = lib.wire(answer.headers.items(), answer.content)
    if not mdn_in.looks_like_mdn(lib.read_headers(raw.partition(b"\r\n\r\n")[0]), raw):
        raise CemError("the partner's answer carries no MDN")
    row = _Sent(built.message_id, built.mic.decode() if built.mic else None,
                built.digest_alg, bool(partner.get("mdn_signed")))
    receipt = mdn_in.read_mdn(raw, lambda _i, _r: mdn_in.original_message(row, org, partner))
    ok, text = mdn_in.judge(receipt, bool(partner.get("accept_mdn_without_mic")))
    if not ok:
        raise CemError(text)
    return built.message_id


# --- outbound: our new certificate to a partner -------------------------------------

def send_request(session: Session, store, name: str, body: dict, actor: str) -> dict:
    """The ``cem_request`` action: send our new certificate to partner ``name``."""
    partner = profiles.by_party(session, name)
    if partner is None or partner.kind != "partner":
        raise NotFound(no_profile(PARTNER, name, "AS2"))
    org = _org_profile(session, body.get("organization"))
    usages = body.get("usages") or list(DEFAULT_USAGES)
    if not isinstance(usages, list) or not usages or set(usages) - set(USAGES):
        raise ServiceError(N_("usages must be a list of %(usages)s", usages=", ".join(USAGES)),
                           {"usages": "invalid"})
    now = utcnow()
    respond_by = now + timedelta(days=DEFAULT_RESPOND_DAYS)
    if body.get("respond_by"):
        try:
            respond_by = cem_xml._date(str(body["respond_by"]))
        except CemFormatError:
            raise ServiceError(N_("respond_by %(given)r is not a date and time (ISO 8601, "
                                  "e.g. 2027-01-31T12:00:00Z)",
                                  given=str(body["respond_by"])[:40]),
                               {"respond_by": "invalid"}) from None
        if respond_by <= now:
            raise ServiceError(N_("respond_by must be in the future"),
                               {"respond_by": "in the past"})
    try:
        pair = read_upload(body.get("certificate") or {}, need_key=True)
    except CertificateError as exc:
        raise ServiceError(N_("certificate: %(problem)s", problem=exc.args[0]),
                           {"certificate": exc.args[0]}) from None
    if pair.not_after <= now:
        raise ServiceError(N_("the certificate %(subject)s has expired", subject=pair.subject),
                           {"certificate": "expired"})
    issuer, serial = cem_xml.identify(pair.pem)
    domain = lib.default_domain(org)
    request_id = f"cem-{secrets.token_hex(10)}@{domain}"
    url = org.get("mdn_url")
    wire = [w for u in dict.fromkeys(usages) for w in (TLS_WIRE if u == "tls" else (u,))]
    request = CemRequest(request_id, [TrustRequest(
        wire, respond_by, url, issuer, serial,
        f"cert-{secrets.token_hex(8)}@{domain}", pair.pem)])
    entity, params = cem_xml.request_entity(request, domain)
    record = {"id": secrets.token_hex(6), "direction": "out", "partner": name,
              "organization": org.party, "request_id": request_id, "usages": usages,
              "respond_by": _iso(respond_by), "subject": pair.subject, "issuer": issuer,
              "serial": serial, "not_before": _iso(pair.not_before),
              "not_after": _iso(pair.not_after), "state": "sent", "steps": []}
    try:
        msgid = _send(store, org, partner, "multipart/related", params, entity,
                      "Certificate Exchange Request")
    except CemError as exc:
        record["state"] = "failed"
        _step(session, record, f"{actor} sent a CEM request to {name} with the certificate "
              f"{pair.subject}: not taken: {exc}", now, actor)
        _store(session, name, record)
        session.commit()
        raise ServiceError(N_("the CEM request to %(partner)s was not taken: %(why)s",
                              partner=name, why=str(exc)),
                           {"partner": str(exc)}) from None
    # the new key decrypts from now on: the partner may encrypt with it as soon as it
    # has taken it, before its response reaches us; it signs for no partner yet (a
    # certificate for TLS only is no AS2 certificate: kept in the request until accepted)
    cert_id = _offer(session, org.party, pair, _as2(usages),
                     lambda gate: gate["open"].append(request_id)) if _as2(usages) else None
    record.update(as2_message_id=msgid, cert_id=cert_id)
    _step(session, record, f"{actor} sent a CEM request to {name} with the certificate "
          f"{pair.subject} (serial {serial}) of {org.party} for "
          f"{', '.join(usages)}; respond by {respond_by:%Y-%m-%d %H:%M} UTC "
          f"(AS2 message <{msgid}>)", now, actor)
    record["pem"], record["key"] = pair.pem, pair.private_key_pem
    _store(session, name, record)
    return public(record)


# --- our certificate offered by CEM: one row, gated per partner -----------------------
# The row is added to the organization's profile when the request is sent (its key
# decrypts from then on) and gated in the profile's settings (profiles.GATES): it signs
# only for the partners that accepted it, each from its own date (profiles.choose_certs).
# Offered to a second partner, the same row is used and gains that partner's acceptance.

def _offer(session: Session, org: str, pair, usages, change, legacy: int | None = None
           ) -> int:
    """Our certificate ``pair`` in the organization's profile for ``usages``: the row
    that has it already (its role widened if ``usages`` need more: the row replaced,
    its gate kept), else a new one from its own start, gated. ``change(gate)`` updates
    its gate (the requests open, the partners it signs for). A row an operator uploaded
    (no gate) stays ungated: it signs for everyone already; ``legacy``, the decrypt-only
    row of a request sent before gates were kept, is gated now. The row's id."""
    found = get_protocol_profile(session, profiles.PROTOCOL, ORGANIZATION, org)
    gates = {k: dict(v) for k, v in (found.settings.get(profiles.GATES) or {}).items()}
    role = _role(usages)
    same = _row_of(found, pair.pem)
    gate, remove, add = None, [], []
    if same is None:
        gate = _new_gate(pair.pem)
        add.append(_new_row(pair, role, pair.not_before, pair.not_after))
    else:
        gate = gates.pop(str(same.id), None)
        if gate is None and same.id == legacy:
            gate = _new_gate(pair.pem)
        had = "both" if same.usage in ("own", "partner") else same.usage
        if had not in ("both", role):
            remove.append(same.id)
            add.append(_new_row(_Pair(same.pem, same.private_key_pem or pair.private_key_pem,
                                      same.subject, same.issuer, same.not_after),
                                "both", same.not_before, same.not_after))
    if gate is not None:
        gate = {**gate, "open": list(gate.get("open") or []),
                "signs_for": dict(gate.get("signs_for") or {})}
        change(gate)
    before = {c.id for c in found.certificates}
    saved = save_protocol_profile(session, profiles.PROTOCOL, ORGANIZATION, org,
                                  found.address, dict(found.settings), remove=remove, add=add)
    cert_id = next(c.id for c in saved.certificates if c.id not in before) if add \
        else same.id
    if gate is not None:
        gates[str(cert_id)] = gate
    save_protocol_profile(session, profiles.PROTOCOL, ORGANIZATION, org, found.address,
                          {**found.settings, profiles.GATES: gates})
    profiles.bump_profiles_version(session)
    return cert_id


def _withdraw(session: Session, org: str, pem: str, request_id: str, partner: str,
              legacy: int | None = None) -> None:
    """A request for our certificate ``pem`` answered no by ``partner``: it signs for
    that partner no more (its latest word), and its row goes when no partner took it
    and no other request for it is open (a row without a gate stays, but the
    decrypt-only one of a request sent before gates were kept, ``legacy``)."""
    found = get_protocol_profile(session, profiles.PROTOCOL, ORGANIZATION, org)
    same = _row_of(found, pem) if found is not None else None
    if same is None:
        return
    gates = dict(found.settings.get(profiles.GATES) or {})
    gate = gates.get(str(same.id))
    if gate is None and same.id != legacy:
        return
    gate = {**(gate or {}), "open": [r for r in (gate or {}).get("open") or []
                                     if r != request_id],
            "signs_for": {k: v for k, v in ((gate or {}).get("signs_for") or {}).items()
                          if k != partner}}
    remove = []
    if gate.get("signs_for") or gate["open"]:
        gates[str(same.id)] = gate
    else:
        gates.pop(str(same.id), None)
        remove.append(same.id)
    save_protocol_profile(session, profiles.PROTOCOL, ORGANIZATION, org, found.address,
                          {**found.settings, profiles.GATES: gates}, remove=remove)
    profiles.bump_profiles_version(session)


def _row_of(found, pem: str):
    return next((c for c in profiles.as2_certs(found) if c.pem.strip() == pem.strip()), None)


def _new_gate(pem: str) -> dict:
    return {"fingerprint": profiles.fingerprint(pem), "signs_for": {}, "open": []}


def _new_row(pair, role: str, not_before, not_after) -> NewCertificate:
    return NewCertificate(usage=role, pem=pair.pem, private_key_pem=pair.private_key_pem,
                          subject=pair.subject[:500], issuer=pair.issuer[:500],
                          not_before=not_before, not_after=not_after)


def public(record: dict) -> dict:
    """A request as the API and the page show it: never a key."""
    return {k: v for k, v in record.items() if k not in ("key", "pem")}


# --- inbound: what a partner sent ---------------------------------------------------

def consume(session: Session, partner, org, entity, msgid: str, now: datetime) -> str:
    """Take a received CEM document (not routed); the history text of what was done.
    A document we cannot read raises CemFormatError (the message is refused)."""
    found = cem_xml.read_entity(entity)
    if isinstance(found, CemResponse):
        return _response_came(session, partner, org, found, msgid, now)
    return _request_came(session, partner, org, found, msgid, now)


def _request_came(session, partner, org, request: CemRequest, msgid: str, now) -> str:
    name = partner.party
    known = next((r for r in records(partner.settings) if r["direction"] == "in"
                  and r["request_id"] == request.request_id), None)
    if known is not None:  # a resend (the same Message-ID, or a partner's retry)
        text = (f"CEM request {request.request_id} from {name} again; it is "
                f"{known['state']} already")
        add_line(session, None, "cem", text, now=now, data={"partner": name})
        return text
    trusts = []
    for trust in request.trusts:
        cert = x509.load_pem_x509_certificate(trust.cert_pem.encode())
        trusts.append({"usages": trust.usages, "pem": trust.cert_pem,
                       "subject": cert.subject.rfc4514_string()[:500],
                       "issuer": trust.issuer, "serial": trust.serial,
                       "not_before": _iso(cert.not_valid_before_utc.replace(tzinfo=None)),
                       "not_after": _iso(cert.not_valid_after_utc.replace(tzinfo=None))})
    first = request.trusts[0]
    record = {"id": secrets.token_hex(6), "direction": "in", "partner": name,
              "organization": org.party, "request_id": request.request_id,
              "trusts": trusts, "respond_by": _iso(first.respond_by),
              "response_url": first.response_url, "state": "pending", "steps": [],
              "as2_message_id": msgid}
    subjects = "; ".join(f"{t['subject']} for {', '.join(t['usages'])}" for t in trusts)
    _step(session, record, f"CEM request {request.request_id} received from {name}: "
          f"{subjects}; respond by {_iso(first.respond_by) or 'no date'}", now)
    if partner.get("cem_auto_accept"):
        _decide(session, record, True, None, now, "")
    _store(session, name, record)
    return f"CEM request {request.request_id} from {name}: {record['state']}"


def _decide(session, record: dict, accept: bool, reason: str | None, now,
            actor: str) -> None:
    who = f"{actor} " if actor else "automatically (cem_auto_accept) "
    usable = [t for t in record["trusts"] if set(t["usages"]) <= set(TAKEN)]
    for trust in record["trusts"]:
        trust["accepted"] = accept and trust in usable
        if accept and trust not in usable:
            trust["reason"] = (f"usage {', '.join(trust['usages'])} is not taken by CEM "
                               "here (AS2 signing, encryption and TLS only)")
        elif not accept:
            trust["reason"] = reason or "rejected by the operator"
    record.update(state="accepted" if accept else "rejected", response="owed",
                  decided_at=_iso(now))
    _step(session, record, f"{who}{'accepted' if accept else 'rejected'} the CEM request "
          f"{record['request_id']} of {record['partner']}"
          + (f": {reason}" if reason and not accept else ""), now, actor)


def answer(session: Session, store, name: str, action: str, body: dict, actor: str) -> dict:
    """The ``cem_accept`` / ``cem_reject`` actions on a pending request; the response is
    sent at once (and again by the job should it fail)."""
    found = _profile(session, name)
    request_id = body.get("request_id")
    record = next((r for r in records(found.settings) if r["direction"] == "in"
                   and request_id in (r["request_id"], r["id"])), None)
    if record is None:
        raise NotFound(N_("partner '%(name)s' has no CEM request '%(request)s'", name=name,
                          request=request_id))
    if record["state"] != "pending":
        raise ServiceError(N_("the CEM request %(request)s is %(state)s already",
                              request=record["request_id"], state=record["state"]),
                           {"request_id": record["state"]})
    now = utcnow()
    _decide(session, record, action == "cem_accept", body.get("reason"), now, actor)
    _store(session, name, record)
    session.commit()
    record = _respond(session, store, record, now)
    return public(record)


def _respond(session: Session, store, record: dict, now: datetime) -> dict:
    """Send our owed response to a request; on its positive MDN take the accepted
    certificates into the partner's profile."""
    partner = profiles.by_party(session, record["partner"])
    org = profiles.by_party(session, record["organization"])
    response = CemResponse(record["request_id"], [cem_xml.TrustResponse(
        t["accepted"], t["issuer"], t["serial"], t.get("reason")) for t in record["trusts"]])
    try:
        if partner is None or org is None:
            raise CemError("the partner or the organization has no AS2 profile any more")
        msgid = _send(store, org, partner, cem_xml.XML_TYPE, {},
                      cem_xml.response_xml(response), "Certificate Exchange Response")
    except CemError as exc:
        record["attempts"] = record.get("attempts", 0) + 1
        record["response"] = "failed" if record["attempts"] >= 10 else "owed"
        _step(session, record, f"CEM response to {record['partner']} not taken "
              f"(attempt {record['attempts']}): {exc}", now)
        _store(session, record["partner"], record)
        session.commit()
        return record
    record["response"] = "sent"
    added, bundle, trusted = [], partner.get("tls_ca_bundle"), []
    for t in record["trusts"]:
        if t["accepted"]:
            start = max(_when(t["not_before"]), now)
            if _as2(t["usages"]):
                added.append(NewCertificate(usage=_role(t["usages"]), pem=t["pem"],
                                            private_key_pem=None, subject=t["subject"],
                                            issuer=t["issuer"][:500], not_before=start,
                                            not_after=_when(t["not_after"])))
            if "tls_server" in t["usages"]:
                bundle = _bundle_with(bundle, t["pem"])
            if {"tls_server", "tls_client"} & set(t["usages"]):
                trusted.append(t)
            t["effective"] = _iso(start)
    taken = "; ".join(f"{t['subject']} used from {t['effective']}"
                      for t in record["trusts"] if t["accepted"] and _as2(t["usages"]))
    _step(session, record, f"CEM response to {record['partner']} taken (AS2 message "
          f"<{msgid}>)" + (f"; the partner's new certificate {taken}" if taken else ""), now)
    for t in trusted:
        _step(session, record, _tls_trusted(t, record["partner"]), now)
    _store(session, record["partner"], record, add=added,
           settings={"tls_ca_bundle": bundle} if bundle != partner.get("tls_ca_bundle")
           else None)
    session.commit()
    return record


def _bundle_with(bundle: str | None, pem: str) -> str:
    """The TLS CA bundle ``bundle`` with the certificate ``pem`` appended (the ones it
    holds kept; one it holds already not added twice)."""
    pem = pem.strip() + "\n"
    if not bundle:
        return pem
    if pem.strip() in bundle:
        return bundle
    return bundle.rstrip() + "\n" + pem


def _tls_trusted(trust: dict, name: str):
    """The history text of a partner's certificate accepted for TLS."""
    if "tls_server" in trust["usages"]:
        text = N_("the certificate %(cert)s of %(partner)s (issued by %(issuer)s, valid "
                  "until %(end)s) trusted for TLS: added to the TLS CA bundle of its "
                  "profile, which verifies its HTTPS server; the certificates the bundle "
                  "held are kept until an operator removes them", cert=trust["subject"],
                  partner=name, issuer=trust["issuer"], end=trust["not_after"])
        if "tls_client" not in trust["usages"]:
            return text
        return joined([text, _tls_client_noted(trust, name)])
    return _tls_client_noted(trust, name)


def _tls_client_noted(trust: dict, name: str):
    return N_("the certificate %(cert)s of %(partner)s trusted for TLS as its client "
              "certificate: our AS2 receiver does not check client certificates itself; "
              "an HTTPS front server that asks for them needs it added",
              cert=trust["subject"], partner=name)


def _response_came(session, partner, org, response: CemResponse, msgid: str, now) -> str:
    name = partner.party
    record = next((r for r in records(partner.settings) if r["direction"] == "out"
                   and r["request_id"] == response.request_id), None)
    if record is None:
        text = (f"CEM response from {name} to a request we do not know "
                f"({response.request_id}); ignored")
        add_line(session, None, "cem", text, now=now, data={"partner": name})
        return text
    if record["state"] not in ("sent", "overdue"):
        text = f"CEM response {response.request_id} from {name} again; already {record['state']}"
        add_line(session, None, "cem", text, now=now, data={"partner": name})
        return text
    mine = next((t for t in response.trusts if t.serial == record["serial"]), None)
    accepted = mine is not None and mine.accepted
    if accepted:
        start = max(_when(record["not_before"]), now)
        org_name = record["organization"]
        signs = "signing" in record["usages"]

        def accept(gate):
            gate["open"] = [r for r in gate["open"] if r != record["request_id"]]
            if signs:  # an earlier acceptance of the same certificate stands
                gate["signs_for"][name] = min(gate["signs_for"].get(name) or _iso(start),
                                              _iso(start))
        pair = _Pair(record["pem"], record.get("key"), record["subject"], record["issuer"],
                     _when(record["not_after"]), _when(record["not_before"]))
        if _as2(record["usages"]):
            record["cert_id"] = _offer(session, org_name, pair, _as2(record["usages"]),
                                       accept, legacy=record.get("key_cert_id"))
        record.update(state="accepted", effective=_iso(start))
        if not _as2(record["usages"]):
            text = N_("CEM response from %(partner)s: accepted the certificate %(cert)s",
                      partner=name, cert=record["subject"])
        elif signs:
            text = N_("CEM response from %(partner)s: accepted the certificate %(cert)s; "
                      "%(org)s signs with it for %(partner)s from %(date)s (for the other "
                      "partners once they accept it); the old one still decrypts until it "
                      "ends", partner=name, cert=record["subject"], org=org_name,
                      date=_iso(start))
        else:
            text = (f"CEM response from {name}: accepted the certificate {record['subject']}; "
                    "it decrypts what the partner encrypts to it")
    else:
        reason = (mine.reason if mine else None) or "no reason given"
        if _as2(record["usages"]):
            _withdraw(session, record["organization"], record["pem"], record["request_id"],
                      name, legacy=record.get("key_cert_id"))
        record.update(state="rejected", reason=reason)
        text = f"CEM response from {name}: rejected the certificate {record['subject']}: {reason}"
    tls = accepted and "tls" in record["usages"]
    swap = {}
    if tls and start > now:  # switched by the job when due (run_due)
        record["tls_pending"] = _iso(start)
    elif tls:
        swap = _tls_client_swap(session, name, record)
    if not record.get("tls_pending"):
        record.pop("key", None)
    _step(session, record, text + f" (AS2 message <{msgid}>)", now)
    if tls:
        _step(session, record, _tls_client_text(record, start, now), now)
    _store(session, name, record, **swap)
    resolve_alert(session, ALERT, _subject(record), now)
    return text


def _tls_client_text(record: dict, start: datetime, now: datetime):
    if start > now:
        return N_("the certificate %(cert)s becomes our TLS client certificate for "
                  "%(partner)s on %(date)s (its start); the current one serves until "
                  "then", cert=record["subject"], partner=record["partner"],
                  date=_iso(start))
    return N_("the certificate %(cert)s is our TLS client certificate for %(partner)s "
              "from %(date)s (the one before it is replaced)", cert=record["subject"],
              partner=record["partner"], date=_iso(start))


def _tls_client_swap(session: Session, name: str, record: dict) -> dict:
    """What :func:`_store` replaces to make our certificate of ``record`` (with its key)
    the TLS client certificate of partner ``name``: ``add`` and ``remove``."""
    found = _profile(session, name)
    cert = x509.load_pem_x509_certificate(record["pem"].encode())
    return {"remove": [c.id for c in found.certificates if c.usage == TLS_CLIENT],
            "add": [NewCertificate(usage=TLS_CLIENT, pem=record["pem"],
                                   private_key_pem=record["key"],
                                   subject=record["subject"][:500],
                                   issuer=cert.issuer.rfc4514_string()[:500],
                                   not_before=_when(record["not_before"]),
                                   not_after=_when(record["not_after"]))]}


@dataclass
class _Pair:
    pem: str
    private_key_pem: str | None
    subject: str
    issuer: str
    not_after: datetime | None
    not_before: datetime | None = None


def _subject(record: dict) -> str:
    return f"{record['partner']}: {record['request_id']}"[:200]


# --- the job: responses owed, requests overdue ----------------------------------------

def run_due(session: Session, store, now: datetime) -> int:
    """Send owed responses; mark unanswered requests overdue and raise their alert."""
    done = 0
    for name in profile_parties(session, profiles.PROTOCOL, "partner"):
        found = get_protocol_profile(session, profiles.PROTOCOL, "partner", name)
        for record in records(found.settings):
            if record["direction"] == "in" and record.get("response") == "owed":
                _respond(session, store, record, now)
                done += 1
            elif record["direction"] == "out" and record.get("tls_pending") and \
                    _when(record["tls_pending"]) <= now:
                swap = _tls_client_swap(session, name, record)
                record.pop("tls_pending")
                record.pop("key", None)
                _step(session, record, N_(
                    "the certificate %(cert)s is our TLS client certificate for "
                    "%(partner)s from now (its start, %(date)s)", cert=record["subject"],
                    partner=name, date=_iso(_when(record["effective"]))), now)
                _store(session, name, record, **swap)
                session.commit()
                done += 1
            elif record["direction"] == "out" and record["state"] == "sent" and \
                    _when(record["respond_by"]) < now:
                record["state"] = "overdue"
                text = (f"the CEM request {record['request_id']} to {name} "
                        f"({record['subject']}) has no answer; it was due by "
                        f"{record['respond_by']}")
                _step(session, record, text, now)
                _store(session, name, record)
                raise_alert(session, ALERT, _subject(record), text, now=now)
                session.commit()
                done += 1
    return done
