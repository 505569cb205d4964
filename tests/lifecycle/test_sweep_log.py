"""Beat runs the sweep every LIFECYCLE_SWEEP_INTERVAL (5 s): it logs when it did something and
is silent when it did not, in the process that runs it and in the worker's log alike."""

import json
import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from lifecycle import tasks
from sessions_app.models import Session
from tests.support.api import make_overdue, new_session, start_sandbox, wait_state
from tests.support.worker import wait_for


def sweep_lines(records: list[logging.LogRecord]) -> list[dict]:
    return [
        json.loads(record.getMessage())
        for record in records
        if record.getMessage().startswith('{"event": "sweep"')
    ]


@pytest.mark.django_db
def test_an_idle_sweep_logs_nothing(owner, caplog):
    later = timezone.now() + timedelta(minutes=5)
    session_id = new_session(owner)
    Session.objects.filter(id=session_id).update(
        lifecycle_state="active", hibernate_after=later, sandbox_expires_at=later
    )
    caplog.clear()

    with caplog.at_level(logging.INFO):  # LOG_LEVEL's default
        tasks.sweep()

    assert caplog.records == []


@pytest.mark.django_db(transaction=True)
def test_a_sweep_that_hibernates_a_sandbox_logs_it(owner, repo_url, worker, caplog):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    make_overdue(session_id, "hibernate_after")
    caplog.clear()

    with caplog.at_level(logging.INFO):
        tasks.sweep()

    assert sweep_lines(caplog.records) == [
        {
            "event": "sweep",
            "dispatched": {"idle": [session_id]},
            "oneshots_expired": 0,
            "builds_reaped": 0,
        }
    ]
    wait_state(session_id, "hibernated", worker)


@pytest.mark.django_db(transaction=True)
def test_the_worker_logs_one_line_per_task_and_nothing_for_an_idle_sweep(owner, repo_url, worker):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    tasks.sweep.delay()  # nothing is due: this one must leave no trace
    make_overdue(session_id, "hibernate_after")
    tasks.sweep.delay()  # the worker runs them in order: this one hands over the session

    wait_state(session_id, "hibernated", worker)
    wait_for(
        lambda: '"task": "lifecycle.hibernate_session"' in worker.log(),
        timeout=30,
        message=worker.log()[-4000:],
    )
    log = worker.log()
    assert log.count('{"event": "sweep"') == 1, log[-4000:]
    assert f'"dispatched": {{"idle": ["{session_id}"]}}' in log
    assert '"task": "lifecycle.sweep"' not in log
    # Celery's own "received" and "succeeded" lines would repeat each task's line.
    assert log.count('"task": "lifecycle.hibernate_session"') == 1
    assert " received" not in log and " succeeded in " not in log, log[-4000:]
