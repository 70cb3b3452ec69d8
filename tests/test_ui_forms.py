"""Plugin forms as people read them: every field error at once, each beside its field and
said once; fields called by their labels; the plugin list's values in words."""

from __future__ import annotations

import html
import re

import pytest
from sqlalchemy import select

from b2bhub.models import PluginInstance
from plugins.file_poller import FilePoller
from plugins.file_writer import FileWriter
from tests import test_ui

login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request
setup = test_ui.setup


@pytest.fixture(autouse=True)
def file_types(registry):
    registry.register(FilePoller)
    registry.register(FileWriter)


def field_block(page: str, field_id: str) -> str:
    """The .field block of the input ``field_id``: its label, errors and help."""
    found = re.search(rf'<div class="field [^"]*">(?:(?!<div class="field ).)*?id="{field_id}"'
                      r'.*?</div>', page, re.S)
    assert found, field_id
    return html.unescape(found.group(0))


def errors_of(block: str) -> list[str]:
    return re.findall(r'<span class="error">(.*?)</span>', block, re.S)


def test_every_bad_field_shows_its_error_at_once_and_once(setup, login, session):
    client = login("admin")
    bad = client.post("/ui/plugins/new/file_writer", data={
        "name": "BadName", "enabled": "y", "config-base_directory": "relative/dir",
        "config-filename_pattern": "{to}/{original_filename}",
        "max_concurrent_deliveries": "lots", "retry_policy": "{oops",
        "business_rules": '[{"name": "r", "body_regex": "ERR-(\\\\d+"}]'})
    assert bad.status_code == 400
    page = bad.text
    expected = {
        "name": "must be 1-64 characters of a-z, 0-9, '_' and '-'",
        "config-base_directory": "must be an absolute path",
        "max_concurrent_deliveries": "must be a whole number",
        "retry_policy": "invalid JSON",
        "business_rules": "body_regex is not a valid regular expression",
    }
    for field_id, text in expected.items():
        [error] = errors_of(field_block(page, field_id))  # one error, beside its field
        assert text in error, (field_id, error)
    name = field_block(page, "name")
    assert "BadName" not in errors_of(name)[0]  # the rule, not the name said again
    assert name.count("1-64 characters") == 1  # and not the help repeating it
    assert html.unescape(page).count("must be an absolute path") == 1
    assert not re.search(r'<p class="flash error" role="alert">', page)  # nothing above
    assert 'value="BadName"' in page and 'value="relative/dir"' in page
    assert session.scalar(select(PluginInstance).where(
        PluginInstance.type == "file_writer")) is None


def test_the_services_refusal_alone_is_said_beside_its_field(setup, login):
    client = login("admin")
    bad = client.post("/ui/plugins/new/file_writer", data={
        "name": "BadName", "config-base_directory": "/tmp/out",
        "max_concurrent_deliveries": "4"})
    assert bad.status_code == 400
    [error] = errors_of(field_block(bad.text, "name"))
    assert error == "must be 1-64 characters of a-z, 0-9, '_' and '-'"
    taken = client.post("/ui/plugins/new/file_writer", data={
        "name": "writer_a", "config-base_directory": "/tmp/out",
        "max_concurrent_deliveries": "4"})
    assert errors_of(field_block(taken.text, "name")) == [
        "an instance named 'writer_a' exists already"]


def test_fields_are_called_by_their_labels_and_the_title_reads_well(setup, login):
    client = login("admin")
    page = html.unescape(client.get("/ui/plugins/new/file_poller").text)
    assert "<title>New file_poller instance · b2bhub</title>" in page
    assert "<h1>New file_poller instance</h1>" in page
    assert "New file_poller file_poller" not in page
    for field_id, label in (("config-base_directory", "Base directory (required)"),
                            ("config-polling_interval", "Polling interval (seconds)"),
                            ("config-take_by_link", "Take files by hard link"),
                            ("config-archive_directory", "Archive directory")):
        assert label in field_block(page, field_id), field_id
    assert ">base_directory<" not in page and ">take_by_link" not in page
    assert "(required)" not in re.search(
        r'<small class="help">the directory scanned.*?</small>', page, re.S).group(0)


def test_the_plugin_list_says_values_in_words(setup, login, session):
    client = login("admin")
    saved = client.post("/ui/plugins/new/file_poller", data={
        "name": "poller", "enabled": "y", "config-base_directory": "/tmp/in",
        "config-polling_interval": "5", "config-path_pattern": "{filename}",
        "config-file_pattern": "*", "config-to": "acme", "config-take_by_link": "y"})
    assert saved.status_code == 302, re.findall(r'class="error">(.*?)<', saved.text)
    row = re.search(r'<tr data-instance="poller">.*?</tr>',
                    client.get("/ui/plugins").text, re.S).group(0)
    config = html.unescape(re.search(r'<td class="config">(.*?)</td>', row, re.S).group(1))
    text = re.sub(r"<[^>]+>", "", config)
    assert "Base directory: /tmp/in" in text and "Polling interval (seconds): 5" in text
    assert "Take files by hard link: yes" in text
    assert "take_by_link" not in row and "False" not in row and "True" not in row
    assert "=" not in text


def test_a_collecting_source_takes_a_retry_policy_for_its_failed_fetches(
        setup, login, session, registry):
    """A source that records collection errors (http_collector) has the field; a file
    poller, which does not, has none; the saved policy is the instance's."""
    from plugins.http_collector import HttpCollector
    registry.register(HttpCollector)
    client = login("admin")
    assert 'name="retry_policy"' not in client.get("/ui/plugins/new/file_poller").text
    page = client.get("/ui/plugins/new/http_collector").text
    assert "before a Collection error is recorded" in field_block(page, "retry_policy")
    form = {"name": "erp", "enabled": "y", "config-url": "http://127.0.0.1:9/orders",
            "config-polling_interval": "60", "config-from": "acme", "config-to": "acme",
            "config-timeout": "30"}
    bad = client.post("/ui/plugins/new/http_collector",
                      data={**form, "retry_policy": '{"max_attempts": 0}'})
    assert errors_of(field_block(bad.text, "retry_policy")), bad.text[:300]
    saved = client.post("/ui/plugins/new/http_collector",
                        data={**form, "retry_policy": '{"max_attempts": 3}'})
    assert saved.status_code == 302, re.findall(r'class="error">(.*?)<', saved.text)
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "erp"))
    assert row.retry_policy == {"max_attempts": 3}
