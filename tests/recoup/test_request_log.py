import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from tests.recoup.test_embedded_default import ROOT, free_port
from tests.support.worker import wait_for


@pytest.mark.django_db
def test_each_request_logs_one_json_line_with_its_session_id(owner, caplog):
    created = owner.client.post("/api/sessions", {"title": "t"}, format="json")
    session_id = created.json()["session"]["id"]
    caplog.clear()

    with caplog.at_level(logging.INFO, logger="recoup.request"):
        owner.client.get(f"/api/sessions/{session_id}")
        owner.client.get("/api/sandbox/status", {"sessionId": session_id})

    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "recoup.request"]
    assert [(line["path"], line["status"], line["session_id"]) for line in lines] == [
        (f"/api/sessions/{session_id}", 200, session_id),
        ("/api/sandbox/status", 200, session_id),
    ]
    assert all(line["account_id"] == str(owner.account.id) for line in lines)


def count_growth(log: Path, needle: str, request: Callable[[], object]) -> int:
    """How many more lines mention `needle` once `request` is answered and logged."""
    before = log.read_text(errors="replace").count(needle)
    request()
    # Our line is written before the response leaves; a second logger may write just after.
    wait_for(
        lambda: log.read_text(errors="replace").count(needle) > before,
        timeout=10,
        message=log.read_text(errors="replace")[-2000:],
    )
    time.sleep(1)
    return log.read_text(errors="replace").count(needle) - before


@pytest.mark.slow
@pytest.mark.parametrize("server", ["web", "runserver"])
def test_each_request_is_logged_once_by_the_servers_the_project_runs(tmp_path, server):
    """`manage.py web` (gunicorn, what `up` and compose run) and Django's runserver: our
    structured line, and no access log line of the server's besides it."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = {
        "web": ["web", "--bind", f"127.0.0.1:{port}"],
        "runserver": ["runserver", "--noreload", f"127.0.0.1:{port}"],
    }[server]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "SECRET_KEY")
    }
    env["RECOUP_DATA_DIR"] = str(tmp_path / "data")
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "manage.py", *argv], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    try:
        wait_for(lambda: _answers(f"{base}/healthz"), timeout=60, message=log.read_text())

        found = count_growth(
            log, "/api/no-such-page", lambda: requests.get(f"{base}/api/no-such-page")
        )
        ok = count_growth(log, "/healthz", lambda: requests.get(f"{base}/healthz"))

        assert (found, ok) == (1, 1), log.read_text()[-3000:]
        ours = [line for line in log.read_text().splitlines() if "/api/no-such-page" in line]
        assert '"event": "request"' in ours[0] and '"status": 404' in ours[0]
    finally:
        process.terminate()
        process.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.ConnectionError:
        return False
