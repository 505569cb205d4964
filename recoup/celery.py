import json
import logging
import os
import time

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoup.settings")

app = Celery("recoup")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

logger = logging.getLogger("recoup.task")


@worker_init.connect
def _refuse_without_sandboxes(**kwargs: object) -> None:
    """A worker runs the lifecycle on this host's sandboxes: it does not start without them."""
    from sandboxes_app.checks import require_sandbox_provider

    require_sandbox_provider()


_started: dict[str, float] = {}


@task_prerun.connect
def _task_started(task_id: str, task: object, args: tuple, **kwargs: object) -> None:
    _started[task_id] = time.monotonic()


@task_postrun.connect
def _task_finished(
    task_id: str, task: object, args: tuple, kwargs: dict, state: str, **extra: object
) -> None:
    """One structured line per task, with the session id when the task is about one.

    A `quiet` task (the sweep, every few seconds) logs its own line when it did something;
    only its failures are logged here.
    """
    started = _started.pop(task_id, None)
    if getattr(task, "quiet", False) and state == "SUCCESS":
        return
    first = args[0] if args else None
    logger.info(
        json.dumps(
            {
                "event": "task",
                "task": getattr(task, "name", str(task)),
                "task_id": task_id,
                "state": state,
                "ms": round((time.monotonic() - started) * 1000, 1) if started else None,
                "session_id": first if isinstance(first, str) else kwargs.get("session_id"),
            }
        )
    )
