"""Run the whole service on one machine: migrations, a demo key, web, worker and beat.

This is the README's run command. It supervises three child processes and stops them all
when one exits or when it receives SIGINT/SIGTERM. Stopping keeps every sandbox running (the
next start adopts them, and their sessions carry on) unless --hibernate-on-exit asks to
hibernate them all first; either way no sandbox is left frozen by a snapshot cut short.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from lifecycle.hibernation import sessions_hibernate_all
from recoup.accounts.services import account_get_or_create, api_key_issue, organization_join
from recoup.management.commands.web import port_problem
from sandboxes_app.checks import sandbox_provider_problem
from sandboxes_app.providers.base import get_provider

MANAGE_PY = Path(__file__).resolve().parents[3] / "manage.py"


class Command(BaseCommand):
    help = "Migrate, print a demo API key, and run web (gunicorn), worker and beat together."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000, help="port to listen on (8000)")
        parser.add_argument(
            "--email", default="demo@recoup.local", help="the demo account the printed key is for"
        )
        parser.add_argument("--org", default="demo", help="the demo account's organization slug")
        parser.add_argument(
            "--hibernate-on-exit",
            action="store_true",
            help="on stop, hibernate every running sandbox (snapshot, verify, stop) before "
            "exiting; without it sandboxes keep running and the next start adopts them",
        )

    def handle(
        self,
        *args: object,
        host: str,
        port: int,
        email: str,
        org: str,
        hibernate_on_exit: bool = False,
        **options: object,
    ) -> None:
        problem = sandbox_provider_problem()
        if problem is not None:
            raise CommandError(f"recoup cannot run sandboxes here: {problem}")
        problem = port_problem(host, port)
        if problem is not None:
            raise CommandError(problem)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        account = account_get_or_create(email=email)
        organization_join(account=account, slug=org)
        raw_key = api_key_issue(account=account, label="demo (manage.py up)").raw_key

        python = sys.executable
        children = [
            subprocess.Popen([python, str(MANAGE_PY), "web", "--bind", f"{host}:{port}"]),
            subprocess.Popen(
                [
                    python,
                    "-m",
                    "celery",
                    "-A",
                    "recoup",
                    "worker",
                    "--loglevel",
                    "INFO",
                    "--concurrency",
                    "2",
                    "-n",
                    "worker@%h",
                ]
            ),
            subprocess.Popen(
                [
                    python,
                    "-m",
                    "celery",
                    "-A",
                    "recoup",
                    "beat",
                    "--loglevel",
                    "INFO",
                    "-s",
                    settings.CELERY_BEAT_SCHEDULE_FILENAME,
                ]
            ),
        ]
        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(
            f"recoup is up on http://{host}:{port}/ (the console; docs at /api/docs/, "
            "admin at /admin/)\n"
            f"data dir: {settings.DATA_DIR}  database: {settings.DATABASES['default']['ENGINE']}"
            f"  broker: {settings.CELERY_BROKER_URL.split('://')[0]}\n"
            f"demo account: {account.email} in organization {org}\n"
            f"API key (shown once): {raw_key}"
        )
        self.stdout.flush()
        try:
            while not stopping and all(child.poll() is None for child in children):
                time.sleep(0.2)
        finally:
            web, *others = children
            _stop([web])  # no new requests from here on
            if hibernate_on_exit:
                self.stdout.write("hibernating every sandbox before exiting...")
                self.stdout.flush()
                hibernated = sessions_hibernate_all(actor="up")
                self.stdout.write(f"hibernated {hibernated} sandbox(es)")
            _stop(others)
            # Nothing of the service runs any more: a snapshot the worker was killed in the
            # middle of must not leave its sandbox frozen until the next start.
            provider = get_provider()
            if hasattr(provider, "thaw_all"):
                provider.thaw_all()


def _stop(children: list[subprocess.Popen]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
