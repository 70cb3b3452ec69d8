"""Certificate exchange (CEM) in a real browser between two hubs on loopback: ALPHA (a
real hub: gunicorn, a worker and beat) and BETA (a second hub on its own database,
served in the test process, ``tests/test_as2_cem.py``). ALPHA's admin sends the new
certificate from the partner's AS2 page; BETA's admin sees the request awaiting
approval on its partner page and accepts it; ALPHA's page shows the answer, every step
and the new certificate with its start. Screenshots go to ``test-artifacts/``."""

from __future__ import annotations

import datetime as dt

import pytest

from b2bhub.services.users import create_user
from tests import test_browser as kit
from tests.test_as2_cem import Side, alpha_hub, beta_hub, close, keys  # noqa: F401

pytestmark = pytest.mark.processes
hub_url, page_for, shot = kit.hub_url, kit.page_for, kit.shot


def test_an_admin_sends_a_certificate_and_the_partner_hub_accepts_it(
        browser, hub_url, app, hub, registry, session, keys, tmp_path):  # noqa: F811
    alpha = Side(app, hub_url)
    beta, server = beta_hub(tmp_path, keys, alpha)
    try:
        alpha_hub(hub, registry, session, keys, alpha, beta)
        with beta as beta_session:
            create_user(beta_session, "bea", kit.PASSWORD, "admin")
            beta_session.commit()
        new_cert, new_key = keys["alpha_new"]
        pem = tmp_path / "alpha-2027.pem"
        pem.write_text(new_key + new_cert)
        respond_by = (dt.date.today() + dt.timedelta(days=10)).isoformat()

        page = page_for(browser, hub_url, "ada")
        page.goto("/ui/parties/partner/betapartner/as2")
        assert "None." in page.inner_text("#cem-requests")
        page.set_input_files("#cem-request input[name=cem_certificate]", str(pem))
        page.fill("#cem-request input[name=cem_respond_by]", respond_by)
        page.click("#cem-request button")
        assert "CEM request sent to betapartner" in page.inner_text("main")
        row = page.inner_text("#cem-requests tbody tr")
        assert "CN=alpha-2027" in row and "sent, awaiting the answer" in row
        assert "ada sent a CEM request to betapartner" in row
        shot(page, "cem1-request-sent")

        other = page_for(browser, beta.url, "bea")
        other.goto("/ui/parties/partner/alphapartner/as2")
        row = other.inner_text("#cem-requests tbody tr")
        assert "awaiting your approval" in row and "CN=alpha-2027" in row
        assert f"{respond_by} 23:59" in row
        shot(other, "cem2-request-awaiting-approval")
        other.click("#cem-requests form.cem-accept button")
        assert "CEM request accepted; the response to alphapartner: sent" in \
            other.inner_text("main")
        row = other.inner_text("#cem-requests tbody tr")
        assert "bea accepted the CEM request" in row and "CEM response to alphapartner " \
            "taken" in row
        assert "CN=alpha-2027" in other.inner_text("#certificates")  # taken, with its start
        shot(other, "cem3-accepted-by-the-partner")

        page.reload()
        row = page.inner_text("#cem-requests tbody tr")
        assert "accepted" in row and "CEM response from betapartner: accepted" in row
        page.goto("/ui/parties/organization/alphaco/as2")
        certs = page.inner_text("#certificates")
        assert "CN=alpha-2027" in certs and "not yet valid" in certs  # it starts in 2 days
        shot(page, "cem4-our-new-certificate-from-its-date")
    finally:
        close(beta, server)
