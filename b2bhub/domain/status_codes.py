"""The status contract of seed 003's middleware (docs/status-codes.md): its literal
identifiers, which clients already filter by and read, beside b2bhub's own statuses.

They are API identifiers, never translated and never shown as labels. Every status of
ours is exactly one of them (:data:`STATUS_CODES`); ours is finer in places, and each
such place is said here and in the docs. Plain Python: no Flask, no SQLAlchemy.

=================  ======================  =============================================
b2bhub status      seed identifier         why
=================  ======================  =============================================
received           ENFILEIRADA             stored with every delivery queued: the
                                           delivery row is the job, made in the same
                                           transaction, so "stored but not queued"
                                           never happens to a routed message
in_progress        PROCESSANDO             a worker is delivering (some may still be
                                           queued behind it)
awaiting_receipt   PROCESSANDO             sent; the partner's receipt (an MDN, a
                                           callback) is still to come, so not done yet
retrying           AGUARDANDO_REENVIO      failed, waiting out the backoff
deferred           ENFILEIRADA             held in its sequence behind a delivery that
                                           must go first: still waiting for a worker
stalled            ENFILEIRADA             woken many times and never claimed (no
                                           worker for its target): still waiting, with
                                           the ``delivery_stalled`` alert ours adds
delivered          PROCESSADA              every delivery done (or skipped)
not_routed         NAO_PROCESSADA          stored, and no route gave it a delivery
refused            NAO_PROCESSADA          stored, and refused by a check at intake (an
                                           envelope error, a duplicate): never queued,
                                           and not reprocessable from Delivery Errors as
                                           the seed's ERRO_NEGOCIO is
cancelled          CANCELADA               discarded by an operator
collection_error   ERRO_COLETA             a scheduled source could not fetch
business_error     ERRO_NEGOCIO            the destination answered with a business
                                           error
error              ERRO_ENTREGA            a technical failure after the retries
=================  ======================  =============================================
"""

from __future__ import annotations

from collections.abc import Iterable

from b2bhub.domain.states import MessageStatus as S

#: the seed's identifiers, in the seed's order
CODES = ("NAO_PROCESSADA", "ENFILEIRADA", "PROCESSANDO", "PROCESSADA", "AGUARDANDO_REENVIO",
         "ERRO_ENTREGA", "ERRO_NEGOCIO", "ERRO_COLETA", "CANCELADA")

#: each status of ours, and the one seed identifier it is
STATUS_CODES: dict[S, str] = {
    S.RECEIVED: "ENFILEIRADA",
    S.IN_PROGRESS: "PROCESSANDO",
    S.AWAITING_RECEIPT: "PROCESSANDO",
    S.RETRYING: "AGUARDANDO_REENVIO",
    S.DEFERRED: "ENFILEIRADA",
    S.STALLED: "ENFILEIRADA",
    S.DELIVERED: "PROCESSADA",
    S.NOT_ROUTED: "NAO_PROCESSADA",
    S.REFUSED: "NAO_PROCESSADA",
    S.CANCELLED: "CANCELADA",
    S.COLLECTION_ERROR: "ERRO_COLETA",
    S.BUSINESS_ERROR: "ERRO_NEGOCIO",
    S.ERROR: "ERRO_ENTREGA",
}


def status_code(status: str | None) -> str | None:
    """The seed's identifier of one of our statuses (None for None)."""
    return None if status is None else STATUS_CODES[S(status)]


def statuses_of(values: Iterable[str] | None) -> list[str] | None:
    """Our statuses for a filter given in ours, the seed's identifiers or both (each
    identifier stands for every status mapped to it), in the order given, each once;
    None for no filter. A value that is neither raises ``ValueError``."""
    if values is None:
        return None
    out: dict[str, None] = {}
    for value in values:
        if value in CODES:
            out.update((str(s), None) for s, code in STATUS_CODES.items() if code == value)
        else:
            out[str(S(value))] = None
    return list(out)


def codes_counted(by_status: dict[str, int]) -> dict[str, int]:
    """Counts by our status as counts by the seed's identifier (those with any)."""
    out: dict[str, int] = {}
    for status, count in by_status.items():
        code = status_code(status)
        out[code] = out.get(code, 0) + count
    return out
