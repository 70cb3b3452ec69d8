"""The messages list and the pages' chrome as an operator reads them: a Status filter
that is one select, a bad filter that lists nothing, a strong Error badge, a labelled
live dot, chart labels of a readable size, Edit links shaped like their buttons."""

from __future__ import annotations

import re

from tests import test_ui

login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request
setup = test_ui.setup


def test_the_status_filter_is_one_select_with_any(setup, login):
    page = login("viewer").get("/ui/messages?status=awaiting_receipt").text
    select = re.search(r'<select name="status">(.*?)</select>', page, re.S)
    assert select, "the Status filter is a plain select (no multiple, no size)"
    assert select.group(1).lstrip().startswith('<option value="">any</option>')
    assert '<option value="awaiting_receipt" selected>Awaiting receipt</option>' in \
        select.group(1)


def test_a_bad_filter_says_so_and_lists_nothing(setup, login):
    message = setup.message()
    client = login("viewer")
    assert f'data-id="{message.id}"' in client.get("/ui/messages").text
    for query in ("status=lost", "since=yesterday", "until=soon&status=error"):
        page = client.get(f"/ui/messages?{query}").text
        assert f'data-id="{message.id}"' not in page, query
        assert 'id="bad-filter"' in page and "No messages listed" in page, query
        assert 'data-live-insert="no"' in page, query  # nor do live rows come in
    page = client.get("/ui/messages?status=lost").text
    assert '<span class="error">unknown status lost</span>' in page


def test_the_error_badge_is_strong_and_the_live_dot_is_labelled(app, setup, login):
    css = app.test_client().get("/ui/static/ui.css").text
    error = re.search(r"\n\.s-error \{([^}]*)\}", css).group(1)
    assert "background:var(--bad)" in error and "color:#fff" in error
    page = login("viewer").get("/ui/messages").text
    dot = re.search(r'<span id="live-state".*?</span></span>', page, re.S).group(0)
    assert ">not live<" in dot and ">live<" in dot and 'role="status"' in dot


def test_chart_labels_are_of_a_readable_size(setup, login):
    page = login("viewer").get("/ui/").text
    sizes = [int(s) for s in re.findall(r'<text [^>]*font-size="(\d+)"', page)]
    assert sizes and min(sizes) >= 13


def test_edit_links_are_shaped_like_the_buttons_beside_them(setup, login):
    client = login("admin")
    for page, edit in (("/ui/plugins", "/ui/plugins/writer_a/edit"),
                       ("/ui/routes", "/ui/routes/1/edit"),
                       ("/ui/parties", "/ui/parties/partner/acme")):
        assert f'<a class="button" href="{edit}">Edit</a>' in client.get(page).text, page
