"""A web process lets at most WEB_MAX_WAITING requests wait on sandboxes at once: past it a new
command answers 503 with Retry-After and runs nothing, so the process keeps threads for others."""

import threading
import time

import pytest
from rest_framework.test import APIClient

from tests.support.api import new_session, run, sh, start_sandbox

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_past_the_ceiling_a_command_answers_503_and_runs_nothing(
    owner, stranger, repo_url, settings
):
    settings.WEB_MAX_WAITING = 1
    busy = new_session(owner)
    start_sandbox(owner, busy, repo_url)
    other = new_session(stranger)
    start_sandbox(stranger, other, repo_url)
    done: dict = {}

    def wait_in_the_sandbox() -> None:
        client = APIClient()
        client.credentials(HTTP_X_API_KEY=owner.raw_key)
        done["response"] = client.post(
            "/api/sandbox/commands",
            {"sessionId": busy, "cmd": "sleep", "args": ["2"]},
            format="json",
        )

    waiter = threading.Thread(target=wait_in_the_sandbox)
    waiter.start()
    time.sleep(0.7)  # the first command is waiting now
    refused = run(stranger, other, "touch", "ran")
    waiter.join()

    assert refused.status_code == 503, refused.content
    assert refused["Retry-After"] == "2"
    assert refused.json()["status"] == "error"
    assert "retry shortly" in refused.json()["error"]
    assert done["response"].status_code == 200
    # Nothing ran, and once the first wait ended the next command gets in.
    assert sh(stranger, other, "ls ran 2>&1; true")["stdout"].startswith("ls: cannot access")
