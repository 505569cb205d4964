"""The production web entry: `python manage.py web --bind HOST:PORT`.

gunicorn with threaded workers (gthread): WEB_WORKERS processes of WEB_THREADS threads each
(default 2 x 128). Requests that wait on a sandbox (a command running up to its timeout, a
provisioning) hold one thread each, blocked in the kernel, and no database connection (each
process shares a pool of DB_POOL_SIZE connections among its threads and a waiting command gives
its connection back). So hundreds of requests can wait while the status poll and everything else
keep free threads. We chose this over ASGI with async views: the provider's waits are
subprocess pipes read with selectors, a thread per wait costs about 100 KB here, and every
endpoint stays one plain DRF view; bench/bench_fairness.py and bench/bench_poll.py measure it.
"""

import os
import socket
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sandboxes_app.checks import sandbox_provider_problem


def parse_bind(bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"--bind must be HOST:PORT, got {bind!r}")
    return host.strip("[]"), int(port)


def port_problem(host: str, port: int) -> str | None:
    """Why gunicorn could not listen on host:port (in use, no such address), else None."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None


class Command(BaseCommand):
    help = (
        "Run the production web server (gunicorn, threaded workers) on --bind HOST:PORT. "
        "Refuses to start where sandboxes cannot run as configured, or where the port is taken."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--bind", default="127.0.0.1:8000", help="HOST:PORT to listen on (127.0.0.1:8000)"
        )
        parser.add_argument(
            "--workers",
            type=int,
            default=settings.WEB_WORKERS,
            help=f"processes (WEB_WORKERS, {settings.WEB_WORKERS})",
        )
        parser.add_argument(
            "--threads",
            type=int,
            default=settings.WEB_THREADS,
            help=f"threads per process, each serving one request (WEB_THREADS, "
            f"{settings.WEB_THREADS})",
        )

    def handle(self, *args: object, bind: str, workers: int, threads: int, **options) -> None:
        host, port = parse_bind(bind)
        problem = sandbox_provider_problem()
        if problem is not None:
            raise CommandError(f"recoup cannot run sandboxes here: {problem}")
        problem = port_problem(host, port)
        if problem is not None:
            raise CommandError(problem)
        argv = [
            sys.executable,
            "-m",
            "gunicorn",
            "recoup.wsgi:application",
            "--bind",
            bind,
            "--worker-class",
            "gthread",
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            # The arbiter's liveness timeout for a worker process, not a request deadline: a
            # gthread worker keeps notifying while its threads wait on commands.
            "--timeout",
            "120",
            "--graceful-timeout",
            "30",
            "--keep-alive",
            "5",
            # Open event and log streams end at once on a graceful stop (recoup.streams).
            "--config",
            "python:recoup.gunicorn_hooks",
            # No --access-logfile: recoup.request already logs each request, once, with its
            # account and session.
        ]
        sys.stdout.flush()
        os.execv(sys.executable, argv)
