"""Stopping `manage.py up`: sandboxes keep running for the next start, which adopts them, or,
with --hibernate-on-exit, are all hibernated first and resume on the next start."""

import sqlite3
from pathlib import Path

import pytest

from tests.support.up import Up

pytestmark = pytest.mark.slow


def lifecycle_state(data: Path, session_id: str) -> str:
    with sqlite3.connect(data / "recoup.sqlite3") as db:
        row = db.execute(
            "SELECT lifecycle_state FROM sessions_app_session WHERE id = ?", (session_id,)
        ).fetchone()
    return row[0]


def test_stopping_keeps_sandboxes_for_the_next_start_or_hibernates_them_all(
    tmp_path, origins, repo_url
):
    data = tmp_path / "data"
    first = Up(data, SANDBOX_GIT_BASE_URL=origins.base_url)
    try:
        session_id = first.post("/api/sessions", {"title": "kept"}).json()["session"]["id"]
        body = {"repoUrl": repo_url, "sessionId": session_id}
        assert first.post("/api/sandbox", body).status_code == 200
        first.sh(session_id, "echo draft > notes.txt")
    finally:
        first.stop()
    sandbox_dirs = [p for p in (data / "sandboxes").iterdir() if not p.name.startswith("_")]
    assert len(sandbox_dirs) == 1 and (sandbox_dirs[0] / "init.json").exists()
    assert lifecycle_state(data, session_id) == "active"

    # The next start adopts the running sandbox: same workspace, nothing resumed.
    second = Up(data, "--hibernate-on-exit", SANDBOX_GIT_BASE_URL=origins.base_url)
    try:
        again = second.post("/api/sandbox", body)
        assert again.status_code == 200, again.text
        assert second.sh(session_id, "cat notes.txt")["stdout"] == "draft\n"
    finally:
        said = second.stop()
    assert "hibernated 1 sandbox(es)" in said
    assert lifecycle_state(data, session_id) == "hibernated"
    assert not sandbox_dirs[0].exists()

    # Resumed from its snapshot; hibernated again on exit, so nothing outlives the test.
    third = Up(data, "--hibernate-on-exit", SANDBOX_GIT_BASE_URL=origins.base_url)
    try:
        resumed = third.post("/api/sandbox", body)
        assert resumed.status_code == 200, resumed.text
        assert third.sh(session_id, "cat notes.txt")["stdout"] == "draft\n"
    finally:
        third.stop()
    assert lifecycle_state(data, session_id) == "hibernated"
