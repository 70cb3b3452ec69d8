"""The container image's entry point and the compose file (Dockerfile,
docker-compose.yml, packaging/docker/entrypoint.sh): the entry point runs the Procfile's
lines by name, and the compose file runs every process of the Procfile from one image
against one PostgreSQL, one Redis and one S3 store. (Building the image needs a Docker
daemon, which the test suite does not assume.)"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess

import yaml

from tests.procs import BIN, ROOT

ENTRYPOINT = ROOT / "packaging" / "docker" / "entrypoint.sh"


def _procfile() -> dict[str, str]:
    return dict(re.findall(r"^(\w+): (.+)$", (ROOT / "Procfile").read_text(), re.M))


def _run(args: list[str], tmp_path, **env) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith(("B2BHUB_", "DATABASE_URL", "REDIS_URL"))}
    environ.update({"PATH": f"{BIN}{os.pathsep}{environ.get('PATH', '')}",
                    "B2BHUB_DATA_DIR": str(tmp_path), **env})
    return subprocess.run([str(ENTRYPOINT), *args], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=120)


def test_release_runs_the_procfiles_migrations_on_an_empty_database(tmp_path):
    database = tmp_path / "fresh.sqlite"
    done = _run(["release"], tmp_path, DATABASE_URL=f"sqlite:///{database}")
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(database) as conn:
        tables = {row[0] for row in conn.execute("select name from sqlite_master")}
        versions = conn.execute("select count(*) from alembic_version").fetchone()[0]
    assert {"messages", "deliveries", "payloads"} <= tables
    assert versions >= 1


def test_other_arguments_run_as_a_command(tmp_path):
    done = _run(["b2bhub", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "db" in done.stdout and "fixtures" in done.stdout
    missing = _run(["no-such-process-or-command"], tmp_path)
    assert missing.returncode != 0


def test_the_dockerfile_runs_the_entry_point_as_another_user_than_root():
    text = (ROOT / "Dockerfile").read_text()
    assert "make install EXTRAS=" in text
    assert re.search(r"^USER (?!root\b)\w+", text, re.M)
    assert 'ENTRYPOINT ["/app/packaging/docker/entrypoint.sh"]' in text
    assert re.search(r'^CMD \["web"\]', text, re.M)


def test_compose_runs_each_procfile_process_from_one_image_on_shared_services():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    hub = {name: spec for name, spec in services.items() if spec.get("image") == "b2bhub"}
    assert {spec["command"][0] for spec in hub.values()} == set(_procfile())
    envs = [spec["environment"] for spec in hub.values()]
    for key in ("DATABASE_URL", "REDIS_URL", "B2BHUB_PAYLOAD_URL", "B2BHUB_SECRET_KEY"):
        assert len({env[key] for env in envs}) == 1, key
    assert envs[0]["B2BHUB_PAYLOAD_URL"].startswith("s3://")
    store = envs[0]["B2BHUB_S3_ENDPOINT_URL"].split("//")[1].split(":")[0]
    assert store in services
    release = next(name for name, spec in hub.items() if spec["command"] == ["release"])
    for name, spec in hub.items():
        if name != release:
            assert spec["depends_on"][release] == {
                "condition": "service_completed_successfully"}, name
    db_host = re.search(r"@([\w-]+):", envs[0]["DATABASE_URL"]).group(1)
    redis_host = re.search(r"//([\w-]+):", envs[0]["REDIS_URL"]).group(1)
    assert {db_host, redis_host} <= set(services)
