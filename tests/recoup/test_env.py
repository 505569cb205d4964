"""The typed environment readers fail loudly, naming the variable, on a malformed value."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from recoup.env import (
    database_from_url,
    env_bool,
    env_choice,
    env_int,
    env_list,
    env_str,
    persistent_secret,
)

VAR = "RECOUP_TEST_SETTING"


@pytest.fixture(autouse=True)
def _unset(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)


def test_it_falls_back_to_defaults_when_unset():
    assert env_str(VAR, "d") == "d"
    assert env_bool(VAR, True) is True
    assert env_int(VAR, 7) == 7
    assert env_list(VAR, ["a"]) == ["a"]
    assert env_choice(VAR, "x", ("x", "y")) == "x"


@pytest.mark.parametrize(
    "raw, expected",
    [("1", True), ("true", True), (" YES ", True), ("on", True)]
    + [("0", False), ("False", False), ("no", False), ("off", False), ("", False)],
)
def test_it_reads_booleans(raw, expected, monkeypatch):
    monkeypatch.setenv(VAR, raw)
    assert env_bool(VAR, not expected) is expected


@pytest.mark.parametrize("raw", ["maybe", "2", "tru", "y e s"])
def test_it_refuses_a_malformed_boolean(raw, monkeypatch):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=VAR):
        env_bool(VAR, False)


def test_it_reads_integers(monkeypatch):
    monkeypatch.setenv(VAR, " 42 ")
    assert env_int(VAR, 1, minimum=1) == 42
    monkeypatch.setenv(VAR, "")
    assert env_int(VAR, 9) == 9


@pytest.mark.parametrize("raw", ["ten", "1.5", "0x10", "5s"])
def test_it_refuses_a_malformed_integer(raw, monkeypatch):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=VAR):
        env_int(VAR, 1)


def test_it_refuses_an_integer_below_its_minimum(monkeypatch):
    monkeypatch.setenv(VAR, "0")
    with pytest.raises(ImproperlyConfigured, match=VAR):
        env_int(VAR, 5, minimum=1)


def test_it_reads_lists_skipping_blanks(monkeypatch):
    monkeypatch.setenv(VAR, " a.example , ,b.example,")
    assert env_list(VAR, []) == ["a.example", "b.example"]


def test_it_reads_a_choice(monkeypatch):
    monkeypatch.setenv(VAR, " none ")
    assert env_choice(VAR, "bwrap", ("bwrap", "none")) == "none"


@pytest.mark.parametrize("raw", ["docker", "BWRAP", ""])
def test_it_refuses_a_value_outside_its_choices(raw, monkeypatch):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=VAR):
        env_choice(VAR, "bwrap", ("bwrap", "none"))


# --- DATABASE_URL ---------------------------------------------------------------------------


def test_it_parses_a_postgres_url_with_escaped_credentials():
    config = database_from_url("postgres://app%40svc:p%3Ass@db.internal:6543/recoup%2Dprod")

    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert config["NAME"] == "recoup-prod"
    assert config["USER"] == "app@svc"
    assert config["PASSWORD"] == "p:ss"
    assert config["HOST"] == "db.internal"
    assert config["PORT"] == "6543"


@pytest.mark.parametrize("scheme", ["postgres", "postgresql", "pgsql"])
def test_it_accepts_every_postgres_scheme_spelling(scheme):
    config = database_from_url(f"{scheme}://postgres@127.0.0.1/recoup")
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert (config["USER"], config["PASSWORD"], config["PORT"]) == ("postgres", "", "")


@pytest.mark.parametrize(
    "url, name",
    [
        ("sqlite:////var/lib/recoup/db.sqlite3", "/var/lib/recoup/db.sqlite3"),
        ("sqlite:///var/db.sqlite3", "var/db.sqlite3"),
    ],
)
def test_it_parses_sqlite_urls(url, name):
    config = database_from_url(url)
    assert config["ENGINE"] == "django.db.backends.sqlite3"
    assert config["NAME"] == name


@pytest.mark.parametrize(
    "url",
    [
        "mysql://root@localhost/recoup",
        "postgres://u@localhost:notaport/recoup",
        "postgres://u@localhost:5432/",
        "sqlite://host/db.sqlite3",
        "sqlite://",
        "just-a-path.sqlite3",
    ],
)
def test_it_refuses_a_malformed_database_url(url):
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        database_from_url(url)


# --- The generated secret -------------------------------------------------------------------


def test_it_keeps_one_generated_secret_across_calls(tmp_path):
    path = tmp_path / "nested" / "secret_key"

    first = persistent_secret(path)

    assert len(first) >= 50
    assert persistent_secret(path) == first
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert persistent_secret(tmp_path / "other") != first


def test_concurrent_first_starts_agree_on_one_secret(tmp_path):
    """Separate processes (gunicorn workers, celery) racing to create the file share one value."""
    path = tmp_path / "secret_key"
    code = (
        "import sys; from pathlib import Path; from recoup.env import persistent_secret; "
        "print(persistent_secret(Path(sys.argv[1])))"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(path)],
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[2],
            text=True,
        )
        for _ in range(6)
    ]
    results = [process.communicate(timeout=60)[0].strip() for process in processes]

    assert all(process.returncode == 0 for process in processes)
    assert len(set(results)) == 1
    assert results[0] == path.read_text().strip()
    assert [p.name for p in tmp_path.iterdir()] == ["secret_key"]
