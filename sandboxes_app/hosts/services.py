"""The pool of sandbox hosts: heartbeats, placement, and what a dead host's sandboxes become.

A host is live while its heartbeat is fresher than SANDBOX_HOST_DOWN_AFTER; placement and
routing read that directly, so a dead host gets no new work even before the beat sweep marks it
down. Marking it down is what moves its sessions on: they become `failed`, their workspaces are
unreachable, and the next POST /api/sandbox resumes each from its last verified snapshot on a
live host. Everything since that snapshot is lost (SANDBOX_CHECKPOINT_INTERVAL bounds it),
unless the host comes back first: then it adopts its workspaces again (`host_reconcile`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, QuerySet
from django.utils import timezone
from django.utils.module_loading import import_string

from lifecycle.states import LifecycleState as S
from lifecycle.transitions import Seen, transition
from sandboxes_app.models import HostPlacement, Sandbox, SandboxHost, Snapshot
from sandboxes_app.providers.base import ProviderError, SandboxStatus, SnapshotInfo
from sessions_app.models import Session

logger = logging.getLogger("recoup.hosts")

REPLY_TTL_SECONDS = 600


def reply_key(call_id: str) -> str:
    """The Redis list a host pushes a lifecycle call's reply to; its caller pops it."""
    return f"recoup:host-reply:{call_id}"


def _live_cutoff(now: datetime | None = None) -> datetime:
    """Heartbeats older than this are a dead host's."""
    return (now or timezone.now()) - timedelta(seconds=settings.SANDBOX_HOST_DOWN_AFTER)


def _is_live(host: SandboxHost) -> bool:
    return host.status == SandboxHost.Status.UP and host.heartbeat_at >= _live_cutoff()


def hosts_live() -> QuerySet[SandboxHost]:
    return SandboxHost.objects.filter(
        status=SandboxHost.Status.UP, heartbeat_at__gte=_live_cutoff()
    )


def host_is_live(*, host_id: int) -> bool:
    return hosts_live().filter(id=host_id).exists()


# -- placement -------------------------------------------------------------------------------

Placement = Callable[[list[SandboxHost]], "SandboxHost | None"]


def least_loaded(hosts: list[SandboxHost]) -> SandboxHost | None:
    """The default placement: of the hosts with room (`placed` < max_sandboxes), the one whose
    placed sandboxes fill the smallest share of its room; ties go by name, so it is
    deterministic. `hosts` are live and annotated with `placed`."""
    room = [h for h in hosts if h.placed < h.max_sandboxes]
    if not room:
        return None
    return min(room, key=lambda h: (h.placed / h.max_sandboxes, h.name))


def host_choose() -> SandboxHost:
    """A live host with room for one more sandbox, by SANDBOX_HOST_PLACEMENT."""
    policy: Placement = import_string(settings.SANDBOX_HOST_PLACEMENT)
    hosts = list(hosts_live().annotate(placed=Count("placements")))
    chosen = policy(hosts)
    if chosen is None:
        up = len(hosts)
        raise ProviderError(
            "No sandbox host has room for another sandbox"
            if up
            else "No sandbox host is up (start one: manage.py sandbox_host --name NAME)"
        )
    return chosen


def sandbox_place(*, name: str) -> SandboxHost:
    """The host for a create or resume of `name`: where it already is, while that host lives
    (a running sandbox is sticky, and create is idempotent there); otherwise a new choice."""
    placed = HostPlacement.objects.select_related("host").filter(sandbox_name=name).first()
    if placed is not None and _is_live(placed.host):
        return placed.host
    chosen = host_choose()
    with transaction.atomic():
        # Replaced only if it still names the dead host: a concurrent placement wins.
        if placed is not None:
            HostPlacement.objects.filter(sandbox_name=name, host_id=placed.host_id).delete()
        row, _ = HostPlacement.objects.get_or_create(sandbox_name=name, defaults={"host": chosen})
    return SandboxHost.objects.get(id=row.host_id)


def sandbox_host_of(*, name: str) -> SandboxHost | None:
    """The live host holding `name`, or None when nothing holds it (never placed, destroyed,
    or its host is down: then its workspace is out of reach)."""
    placed = HostPlacement.objects.select_related("host").filter(sandbox_name=name).first()
    return placed.host if placed is not None and _is_live(placed.host) else None


def sandbox_unplace(*, name: str, host_id: int) -> None:
    HostPlacement.objects.filter(sandbox_name=name, host_id=host_id).delete()


# -- heartbeats and failure ------------------------------------------------------------------


def memory_mb_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 0


def host_local_sandboxes(
    *, root: Path, status: Callable[[str], SandboxStatus]
) -> dict[str, SandboxStatus]:
    """The sandboxes on this host's disk (running or stopped), with their status."""
    if not root.exists():
        return {}
    names = [p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")]
    found = {name: status(name) for name in names}
    return {name: state for name, state in found.items() if state != SandboxStatus.ABSENT}


def host_marked_down(*, name: str) -> bool:
    """Whether the pool gave this host up (the host reconciles its disk before it heartbeats)."""
    return SandboxHost.objects.filter(name=name, status=SandboxHost.Status.DOWN).exists()


def host_name_taken(*, name: str, instance: str) -> bool:
    """Whether another live process heartbeats under `name`."""
    return hosts_live().filter(name=name).exclude(instance=instance).exists()


def host_heartbeat(
    *,
    name: str,
    instance: str,
    address: str,
    root: Path,
    max_sandboxes: int,
    live_sandboxes: int,
) -> SandboxHost | None:
    """Record that this host is alive and what it has; a host marked down is up again. None,
    recording nothing, when another live process holds the name."""
    now = timezone.now()
    root.mkdir(parents=True, exist_ok=True)
    facts = {
        "instance": instance,
        "address": address,
        "cpus": os.cpu_count() or 1,
        "memory_mb": memory_mb_total(),
        "disk_free_mb": shutil.disk_usage(root).free // (1024 * 1024),
        "live_sandboxes": live_sandboxes,
        "max_sandboxes": max_sandboxes,
        "heartbeat_at": now,
        "status": SandboxHost.Status.UP,
        "down_at": None,
    }
    with transaction.atomic():
        row = SandboxHost.objects.select_for_update().filter(name=name).first()
        if row is None:
            try:
                with transaction.atomic():
                    return SandboxHost.objects.create(name=name, started_at=now, **facts)
            except IntegrityError:  # another process created it first: the name is taken
                return None
        if row.instance != instance and host_name_taken(name=name, instance=instance):
            return None
        if row.instance != instance:
            facts["started_at"] = now
        SandboxHost.objects.filter(id=row.id).update(**facts)
    return SandboxHost.objects.get(id=row.id)


def hosts_mark_down(*, now: datetime | None = None) -> list[str]:
    """Mark down every up host whose heartbeat is older than SANDBOX_HOST_DOWN_AFTER, and move
    its sandboxes' sessions to `failed`. Returns the names it marked. Run by the beat sweep."""
    now = now or timezone.now()
    cutoff = _live_cutoff(now)
    marked = []
    for host in SandboxHost.objects.filter(status=SandboxHost.Status.UP, heartbeat_at__lt=cutoff):
        # Compare-and-set: a heartbeat that arrived meanwhile keeps the host up.
        if SandboxHost.objects.filter(
            id=host.id, status=SandboxHost.Status.UP, heartbeat_at__lt=cutoff
        ).update(status=SandboxHost.Status.DOWN, down_at=now):
            marked.append(host.name)
            lost = _host_sandboxes_lost(host=host)
            logger.warning(
                json.dumps({"event": "host_down", "host": host.name, "sandboxes_lost": lost})
            )
    return marked


def _host_sandboxes_lost(*, host: SandboxHost) -> int:
    from sandboxes_app.commands import commands_settle

    names = list(host.placements.values_list("sandbox_name", flat=True))
    HostPlacement.objects.filter(host=host).delete()
    for name in names:
        for sandbox in Sandbox.objects.filter(name=name, destroyed_at__isnull=True):
            if sandbox.session_id is not None:
                _session_fail(session_id=sandbox.session_id, host=host)
        # Its running commands died with the host: recorded as killed.
        commands_settle(sandbox_name=name)
        Sandbox.objects.filter(name=name).mark_destroyed()
    return len(names)


def _session_fail(*, session_id: str, host: SandboxHost) -> None:
    session = Session.objects.filter(id=session_id).first()
    if session is None or session.lifecycle_state != S.ACTIVE:
        # Busy sessions end by themselves: the run waiting on this host sees it down, and an
        # abandoned run's lease expires into the sweep's recovery.
        return
    since = (
        f"its snapshot of {session.snapshot_created_at:%Y-%m-%d %H:%M:%S} UTC"
        if session.current_snapshot_id and session.snapshot_created_at
        else "a fresh clone (it had no snapshot)"
    )
    transition(
        session_id=session.id,
        seen=Seen.of(session),
        to=S.FAILED,
        reason="host_down",
        actor="sweep",
        error=(
            f"Sandbox host {host.name} stopped answering; the next POST /api/sandbox resumes "
            f"this session from {since} on another host, and changes since then are lost"
        ),
        changes={"lifecycle_retry_at": None},
    )


def host_reconcile(
    *, host_name: str, local_names: list[str], retire: Callable[[str], str]
) -> dict[str, list[str]]:
    """Before a restarted host, or one that was marked down, heartbeats again: settle what its
    disk holds against where the pool thinks each sandbox is. A workspace nobody else took over
    is adopted again (its failed session finds it at the next POST, or the retry sweep
    hibernates it: nothing is lost). One whose session started again elsewhere is `retire`d:
    snapshotted to storage for operators, then deleted; a workspace whose snapshot fails stays.
    """
    host = SandboxHost.objects.filter(name=host_name).first()
    if host is None:
        return {"adopted": [], "orphaned": []}
    adopted, orphaned = [], []
    for name in local_names:
        placed = HostPlacement.objects.filter(sandbox_name=name).first()
        if placed is not None and placed.host_id == host.id:
            continue
        if placed is None:
            _, created = HostPlacement.objects.get_or_create(
                sandbox_name=name, defaults={"host": host}
            )
            if created and _adoptable(name):
                adopted.append(name)
                # Due for the retry sweep once this host heartbeats again: it hibernates the
                # workspace from this disk, as it does one whose runtime died.
                Session.objects.filter(
                    id=name.removeprefix("sbx_"), lifecycle_state=S.FAILED
                ).update(
                    lifecycle_retry_at=timezone.now()
                    + timedelta(seconds=2 * settings.SANDBOX_HOST_HEARTBEAT)
                )
                continue
            HostPlacement.objects.filter(sandbox_name=name, host=host).delete()
        try:
            kept_at = retire(name)
        except ProviderError as exc:
            logger.error("orphaned workspace %s kept on disk: %s", name, exc)
            continue
        orphaned.append(f"{name} -> {kept_at}")
    return {"adopted": adopted, "orphaned": orphaned}


def host_base_caches_prune(*, root: Path, delete: Callable[[SnapshotInfo], None]) -> int:
    """Drop this host's caches of base snapshots the pool deleted (a rebuild replaced them, or
    retention): the caller deletes them on one host only, and the others learn it here.
    `delete` is the local provider's, which keeps a cache some sandbox still layers on."""
    bases = root / "_bases"
    if not bases.exists():
        return 0
    dropped = 0
    for cache in bases.iterdir():
        if Snapshot.objects.filter(
            kind=Snapshot.Kind.BASE, sha256=cache.name, deleted_at__isnull=True
        ).exists():
            continue
        gone = Snapshot.objects.filter(kind=Snapshot.Kind.BASE, sha256=cache.name).first()
        if gone is not None:  # never a cache the database knows nothing about
            delete(gone.to_info())
            dropped += 1
    return dropped


def _adoptable(name: str) -> bool:
    """A session's sandbox whose session has not started again anywhere else."""
    session_id = name.removeprefix("sbx_")
    return (
        Session.objects.filter(id=session_id, lifecycle_state__in=[S.FAILED, S.ACTIVE]).exists()
        and not Sandbox.objects.filter(name=name, destroyed_at__isnull=True)
        .exclude(session_id=session_id)
        .exists()
    )
