"""Placement and failure detection over the hosts' rows (no host processes needed)."""

from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from lifecycle.sweeps import sweep_run
from sandboxes_app.checks import sandbox_provider_problem
from sandboxes_app.hosts.services import host_choose, hosts_mark_down, sandbox_place
from sandboxes_app.models import HostPlacement, SandboxHost
from sandboxes_app.providers.base import ProviderError

pytestmark = pytest.mark.django_db


def _host(name: str, *, room: int = 10, age: float = 0) -> SandboxHost:
    beat = timezone.now() - timedelta(seconds=age)
    return SandboxHost.objects.create(
        name=name,
        address=f"http://{name}:1",
        max_sandboxes=room,
        started_at=beat,
        heartbeat_at=beat,
    )


def first_by_name(hosts):
    """A placement policy of a deployment's own, to show SANDBOX_HOST_PLACEMENT is pluggable."""
    return min(hosts, key=lambda h: h.name[::-1], default=None)


def test_a_new_sandbox_goes_to_the_least_filled_live_host_with_room(settings):
    settings.SANDBOX_HOST_DOWN_AFTER = 20
    big, small, _stale = _host("big", room=10), _host("small", room=2), _host("stale", age=60)
    for i in range(3):
        HostPlacement.objects.create(sandbox_name=f"b{i}", host=big)  # 30 % full
    HostPlacement.objects.create(sandbox_name="s0", host=small)  # 50 % full
    assert host_choose() == big
    HostPlacement.objects.create(sandbox_name="b3", host=big)
    HostPlacement.objects.create(sandbox_name="b4", host=big)
    HostPlacement.objects.create(sandbox_name="b5", host=big)  # 60 % now
    assert host_choose() == small
    HostPlacement.objects.create(sandbox_name="s1", host=small)  # full
    assert host_choose() == big  # never the stale one, never a full one


def test_placement_is_sticky_while_the_host_lives_and_moves_when_it_is_dead(settings):
    settings.SANDBOX_HOST_DOWN_AFTER = 20
    a, b = _host("a"), _host("b")
    HostPlacement.objects.create(sandbox_name="sbx_1", host=b)
    HostPlacement.objects.create(sandbox_name="x", host=b)
    assert sandbox_place(name="sbx_1") == b  # although a is emptier
    SandboxHost.objects.filter(id=b.id).update(heartbeat_at=timezone.now() - timedelta(seconds=60))
    assert sandbox_place(name="sbx_1") == a
    assert HostPlacement.objects.get(sandbox_name="sbx_1").host == a


def test_no_live_host_or_no_room_is_a_clear_error(settings):
    settings.SANDBOX_HOST_DOWN_AFTER = 20
    with pytest.raises(ProviderError, match="No sandbox host is up"):
        host_choose()
    full = _host("full", room=1)
    HostPlacement.objects.create(sandbox_name="only", host=full)
    with pytest.raises(ProviderError, match="No sandbox host has room"):
        host_choose()


def test_the_placement_policy_is_a_setting(settings):
    settings.SANDBOX_HOST_PLACEMENT = f"{__name__}.first_by_name"
    _host("ab"), _host("ba")
    assert host_choose().name == "ba"  # "ab" reversed sorts first


def test_the_sweep_marks_a_silent_host_down_within_its_deadline(settings):
    settings.SANDBOX_PROVIDER = "pool"
    settings.SANDBOX_HOST_DOWN_AFTER = 20
    _host("fresh", age=19)
    _host("silent", age=21)
    sweep_run(limit=10, enqueue=lambda due: None)
    assert SandboxHost.objects.get(name="silent").status == SandboxHost.Status.DOWN
    assert SandboxHost.objects.get(name="fresh").status == SandboxHost.Status.UP
    assert hosts_mark_down() == []  # once only


@pytest.mark.parametrize(
    ("argv", "changes", "refusal"),
    [
        (["--name", "Bad_Name"], {"SANDBOX_PROVIDER": "pool"}, "--name must be"),
        (["--name", "host-a"], {"SANDBOX_PROVIDER": "local"}, "set SANDBOX_PROVIDER=pool"),
        (
            ["--name", "host-a"],
            {"SANDBOX_PROVIDER": "pool", "SNAPSHOT_STORAGE_ROOT_EXPLICIT": False},
            "a snapshot storage every host reaches",
        ),
        (
            ["--name", "host-a"],
            {"SANDBOX_PROVIDER": "pool", "CELERY_BROKER_URL": "filesystem://localhost/"},
            "a Redis CELERY_BROKER_URL",
        ),
    ],
)
def test_a_sandbox_host_refuses_to_start_misconfigured_and_registers_nothing(
    settings, argv, changes, refusal
):
    for name, value in changes.items():
        setattr(settings, name, value)
    settings.REDIS_URL = settings.REDIS_URL or "redis://127.0.0.1:6379/0"
    with pytest.raises(CommandError, match=refusal):
        call_command("sandbox_host", *argv)
    assert not SandboxHost.objects.exists()


def test_a_pool_with_a_storage_only_one_machine_sees_refuses_to_start(settings):
    settings.SANDBOX_PROVIDER = "pool"
    settings.SNAPSHOT_STORAGE_ROOT_EXPLICIT = False
    assert "SNAPSHOT_STORAGE=s3" in sandbox_provider_problem()
    settings.SNAPSHOT_STORAGE_ROOT_EXPLICIT = True  # a root every host mounts
    assert sandbox_provider_problem() is None
