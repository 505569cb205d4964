"""Run the whole service on one machine: migrations, a demo key, web, worker and beat.

This is the README's run command. It supervises three child processes and stops them all
when one exits or when it receives SIGINT/SIGTERM.
"""

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from recoup.accounts.services import account_get_or_create, api_key_issue, organization_join
from sandboxes_app.checks import sandbox_provider_problem


class Command(BaseCommand):
    help = "Migrate, print a demo API key, and run web (gunicorn), worker and beat together."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--email", default="demo@recoup.local")
        parser.add_argument("--org", default="demo")

    def handle(
        self, *args: object, host: str, port: int, email: str, org: str, **options: object
    ) -> None:
        problem = sandbox_provider_problem()
        if problem is not None:
            raise CommandError(f"recoup cannot run sandboxes here: {problem}")
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        account = account_get_or_create(email=email)
        organization_join(account=account, slug=org)
        raw_key = api_key_issue(account=account, label="demo (manage.py up)").raw_key

        python = sys.executable
        children = [
            subprocess.Popen(
                [
                    python,
                    "-m",
                    "gunicorn",
                    "recoup.wsgi:application",
                    "--bind",
                    f"{host}:{port}",
                    "--workers",
                    "2",
                    "--threads",
                    "8",
                    "--timeout",
                    "900",
                    "--access-logfile",
                    "-",
                ]
            ),
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
            f"recoup is up on http://{host}:{port}/ (docs at /api/docs/, admin at /admin/)\n"
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
            for child in children:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 15
            for child in children:
                try:
                    child.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.kill(child.pid, signal.SIGKILL)
