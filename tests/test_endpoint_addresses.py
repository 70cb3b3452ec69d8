"""Which addresses are a protocol's endpoint (``/<prefix>/<instance>``, SPEC 3): only
those of a registered prefix. Any other address of two segments is answered as the rest
of the hub answers an unknown address: the UI's 404 page under /ui/, the API's JSON 404
elsewhere, and never reaches the endpoint's code.

A visitor who is not logged in and asks for an unknown /ui/ address is sent to the login
page, as from any page of the UI (no page is shown before a login, and what addresses
exist is not told either); after the login they land on the 404 page, whose navigation
takes them on."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from b2bhub.models import Message
from b2bhub.plugin import endpoints
from plugins.http_receiver import HttpReceiver, create_token
from tests import test_ui

login = test_ui.login
PASSWORD = test_ui.PASSWORD
BODY = b"<order id='7'/>\n"
#: what a two-segment address that is no endpoint's is asked with, all of them
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND")


@pytest.fixture
def token(registry, hub, session):
    """An http_receiver ``inbox`` at ``/in/inbox``; its bearer token."""
    registry.register(HttpReceiver)
    hub.parties()
    hub.instance("inbox", "http_receiver", config={"from_party": "acme",
                                                    "to_party": "mycompany"})
    made = create_token(session, "inbox", "client", "tests")
    session.commit()
    return made


@pytest.fixture
def reached(monkeypatch) -> list:
    """The requests that reached the endpoints' code (its ``answer``), by path."""
    seen: list[str] = []
    real = endpoints.answer

    def answer(cls, instance, request):
        seen.append(request.path)
        return real(cls, instance, request)
    monkeypatch.setattr(endpoints, "answer", answer)
    return seen


def is_api_error(response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code


def test_an_unknown_ui_address_is_the_uis_404_page_with_its_navigation(login, token,
                                                                       reached):
    viewer = login("viewer")
    for path in ("/ui/nosuch", "/ui/nosuch/deeper", "/ui/in"):
        page = viewer.get(path)
        assert page.status_code == 404, (path, page.text)
        assert page.mimetype == "text/html"
        assert "<h1>404 Not Found</h1>" in page.text
        assert '<header class="top">' in page.text  # the navigation, the user's name
        assert 'href="/ui/messages"' in page.text and 'href="/ui/routes"' in page.text
        assert "viewer1" in page.text
    assert reached == []


def test_an_unknown_ui_address_asks_a_visitor_to_log_in_first(client, login, token,
                                                               reached):
    answer = client.get("/ui/nosuch")
    assert answer.status_code == 302
    assert answer.headers["Location"] == "/ui/login?next=/ui/nosuch"
    # the same for another method: no page, no 405, before the login
    assert client.post("/ui/nosuch").status_code == 302
    login("viewer")  # a user to log in as
    logged_in = client.post("/ui/login", data={"name": "viewer1", "password": PASSWORD,
                                               "next": "/ui/nosuch"})
    assert logged_in.status_code == 302 and logged_in.headers["Location"] == "/ui/nosuch"
    page = client.get("/ui/nosuch")
    assert page.status_code == 404 and '<header class="top">' in page.text
    assert reached == []


def test_any_other_unknown_address_is_the_apis_json_404(client, api, token, reached):
    for method in METHODS:
        for path in ("/foo/bar", "/inn/inbox", "/api/inbox", "/foo"):
            answer = client.open(path, method=method)
            assert answer.status_code == 404, (method, path, answer.text)
            if method != "HEAD":
                is_api_error(answer, 404, "not_found")
    # the same shape as the API's own
    is_api_error(api.get("/api/v1/no-such-thing"), 404, "not_found")
    assert reached == []


def test_a_registered_prefix_is_still_an_endpoint(app, client, token, session, reached):
    headers = {"Authorization": f"Bearer {token}"}
    answer = client.post("/in/inbox", data=BODY, headers=headers)
    assert answer.status_code == 202, answer.text
    # the same through Flask's rule, as when tracing is on (no EndpointsFirst then)
    app.wsgi_app = app.wsgi_app.inner
    answer = client.post("/in/inbox", data=BODY, headers=headers)
    assert answer.status_code == 202, answer.text
    assert len(session.scalars(select(Message.id)).all()) == 2
    # an unknown instance of a known prefix: the endpoint's own answer
    missing = client.post("/in/nowhere", data=BODY, headers=headers)
    assert missing.status_code == 404
    assert "no enabled HTTP receiver named 'nowhere'" in missing.text
    assert reached == ["/in/inbox", "/in/inbox", "/in/nowhere"]
    # another method at an endpoint is refused as before, naming the one it takes
    for method in ("GET", "PUT", "DELETE"):
        refused = client.open("/in/inbox", method=method)
        assert refused.status_code == 405, (method, refused.text)
        assert refused.headers["Allow"] == "OPTIONS, POST"
        is_api_error(refused, 405, "method_not_allowed")
    assert client.options("/in/inbox").headers["Allow"] == "OPTIONS, POST"
    # a trailing slash is no endpoint's address
    is_api_error(client.post("/in/inbox/", data=BODY, headers=headers), 404, "not_found")
    assert reached == ["/in/inbox", "/in/inbox", "/in/nowhere"]
