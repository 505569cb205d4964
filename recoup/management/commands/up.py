"""Run the whole service on one machine: migrations, a demo key, web, worker and beat.

This is the README's run command. It supervises three child processes and prints its banner
once the web server answers. When one of them exits, it stops the others and exits non-zero,
naming it; SIGINT/SIGTERM stop them all and exit 0. `--demo-repo` serves clones from a local
repository (recoup.demo), so the walkthrough needs no internet.

Stopping keeps every sandbox running (the next start adopts them, and their sessions carry on)
unless --hibernate-on-exit asks to hibernate them all first; either way no sandbox is left
frozen by a snapshot cut short.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from lifecycle.hibernation import sessions_hibernate_all
from recoup.accounts.models import Organization
from recoup.accounts.services import account_get_or_create, organization_join
from recoup.demo import DEMO_REPO_URL, DemoKey, demo_key_ensure, demo_origin_ensure
from recoup.management.commands.web import port_problem
from sandboxes_app.checks import sandbox_provider_problem
from sandboxes_app.providers.base import get_provider

MANAGE_PY = Path(__file__).resolve().parents[3] / "manage.py"
# gunicorn's workers import Django first: on a busy 2-core machine that takes a while.
ANSWER_TIMEOUT = 120


class Command(BaseCommand):
    help = (
        "Migrate, keep a demo API key, and run web (gunicorn), worker and beat together; the "
        "banner appears once the web server answers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--host",
            default="127.0.0.1",
            help="address the web server listens on (default 127.0.0.1, this machine only; "
            "0.0.0.0 for every interface)",
        )
        parser.add_argument(
            "--port", type=int, default=8000, help="port the web server listens on (default 8000)"
        )
        parser.add_argument(
            "--email", default="demo@recoup.local", help="the demo account the key is for"
        )
        parser.add_argument("--org", default="demo", help="the demo account's organization slug")
        parser.add_argument(
            "--demo-repo",
            action="store_true",
            help="serve clones from a local demo repository (https://github.com/acme/demo, kept "
            "in RECOUP_DATA_DIR/demo-origins) instead of GitHub: no internet needed",
        )
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
        demo_repo: bool = False,
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
        organization = organization_join(account=account, slug=org)
        key = demo_key_ensure(account=account, path=settings.DATA_DIR / "demo-api-key")
        if demo_repo:
            origins = settings.DATA_DIR / "demo-origins"
            demo_origin_ensure(root=origins)
            # Inherited by web, worker and beat: every clone comes from the local directory.
            os.environ["SANDBOX_GIT_BASE_URL"] = settings.SANDBOX_GIT_BASE_URL = f"file://{origins}"

        children = self._start_children(host=host, port=port)
        failure = self._supervise(
            children,
            url=f"http://{_connect_host(host)}:{port}/healthz",
            on_ready=lambda: self._banner(
                host=host,
                port=port,
                email=account.email,
                organization=organization,
                key=key,
                demo_repo=demo_repo,
                hibernate_on_exit=hibernate_on_exit,
            ),
            hibernate_on_exit=hibernate_on_exit,
        )
        if failure is not None:
            raise CommandError(f"{failure}; stopped everything else")

    def _supervise(
        self,
        children: dict[str, subprocess.Popen],
        *,
        url: str,
        on_ready: Callable[[], None],
        hibernate_on_exit: bool,
    ) -> str | None:
        """Call `on_ready` once `url` answers, then wait for a stop signal or a child's exit;
        stop everything either way. Returns why the service ended, None for a stop signal."""
        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            failure = _wait_until_answering(url, children, lambda: stopping)
            if failure is not None or stopping:
                return failure
            on_ready()
            while not stopping and all(child.poll() is None for child in children.values()):
                time.sleep(0.2)
            return None if stopping else _exited(children)
        finally:
            self._shutdown(children, hibernate_on_exit=hibernate_on_exit)

    def _shutdown(self, children: dict[str, subprocess.Popen], *, hibernate_on_exit: bool) -> None:
        web, *others = children.values()
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

    def _start_children(self, *, host: str, port: int) -> dict[str, subprocess.Popen]:
        python = sys.executable
        celery = [python, "-m", "celery", "-A", "recoup"]
        schedule = settings.CELERY_BEAT_SCHEDULE_FILENAME
        return {
            "web": subprocess.Popen([python, str(MANAGE_PY), "web", "--bind", _bind(host, port)]),
            "worker": subprocess.Popen(
                [*celery, "worker", "--loglevel", "INFO", "--concurrency", "2", "-n", "worker@%h"]
            ),
            "beat": subprocess.Popen([*celery, "beat", "--loglevel", "INFO", "-s", schedule]),
        }

    def _banner(
        self,
        *,
        host: str,
        port: int,
        email: str,
        organization: Organization,
        key: DemoKey,
        demo_repo: bool,
        hibernate_on_exit: bool,
    ) -> None:
        lines = [
            f"recoup is up on http://{_bind(host, port)}/ (the console; docs at /api/docs/, "
            "admin at /admin/)",
            f"data dir: {settings.DATA_DIR}  database: {settings.DATABASES['default']['ENGINE']}"
            f"  broker: {settings.CELERY_BROKER_URL.split('://')[0]}",
            f"demo account: {email} in organization {organization.slug} "
            f"(organizationId {organization.id})",
        ]
        if key.created:
            lines.append(f"API key: {key.raw_key} (saved in {key.path})")
        else:
            # Printed once, when made; a restart keeps it and says where it is.
            lines.append(
                f"API key: the one made at the first start, kept in {key.path} (another: "
                f"scripts/manage create_api_key --email {email} --org {organization.slug})"
            )
        if demo_repo:
            lines.append(
                f"git: clones come from {settings.SANDBOX_GIT_BASE_URL.removeprefix('file://')}"
                f" (<owner>/<repo>.git), not GitHub; {DEMO_REPO_URL} is there"
            )
            lines.append("try it (a session in the organization, its sandbox, a command):")
            api = f"http://{_connect_host(host)}:{port}"
            lines += [f"  {line}" for line in _try_it(api=api, key=key, organization=organization)]
        else:
            lines.append("no internet? restart with --demo-repo to try a local repository")
        lines.append(
            "stop with Ctrl-C (every sandbox is hibernated first)"
            if hibernate_on_exit
            else "stop with Ctrl-C (sandboxes keep running for the next start; "
            "--hibernate-on-exit hibernates them)"
        )
        self.stdout.write("\n".join(lines))
        self.stdout.flush()


def _try_it(*, api: str, key: DemoKey, organization: Organization) -> list[str]:
    """The walkthrough's first steps against this service, ready to paste into a shell."""
    json_header = "-H 'content-type: application/json'"
    session = json.dumps({"title": "demo", "organizationId": str(organization.id)})
    sandbox = json.dumps({"repoUrl": DEMO_REPO_URL, "sessionId": "$SID"})
    command = json.dumps(
        {"sessionId": "$SID", "cmd": "sh", "args": ["-c", "./hello.sh && git log --oneline"]}
    )

    def in_double_quotes(body: str) -> str:  # so the shell expands $SID and nothing else
        return '"' + body.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return [
        f"export API={api} KEY=$(cat {shlex.quote(str(key.path))})",
        f'SID=$(curl -s -X POST $API/api/sessions -H "x-api-key: $KEY" {json_header} \\',
        f"  -d {shlex.quote(session)} \\",
        '  | python3 -c \'import json,sys; print(json.load(sys.stdin)["session"]["id"])\')',
        f'curl -s -X POST $API/api/sandbox -H "x-api-key: $KEY" {json_header} \\',
        f"  -d {in_double_quotes(sandbox)}; echo",
        f'curl -s -X POST $API/api/sandbox/commands -H "x-api-key: $KEY" {json_header} \\',
        f"  -d {in_double_quotes(command)}; echo",
    ]


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _connect_host(host: str) -> str:
    """Where this machine reaches a server listening on `host` (a wildcard: the loopback)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _wait_until_answering(
    url: str, children: dict[str, subprocess.Popen], stopping: Callable[[], bool]
) -> str | None:
    """None once `url` answers 200 (or a stop was asked for); else why it never will."""
    deadline = time.monotonic() + ANSWER_TIMEOUT
    # Straight to the server: an http_proxy in the environment must not answer for it.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while not stopping():
        if any(child.poll() is not None for child in children.values()):
            return f"{_exited(children)} before the web server answered"
        try:
            with opener.open(url, timeout=2) as response:
                if response.status == 200:
                    return None
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            return f"the web server did not answer on {url} within {ANSWER_TIMEOUT} s"
        time.sleep(0.2)
    return None


def _exited(children: dict[str, subprocess.Popen]) -> str:
    name, child = next((n, c) for n, c in children.items() if c.poll() is not None)
    return f"{name} exited with code {child.returncode} (its error is above)"


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
