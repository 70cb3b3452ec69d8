"""The engine's history lines and alert texts, stored in English, are shown in Brazilian
Portuguese through the catalog (docs/i18n.md, "History lines and alerts shown through
the catalog"): the main scenarios of a message's life are driven through the engine,
and every text they stored must render with no English form left; what is shown as
stored is only the documented pass-through part (a destination's own reason, a name).
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from b2bhub.domain import i18n
from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine import operator
from b2bhub.engine.dispatch import NewMessage, store_collection_error
from b2bhub.engine.machine import claiming, settlement, wake
from b2bhub.engine.probes import ProbeResult, record
from b2bhub.engine.settings import load_settings
from b2bhub.models import Alert, HistoryLine, utcnow

PT = i18n.translations("pt_BR")
#: the destinations' own words in these scenarios: parameters, shown as they said them
THEIR_WORDS = ("disk full", "HTTP 503 from the partner", "connection refused by peer")


def pt(text: str) -> str:
    return i18n.show_history_text(text, PT.gettext)


def english_left(shown: str) -> str:
    """What is still English in a shown text, once the pass-through parts are out."""
    for words in THEIR_WORDS:
        shown = shown.replace(words, "")
    return shown


def settle(session, outcome, now):
    [claim] = claiming.claim(session, "writer_a", "w1", now, 1, 300)
    settlement.settle(session, claim, outcome, RetryPolicy(), now)
    session.commit()
    return claim


def test_every_stored_text_of_the_main_scenarios_renders_in_portuguese(hub, session,
                                                                     record_dir):
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    hub.instance("inbox", "manual_source")
    hub.instance("other", "manual_source")
    hub.instance("writer_a", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "writer_a")
    now = utcnow()

    delivered = hub.message()  # received, queued, attempt started, delivered
    settle(session, Outcome.delivered(), now)

    hub.message()  # our classified reasons are shown translated
    settle(session, Outcome.failed("connection to erp.example:443 failed: [Errno 111] "
                                   "Connection refused (after 0.012 s)"), now)
    hub.message()
    settle(session, Outcome.failed("upload /in/po-7.edi: permission denied"), now)

    failed = hub.message()  # an attempt fails and is retried, then fails for good
    settle(session, Outcome.retry("HTTP 503 from the partner"), now)
    settle(session, Outcome.failed("disk full"), now + timedelta(hours=1))
    operator.redeliver(session, failed.deliveries[0].id, "ada", now)  # an operator's
    session.commit()

    hub.message(source="other")  # no route: not routed, and its alert
    cancelled = hub.message()
    operator.cancel_message(session, cancelled.id, "ada", now)
    session.commit()

    stalled = hub.message()  # woken again and again with no claim: stalled, alerted
    settings = load_settings(session)
    stalled.deliveries[0].wake_count = settings.stall_after
    stalled.deliveries[0].next_wake_at = now
    session.commit()
    assert wake.stall_unclaimed(session, now + timedelta(seconds=1), settings, 10) == 1
    operator.redispatch(session, stalled.id, "ada", now)
    session.commit()

    record(session, "writer_a", ProbeResult(False, "connection refused by peer"), now,
           now + timedelta(seconds=1))
    store_collection_error(session, NewMessage("inbox", "acme", "mycompany", {}),
                           "connection refused by peer", now)
    session.commit()

    lines = session.scalars(select(HistoryLine.text).where(
        HistoryLine.message_id.is_not(None))).all()
    alerts = session.scalars(select(Alert.text)).all()
    assert {delivered.id, failed.id, cancelled.id} and len(alerts) >= 5
    left = {text: pt(text) for text in [*lines, *alerts]
            if english_left(text).strip() and english_left(pt(text)) == english_left(text)}
    assert not left, "\n".join(left)
    shown = {pt(text) for text in [*lines, *alerts]}
    assert "writer_a: a tentativa 1 falhou: HTTP 503 from the partner; nova tentativa às " \
           f"{now + timedelta(seconds=30):%Y-%m-%d %H:%M:%S} UTC" in shown
    assert "ada pediu para reprocessar a entrega para writer_a" in shown
    assert "writer_a: na fila (novo despacho)" in shown and "Erro de coleta" in shown
    assert "writer_a: a tentativa 1 falhou: a conexão com erp.example:443 falhou: [Errno " \
           "111] Conexão recusada (após 0.012 s)" in shown
    assert "writer_a: a tentativa 1 falhou: upload /in/po-7.edi: permissão negada" in shown


def test_envelope_check_lines_render_in_portuguese_the_inspectors_words_as_stored():
    """The envelope checks' lines and alert (b2bhub.engine.envelope_checks) are ours;
    each envelope error inside is the inspector's text about the partner's interchange,
    shown as stored."""
    assert pt("envelope errors: IEA01 says 2 groups, 1 found (accepted, as the source's "
              "edi_errors says)") == ("erros de envelope: IEA01 says 2 groups, 1 found "
                                      "(aceita, como manda o edi_errors da origem)")
    assert pt("message 8: interchange 000000905 from ZZ:ACME was received before as "
              "message 3") == ("mensagem 8: o intercâmbio 000000905 de ZZ:ACME já foi "
                               "recebido como a mensagem 3")


def test_receipts_instances_cleanup_and_changes_render_in_portuguese(hub, session,
                                                                     record_dir):
    """Lines of the engine and the services beyond a message's main path: a receipt
    that settles nothing, an instance stopped and started, a cleanup run, changes of
    configuration; each stored in English and shown in Portuguese."""
    from b2bhub.engine.cleanup import run_cleanup
    from b2bhub.engine.instances import start_instance, stop_instance
    from b2bhub.services import expected
    hub.parties(organizations=("mycompany",), partners=("acme",))
    hub.instance("inbox", "manual_source")
    hub.instance("writer_a", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "writer_a")
    now = utcnow()
    delivered = hub.message()
    settle(session, Outcome.delivered(), now)
    try:
        operator.record_receipt(session, delivered.deliveries[0].id, True, "filed",
                                "ada", now)
    except operator.ReceiptRefused:
        session.commit()
    stop_instance(session, "writer_a", "ada", now)
    stop_instance(session, "writer_a", "ada", now)
    start_instance(session, "writer_a", "ada", now)
    start_instance(session, "writer_a", "ada", now)
    expected.create_rule(session, {"name": "invoices", "direction": "inbound",
                                   "schedule": "0 6 * * *"}, "ada", now)
    expected.delete_rule(session, "invoices", "ada", now)
    session.commit()
    run_cleanup(session, hub.store, now, "tests", actor="ada")
    stored = session.scalars(select(HistoryLine.text).where(HistoryLine.type.in_((
        "receipt_refused", "instance_stopped", "instance_started", "cleanup",
        "config_changed"))).order_by(HistoryLine.id)).all()
    shown = [pt(text) for text in stored]
    assert shown[:5] == [
        "writer_a: o recibo None não pode ser atribuído: a entrega está Entregue; ada "
        "informou o recibo: concluído: filed",
        "ada parou writer_a", "ada: writer_a já estava parada", "ada iniciou writer_a",
        "ada: writer_a não estava parada (habilitada)"], stored
    assert shown[5].startswith("ada: regra de mensagem esperada invoices criada (inbound "), \
        stored[5]
    assert shown[6] == "ada: regra de mensagem esperada invoices excluída"
    assert shown[7].startswith("ada: a limpeza removeu 0 mensagens (0 bytes em linhas de "
                               "conteúdo), "), stored[7]
    # a reported receipt, a late outcome, the OpenPGP stages, an acknowledgment, a
    # token, as the engine and the plugins write them
    assert pt("writer_a: ops reported the receipt: failed: rejected by the ERP") == (
        "writer_a: ops informou o recibo: falhou: rejected by the ERP")
    assert pt("writer_a: no receipt within 4h") == "writer_a: nenhum recibo em 4h"
    assert pt("writer_a: outcome 'delivered' of attempt 1 arrived after the delivery "
              "moved on (now Cancelled, attempt 1); ignored") == (
        "writer_a: o resultado 'delivered' da tentativa 1 chegou depois que a entrega "
        "avançou (agora Cancelada, tentativa 1); ignorado")
    assert pt("OpenPGP for sftp_out: encrypted to acme's key 0A1B and signed with "
              "mycompany's key 2C3D; stored as the sent stage") == (
        "OpenPGP para sftp_out: criptografado com a chave 0A1B de acme e assinado com a "
        "chave 2C3D de mycompany; armazenado como o estágio enviado")
    assert pt("OpenPGP: decrypted and signature of acme verified") == (
        "OpenPGP: descriptografado e assinatura de acme verificada")
    assert pt("997 sent as message 12: accepted") == "997 enviado como mensagem 12: accepted"
    assert pt("ada created intake token 'ci' of http_in") == (
        "ada criou o token de entrada 'ci' de http_in")
    assert pt("ada: created partner globex") == "ada: parceiro globex criado"
    assert pt("cleanup: cleanup failed: disk full") == "cleanup: a limpeza falhou: disk full"


def test_a_refusal_for_envelope_errors_and_a_duplicate_at_once_renders_in_portuguese():
    """A source that refuses both (edi_errors and duplicates: refuse) stores the two
    reasons in one text (b2bhub.engine.envelope_checks); each is shown through the
    catalog, the envelope errors in the inspector's words as stored."""
    assert pt("envelope errors: IEA01 says 2 groups, 1 found; duplicate: interchange "
              "000000905 from ZZ:ACME was received before as message 3") == (
        "erros de envelope: IEA01 says 2 groups, 1 found; duplicata: o intercâmbio "
        "000000905 de ZZ:ACME já foi recebido como a mensagem 3")


def test_host_key_lines_render_in_portuguese_the_protocol_as_stored():
    """A host key fetched, pinned or removed on a party's profile or by an instance's
    action: the core knows the words, the protocol is the line's own."""
    assert pt("ada: removed the pinned host key of the SFTP profile of partner acme") == (
        "ada: removeu a chave do host fixada do perfil SFTP do parceiro acme")
    assert pt("ada: pinned the pasted host key ssh-ed25519 SHA256:abc of 127.0.0.1:22 for "
              "the SFTP profile of partner acme") == (
        "ada: fixou a chave do host colada ssh-ed25519 SHA256:abc de 127.0.0.1:22 para o "
        "perfil SFTP do parceiro acme")
    assert pt("ada: instance out: fetched the host key of 127.0.0.1:22: ssh-ed25519 "
              "SHA256:abc (not pinned)") == (
        "ada: instância out: obteve a chave do host de 127.0.0.1:22: ssh-ed25519 "
        "SHA256:abc (não fixada)")
