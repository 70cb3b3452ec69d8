"""The documents of Certificate Exchange Messaging (EDIINT CEM,
draft-meadors-certificate-exchange-14): the request and response XML and the
``multipart/related`` entity a request travels in. Plain functions, no database.

A request is ``multipart/related; type="application/ediint-cert-exchange+xml"``: its root
part the ``<EDIINTCertificateExchangeRequest>`` (a ``<RequestID>`` and one
``<TrustRequest>`` per certificate: its ``<CertUsage>`` values, ``<RespondByDate>``,
``<ResponseURL>``, the ``<EndEntity>``'s issuer and serial and the Content-ID of the part
holding it), then one ``application/pkcs7-mime; smime-type=certs-only`` part per
certificate. A response is the ``<EDIINTCertificateExchangeResponse>`` alone: the
request's ID and a ``<TrustResponse>`` per certificate (``<CertStatus>`` Accepted or
Rejected, ``<RejectionReason>``, ``<CertificateReference>``: issuer and serial).

Reading goes by local names: the drafts' versions (and the products that follow one of
them, Mendelson's among them) differ in the namespace URI, and some put the issuer and
serial inside ``<ds:X509IssuerSerial>``, some straight under ``<CertificateIdentifier>``.
XML is parsed with ``defusedxml`` (no entities, no DTDs, no external references).
"""

from __future__ import annotations

import base64
import secrets
import xml.etree.ElementTree as ET  # noqa: S405  (writing only; reading is defusedxml's)
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email import message_from_bytes, policy

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, pkcs7
from defusedxml import ElementTree as SafeET
from defusedxml.common import DefusedXmlException

NS = "http://www.ietf.org/internet-drafts/draft-meadors-certificate-exchange-14.txt"
DS = "http://www.w3.org/2000/09/xmldsig#"
XML_TYPE = "application/ediint-cert-exchange+xml"
#: our usage words and CEM's <CertUsage> values
USAGES = {"signing": "digitalSignature", "encryption": "keyEncipherment",
          "tls_client": "tlsClient", "tls_server": "tlsServer"}
_OURS = {v.lower(): k for k, v in USAGES.items()}


class CemFormatError(ValueError):
    """A CEM document we cannot read; the text says what is wrong."""


@dataclass
class TrustRequest:
    usages: list[str]
    respond_by: datetime | None
    response_url: str | None
    issuer: str
    serial: str
    content_id: str
    cert_pem: str | None = None  # found in the request's parts by its Content-ID


@dataclass
class CemRequest:
    request_id: str
    trusts: list[TrustRequest] = field(default_factory=list)


@dataclass
class TrustResponse:
    accepted: bool
    issuer: str
    serial: str
    reason: str | None = None


@dataclass
class CemResponse:
    request_id: str
    trusts: list[TrustResponse] = field(default_factory=list)


# --- writing -----------------------------------------------------------------------

def _iso(moment: datetime) -> str:
    return moment.replace(microsecond=0).isoformat() + "Z"


def _ref(parent: ET.Element, tag: str, issuer: str, serial: str) -> None:
    ref = ET.SubElement(parent, tag)
    pair = ET.SubElement(ref, f"{{{DS}}}X509IssuerSerial")
    ET.SubElement(pair, f"{{{DS}}}X509IssuerName").text = issuer
    ET.SubElement(pair, f"{{{DS}}}X509SerialNumber").text = serial


def _doc(root: ET.Element) -> bytes:
    ET.register_namespace("", NS)
    ET.register_namespace("ds", DS)
    return ET.tostring(root, encoding="UTF-8", xml_declaration=True)


def request_xml(request: CemRequest) -> bytes:
    root = ET.Element(f"{{{NS}}}EDIINTCertificateExchangeRequest")
    ET.SubElement(root, f"{{{NS}}}RequestID").text = request.request_id
    for trust in request.trusts:
        t = ET.SubElement(root, f"{{{NS}}}TrustRequest")
        for usage in trust.usages:
            ET.SubElement(t, f"{{{NS}}}CertUsage").text = USAGES[usage]
        if trust.respond_by:
            ET.SubElement(t, f"{{{NS}}}RespondByDate").text = _iso(trust.respond_by)
        if trust.response_url:
            ET.SubElement(t, f"{{{NS}}}ResponseURL").text = trust.response_url
        end = ET.SubElement(t, f"{{{NS}}}EndEntity")
        _ref(end, f"{{{NS}}}CertificateIdentifier", trust.issuer, trust.serial)
        ET.SubElement(end, f"{{{NS}}}CertificateContentID").text = trust.content_id
    return _doc(root)


def response_xml(response: CemResponse) -> bytes:
    root = ET.Element(f"{{{NS}}}EDIINTCertificateExchangeResponse")
    ET.SubElement(root, f"{{{NS}}}RequestID").text = response.request_id
    for trust in response.trusts:
        t = ET.SubElement(root, f"{{{NS}}}TrustResponse")
        ET.SubElement(t, f"{{{NS}}}CertStatus").text = "Accepted" if trust.accepted \
            else "Rejected"
        if not trust.accepted and trust.reason:
            ET.SubElement(t, f"{{{NS}}}RejectionReason").text = trust.reason[:500]
        _ref(t, f"{{{NS}}}CertificateReference", trust.issuer, trust.serial)
    return _doc(root)


def identify(cert_pem: str) -> tuple[str, str]:
    """(issuer, serial) as CEM names a certificate: the RFC 4514 issuer, the decimal
    serial number."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    return cert.issuer.rfc4514_string(), str(cert.serial_number)


def request_entity(request: CemRequest, domain: str) -> tuple[bytes, dict]:
    """The body of a request's ``multipart/related`` entity and its Content-Type
    parameters; each trust's certificate in a part of its own (certs-only PKCS#7)."""
    boundary = f"----=_CEM_{secrets.token_hex(12)}"
    root_id = f"cem-request-{secrets.token_hex(8)}@{domain}"
    xml = request_xml(request)
    parts = [(f"Content-Type: {XML_TYPE}\r\nContent-ID: <{root_id}>\r\n"
              "Content-Transfer-Encoding: binary\r\n\r\n").encode() + xml]
    for trust in request.trusts:
        cert = x509.load_pem_x509_certificate((trust.cert_pem or "").encode())
        der = pkcs7.serialize_certificates([cert], Encoding.DER)
        parts.append((
            "Content-Type: application/pkcs7-mime; smime-type=certs-only; name=cert.p7c\r\n"
            f"Content-ID: <{trust.content_id}>\r\nContent-Transfer-Encoding: base64\r\n"
            "\r\n").encode() + base64.encodebytes(der).replace(b"\n", b"\r\n"))
    mark = f"--{boundary}".encode()
    body = b"".join(mark + b"\r\n" + part + b"\r\n" for part in parts) + mark + b"--\r\n"
    return body, {"boundary": boundary, "type": XML_TYPE, "start": f"<{root_id}>"}


# --- reading -----------------------------------------------------------------------

def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(node, name: str) -> list:
    return [c for c in node if _local(c.tag) == name]


def _text(node, name: str) -> str | None:
    found = _children(node, name)
    return (found[0].text or "").strip() if found else None


def _find(node, name: str):
    return next((n for n in node.iter() if _local(n.tag) == name), None)


def _issuer_serial(node) -> tuple[str, str]:
    issuer, serial = _find(node, "X509IssuerName"), _find(node, "X509SerialNumber")
    if issuer is None or serial is None:
        raise CemFormatError("a certificate reference without X509IssuerName and "
                             "X509SerialNumber")
    return (issuer.text or "").strip(), (serial.text or "").strip()


def _date(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CemFormatError(f"RespondByDate '{text[:40]}' is not an XML dateTime") from None
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


def parse_xml(data: bytes) -> CemRequest | CemResponse:
    """A CEM request or response from its XML; CemFormatError naming what is wrong."""
    try:
        root = SafeET.fromstring(data)
    except (SafeET.ParseError, DefusedXmlException) as exc:
        raise CemFormatError(f"the CEM document is not XML we read: {exc}") from None
    kind = _local(root.tag)
    request_id = _text(root, "RequestID")
    if not request_id:
        raise CemFormatError(f"{kind} without a RequestID")
    if kind == "EDIINTCertificateExchangeRequest":
        request = CemRequest(request_id[:200])
        for t in _children(root, "TrustRequest"):
            usages = [_OURS.get((u.text or "").strip().lower(), (u.text or "").strip())
                      for u in _children(t, "CertUsage")]
            end = _find(t, "EndEntity")
            if end is None:
                raise CemFormatError("a TrustRequest without an EndEntity")
            ident = _find(end, "CertificateIdentifier")
            issuer, serial = _issuer_serial(ident if ident is not None else end)
            content_id = (_text(end, "CertificateContentID") or "").strip("<> ")
            request.trusts.append(TrustRequest(
                usages, _date(_text(t, "RespondByDate")), _text(t, "ResponseURL"),
                issuer, serial, content_id))
        if not request.trusts:
            raise CemFormatError("a CEM request without a TrustRequest")
        return request
    if kind == "EDIINTCertificateExchangeResponse":
        response = CemResponse(request_id[:200])
        for t in _children(root, "TrustResponse"):
            status = (_text(t, "CertStatus") or "").lower()
            if status not in ("accepted", "rejected"):
                raise CemFormatError(f"CertStatus '{status}' is neither Accepted nor "
                                     "Rejected")
            ref = _find(t, "CertificateReference")
            issuer, serial = _issuer_serial(ref if ref is not None else t)
            response.trusts.append(TrustResponse(status == "accepted", issuer, serial,
                                                 _text(t, "RejectionReason")))
        return response
    raise CemFormatError(f"<{kind}> is no CEM document")


def is_cem(entity) -> bool:
    """Whether a received document (an email Message) is a CEM request or response."""
    kind = entity.get_content_type()
    return kind == XML_TYPE or (kind == "multipart/related" and (
        (entity.get_param("type") or "").lower() == XML_TYPE
        or any(p.get_content_type() == XML_TYPE for p in _parts(entity))))


def _parts(entity) -> list:
    payload = entity.get_payload()
    if isinstance(payload, list):
        return payload
    if isinstance(payload, (bytes, str)):  # a body pyas2lib kept whole: parse it
        head = "".join(f"{k}: {v}\r\n" for k, v in entity.items()).encode()
        body = payload.encode("latin-1") if isinstance(payload, str) else payload
        made = message_from_bytes(head + b"\r\n" + body, policy=policy.compat32)
        found = made.get_payload()
        return found if isinstance(found, list) else []
    return []


def read_entity(entity) -> CemRequest | CemResponse:
    """The CEM document of a received entity: its XML, and for a request each
    certificate taken from the part its CertificateContentID names."""
    if entity.get_content_type() == XML_TYPE:
        return parse_xml(entity.get_payload(decode=True) or b"")
    parts = _parts(entity)
    root = next((p for p in parts if p.get_content_type() == XML_TYPE), None)
    if root is None:
        raise CemFormatError("a multipart/related CEM message without its XML part")
    found = parse_xml(root.get_payload(decode=True) or b"")
    if isinstance(found, CemRequest):
        by_id = {(p.get("Content-ID") or "").strip("<> "): p for p in parts}
        for trust in found.trusts:
            part = by_id.get(trust.content_id)
            if part is None:
                raise CemFormatError(f"no part has the Content-ID <{trust.content_id}> "
                                     "the request names")
            trust.cert_pem = certificate_pem(part.get_payload(decode=True) or b"")
    return found


def certificate_pem(data: bytes) -> str:
    """The end-entity certificate of a certs-only PKCS#7 (DER or PEM) or a plain
    certificate (DER or PEM), as PEM."""
    loaders = (pkcs7.load_der_pkcs7_certificates, pkcs7.load_pem_pkcs7_certificates,
               lambda d: [x509.load_der_x509_certificate(d)],
               lambda d: [x509.load_pem_x509_certificate(d)])
    for load in loaders:
        try:
            certs = load(data)
        except ValueError:
            continue
        if certs:
            return certs[0].public_bytes(Encoding.PEM).decode()
    raise CemFormatError("the certificate part holds no certificate we read")
