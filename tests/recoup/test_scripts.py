"""The README's scripts, run for real in a fresh copy of the repository with its own .venv:
`scripts/run` installs the runtime dependencies only and reports a taken port as one clear
error; `scripts/manage` runs manage.py from anywhere without installing anything;
`scripts/bootstrap --test` (what scripts/test and CI run) adds the test tools."""

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.up import ROOT, embedded_env

pytestmark = pytest.mark.slow

RUNTIME = {"django", "djangorestframework", "gunicorn", "celery", "psycopg", "pyseccomp"}
TEST_TOOLS = {"pytest", "pytest-django", "pytest-xdist", "ruff", "schemathesis"}


def fresh_copy(dest: Path) -> Path:
    """The repository's files (tracked, and new ones not ignored), without its .venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def installed(tree: Path) -> set[str]:
    listed = subprocess.run(
        [tree / ".venv/bin/python", "-m", "pip", "list", "--format=json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {package["name"].lower() for package in json.loads(listed)}


def run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, **kwargs)


def test_run_installs_the_runtime_only_and_the_test_bootstrap_adds_the_test_tools(tmp_path):
    tree = fresh_copy(tmp_path / "recoup")
    env = embedded_env(tmp_path / "data")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        first = run([tree / "scripts/run", "--port", str(port)], env=env)
        again = run([tree / "scripts/run", "--port", str(port)], env=env)

    error = f"CommandError: cannot listen on 127.0.0.1:{port}: Address already in use"
    # The first run installs (pip may warn about this machine's own index settings).
    assert first.returncode == 1 and first.stderr.strip().splitlines()[-1] == error
    assert "Traceback" not in first.stderr
    assert again.returncode == 1
    assert (again.stdout, again.stderr.strip()) == ("", error)  # once installed: one line
    packages = installed(tree)
    assert RUNTIME <= packages and not TEST_TOOLS & packages, sorted(packages)

    # From another directory, with nothing to install: the README's management commands.
    assert run([tree / "scripts/manage", "migrate", "-v0"], env=env, cwd=tmp_path).returncode == 0
    created = run(
        [tree / "scripts/manage", "create_api_key", "--email", "a@example.com", "--org", "acme"],
        env=env,
        cwd=tmp_path,
    )
    assert created.returncode == 0, created.stderr
    assert "in organization acme (organizationId " in created.stdout
    assert created.stdout.splitlines()[-1].startswith("recoup_sk_")
    assert installed(tree) == packages

    with_tests = run([tree / "scripts/bootstrap", "--test"], env=env)
    assert with_tests.returncode == 0, with_tests.stderr
    assert TEST_TOOLS <= installed(tree)


def test_manage_without_a_venv_says_what_to_run_first(tmp_path):
    tree = tmp_path / "recoup"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts/manage", tree / "scripts/manage")

    result = run([tree / "scripts/manage", "check"], cwd=tmp_path)

    assert result.returncode == 1
    assert result.stderr == (
        "no .venv here yet: run ./scripts/run (or scripts/bootstrap) once first\n"
    )
