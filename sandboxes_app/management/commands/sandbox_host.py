"""`python manage.py sandbox_host --name NAME`: run this machine as one host of the sandbox pool.

One process does three things: it heartbeats its row (sandboxes_app.models.SandboxHost), serves
interactive calls on its internal endpoint (--bind; others reach it at --advertise), and runs a
Celery worker on its own queue `host.NAME` for the lifecycle calls routed to it. Its sandboxes
are local ones under this process's SANDBOX_ROOT, with this machine's limits. Before its first
heartbeat (and after being marked down) it settles what its disk holds (`host_reconcile`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid
from datetime import UTC, datetime

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections, connection

from recoup.celery import app as celery_app
from sandboxes_app.hosts.auth import host_secret
from sandboxes_app.hosts.client import pool_problem
from sandboxes_app.hosts.dispatch import host_provider_set
from sandboxes_app.hosts.server import HostServer
from sandboxes_app.hosts.services import (
    host_base_caches_prune,
    host_heartbeat,
    host_local_sandboxes,
    host_marked_down,
    host_name_taken,
    host_reconcile,
    memory_mb_total,
)
from sandboxes_app.models import HOST_NAME
from sandboxes_app.providers.base import ProviderError, SandboxStatus
from sandboxes_app.providers.local import LocalProvider

logger = logging.getLogger("recoup.hosts")

_PRUNE_EVERY = 12  # heartbeats between looks for caches of deleted bases (a minute by default)


def _bind(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise CommandError(f"--bind must be HOST:PORT (PORT 0: any free port), got {value!r}")
    return host.strip("[]"), int(port)


class Command(BaseCommand):
    help = (
        "Run a sandbox host of the pool (SANDBOX_PROVIDER=pool): a Celery worker on the queue "
        "host.NAME, an internal endpoint for interactive calls, and a heartbeat."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", required=True, help="this host's name: [a-z0-9-], unique")
        parser.add_argument(
            "--bind", default="127.0.0.1:0", help="HOST:PORT of the internal endpoint"
        )
        parser.add_argument(
            "--advertise",
            default="",
            help="the URL the web and worker reach the endpoint at (default http://BIND)",
        )
        parser.add_argument(
            "--concurrency", type=int, default=8, help="lifecycle calls run at once (8)"
        )
        parser.add_argument(
            "--max-sandboxes",
            type=int,
            default=settings.SANDBOX_HOST_MAX_SANDBOXES,
            help="placement stops here (SANDBOX_HOST_MAX_SANDBOXES; 0: twice the memory over "
            "SANDBOX_MEMORY_MB)",
        )

    def handle(self, *args: object, **options: object) -> None:
        name = str(options["name"])
        if not HOST_NAME.fullmatch(name):
            raise CommandError("--name must be 1-63 of a-z, 0-9 and -, starting alphanumeric")
        if settings.SANDBOX_PROVIDER != "pool":
            raise CommandError("A sandbox host serves a pool: set SANDBOX_PROVIDER=pool")
        problem = pool_problem()
        if problem is not None:
            raise CommandError(problem)
        try:
            provider = LocalProvider.from_settings()
        except ProviderError as exc:
            raise CommandError(f"recoup cannot run sandboxes here: {exc}") from exc
        host_provider_set(provider)
        # Only this process runs this SANDBOX_ROOT's sandboxes: a snapshot its predecessor was
        # killed in the middle of must not leave a sandbox frozen.
        provider.thaw_all()
        bind_host, bind_port = _bind(str(options["bind"]))
        server = HostServer((bind_host, bind_port), secret=host_secret())
        server.start()
        address = str(options["advertise"]) or f"http://{bind_host}:{server.server_port}"
        max_sandboxes = int(options["max_sandboxes"]) or max(
            1, 2 * memory_mb_total() // settings.SANDBOX_MEMORY_MB
        )
        beat = _Heartbeat(
            name=name, address=address, provider=provider, max_sandboxes=max_sandboxes
        )
        waited = False
        while host_name_taken(name=name, instance=beat.instance):
            if not waited:
                self.stderr.write(
                    f"Another process heartbeats as sandbox host {name}; waiting until its "
                    f"heartbeat is {settings.SANDBOX_HOST_DOWN_AFTER} s old"
                )
                waited = True
            time.sleep(1)
        beat.once(reconcile=True)  # up before the worker takes calls
        threading.Thread(target=beat.forever, name="host-heartbeat", daemon=True).start()
        self.stdout.write(
            json.dumps({"event": "host_started", "host": name, "address": address}) + "\n"
        )
        self.stdout.flush()
        celery_app.worker_main(
            [
                "worker",
                "-Q",
                f"host.{name}",
                "-n",
                f"{name}@%h",
                "--pool",
                "threads",
                "--concurrency",
                str(int(options["concurrency"])),
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )


class _Heartbeat:
    def __init__(
        self, *, name: str, address: str, provider: LocalProvider, max_sandboxes: int
    ) -> None:
        self.name = name
        self.address = address
        self.provider = provider
        self.max_sandboxes = max_sandboxes
        self.stopped = threading.Event()
        self.instance = uuid.uuid4().hex

    def _local(self) -> dict[str, SandboxStatus]:
        return host_local_sandboxes(
            root=self.provider.root, status=lambda n: self.provider.status(name=n)
        )

    def _retire(self, sandbox: str) -> str:
        """Snapshot an orphaned workspace for operators, then delete it (never before)."""
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        key = f"orphans/{self.name}/{sandbox}/{stamp}.tar.zst"
        self.provider.stop(name=sandbox)
        self.provider.snapshot(name=sandbox, storage_key=key)
        self.provider.destroy(name=sandbox)
        return key

    def once(self, *, reconcile: bool = False) -> None:
        try:
            if reconcile or host_marked_down(name=self.name):
                settled = host_reconcile(
                    host_name=self.name, local_names=list(self._local()), retire=self._retire
                )
                if settled["adopted"] or settled["orphaned"]:
                    logger.warning(json.dumps({"event": "host_reconciled", **settled}))
            running = sum(1 for s in self._local().values() if s == SandboxStatus.RUNNING)
            held = host_heartbeat(
                name=self.name,
                instance=self.instance,
                address=self.address,
                root=self.provider.root,
                max_sandboxes=self.max_sandboxes,
                live_sandboxes=running,
            )
            if held is None:
                # Two live processes under one name would share one queue with two disks.
                logger.error("another process took over sandbox host %s; stopping", self.name)
                self.stopped.set()
                os.kill(os.getpid(), signal.SIGTERM)
        except Exception:  # noqa: BLE001 - a missed beat is retried; the host must not die of it
            logger.exception("heartbeat failed host=%s", self.name)
            close_old_connections()
        finally:
            connection.close()

    def forever(self) -> None:
        beats = 0
        while not self.stopped.wait(settings.SANDBOX_HOST_HEARTBEAT):
            self.once()
            beats += 1
            if beats % _PRUNE_EVERY == 0:
                self.prune()

    def prune(self) -> None:
        try:
            host_base_caches_prune(
                root=self.provider.root,
                delete=lambda info: self.provider.delete_snapshot(snapshot=info),
            )
        except Exception:  # noqa: BLE001 - a cache left for the next round costs only disk
            logger.exception("base cache pruning failed host=%s", self.name)
        finally:
            connection.close()
