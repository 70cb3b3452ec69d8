"""CLI commands pointed at no b2bhub database say so in one line, with where they looked
and what to run, and leave nothing behind."""

from __future__ import annotations

import os
import sqlite3
import subprocess

from tests.procs import BIN, ROOT


def run_cli(env_extra: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("B2BHUB_")
           and k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(env_extra)
    return subprocess.run([str(BIN / "b2bhub"), *args], cwd=ROOT, env=env, input="pw\n",
                          capture_output=True, text=True, timeout=60)


def test_a_command_with_no_database_says_where_it_looked_in_one_line(tmp_path):
    data_dir = tmp_path / "elsewhere"
    for args in (["token", "create", "cli"], ["user", "create", "bob"],
                 ["fixtures", "load", str(ROOT / "README.md")], ["sweep"]):
        done = run_cli({"B2BHUB_DATA_DIR": str(data_dir)}, *args)
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr  # no traceback
        assert lines[0].startswith(f"Error: no b2bhub database at sqlite:///{data_dir}")
        assert f"data directory {data_dir}" in lines[0]
        assert "b2bhub db upgrade" in lines[0]
        assert not data_dir.exists()  # no empty data directory made on the way


def test_a_database_without_the_tables_is_named_as_such(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    sqlite3.connect(data_dir / "b2bhub.sqlite").close()  # a file, but no b2bhub tables
    done = run_cli({"B2BHUB_DATA_DIR": str(data_dir)}, "token", "create", "cli")
    assert done.returncode == 1
    assert "has no b2bhub tables: run `b2bhub db upgrade`" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    migrated = run_cli({"B2BHUB_DATA_DIR": str(data_dir)}, "db", "upgrade")
    assert migrated.returncode == 0, migrated.stderr
    made = run_cli({"B2BHUB_DATA_DIR": str(data_dir)}, "token", "create", "cli")
    assert made.returncode == 0, made.stderr
    assert len(made.stdout.strip()) > 20  # the token, printed once
