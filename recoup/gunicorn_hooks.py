"""gunicorn server hooks for `manage.py web` (passed with --config python:recoup.gunicorn_hooks)."""

import signal


def post_worker_init(worker: object) -> None:
    """On the worker's graceful-stop signal, tell open streams to end first: each holds a
    thread that gunicorn would otherwise wait on for its whole graceful timeout."""
    from recoup.streams import shutting_down  # the app is loaded by now; not at config time

    graceful = signal.getsignal(signal.SIGTERM)

    def stop(signum: int, frame: object) -> None:
        shutting_down.set()
        if callable(graceful):
            graceful(signum, frame)

    signal.signal(signal.SIGTERM, stop)
