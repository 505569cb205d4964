"""SANDBOX_DISK_MB against real sandboxes: each one writes to a disk of its own (a sparse ext4
image on a loop device), a write past it fails inside with ENOSPC, and the sandbox, its
snapshots and the host stay healthy."""

import time
from pathlib import Path

import pytest

from sandboxes_app.providers.local_volume import loop_users
from tests.sandboxes_app.conftest import host_upper

pytestmark = pytest.mark.slow

QUOTA_MB = 64


@pytest.fixture
def quota(settings):
    settings.SANDBOX_DISK_MB = QUOTA_MB
    return QUOTA_MB


def sh(provider, name: str, script: str):
    return provider.run(name=name, argv=["sh", "-c", script], timeout_s=60)


def image_of(root: Path, name: str) -> Path:
    return root / name / "disk.img"


def wait_until(predicate, *, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_write_past_the_quota_fails_inside_and_the_sandbox_keeps_working(
    quota, provider, source, new_name, sandbox_root
):
    name = new_name()
    provider.create(name=name, source=source)

    size = sh(provider, name, "df -m --output=size /workspace | tail -1")
    fill = sh(provider, name, f"dd if=/dev/zero of=fill bs=1M count={quota * 2} 2>&1")

    assert int(size.stdout) <= quota, size.stdout
    assert fill.exit_code != 0 and "No space left on device" in fill.stdout, fill.stdout
    after = sh(provider, name, "rm fill && echo still here > after.txt && git status --porcelain")
    assert after.exit_code == 0, after.stderr
    assert after.stdout == "?? after.txt\n"
    # The host paid for at most the quota, in a file only root can reach.
    image = image_of(sandbox_root, name)
    assert image.stat().st_blocks * 512 <= (quota + 8) * 1024 * 1024
    assert image.stat().st_mode & 0o777 == 0o600


def test_the_snapshot_of_a_full_disk_resumes_with_its_files(
    quota, provider, source, new_name, sandbox_root
):
    name = new_name()
    provider.create(name=name, source=source)
    sh(provider, name, "dd if=/dev/zero of=fill bs=1M count=1000 2>/dev/null; echo kept > kept.txt")
    left = sh(provider, name, "stat -c %s fill").stdout.strip()

    snapshot = provider.snapshot(name=name, storage_key=f"sessions/{name}.tar.zst")
    provider.destroy(name=name)
    resumed = new_name()
    provider.resume(name=resumed, snapshot=snapshot)

    result = sh(provider, resumed, "cat kept.txt; stat -c %s fill; cat README.md")
    assert result.stdout == f"kept\n{left}\n# app\n", result.stderr
    # Full again, and still working: the resumed disk has the same quota.
    assert sh(provider, resumed, "dd if=/dev/zero of=more bs=1M count=100").exit_code != 0
    assert sh(provider, resumed, "rm more fill && touch ok").exit_code == 0


def test_a_sandbox_on_a_base_writes_its_changes_to_a_disk_of_the_quota(
    quota, provider, source, new_name
):
    base = provider.build_base(source=source, storage_key="bases/app.tar.zst")
    name = new_name()
    provider.create(name=name, source=source, base=base)

    fill = sh(provider, name, f"dd if=/dev/zero of=fill bs=1M count={quota * 2} 2>&1")

    assert "No space left on device" in fill.stdout, fill.stdout
    # The base's files stay readable and editable once space is freed.
    assert sh(provider, name, "rm fill && echo more >> README.md && cat README.md").stdout == (
        "# app\nmore\n"
    )


def test_no_mount_is_left_on_the_host_and_the_loop_device_goes_with_the_sandbox(
    quota, provider, source, new_name, sandbox_root
):
    name = new_name()
    provider.create(name=name, source=source)
    image = image_of(sandbox_root, name)
    sh(provider, name, "echo one > one.txt")

    # A snapshot of the running sandbox reads through the sandbox's own loop device: two
    # devices on one image would be two filesystems over the same blocks.
    assert len(loop_users(image)) == 1
    provider.snapshot(name=name, storage_key=f"sessions/{name}.tar.zst")
    assert len(loop_users(image)) == 1
    assert str(sandbox_root) not in Path("/proc/self/mountinfo").read_text()

    provider.stop(name=name)
    assert wait_until(lambda: loop_users(image) == [])
    # Started again (as after a host reboot): the same disk, attached anew.
    provider.create(name=name, source=source)
    assert sh(provider, name, "cat one.txt").stdout == "one\n"

    provider.destroy(name=name)
    assert not image.exists()
    assert wait_until(lambda: loop_users(image) == [])


def test_what_a_sandbox_deletes_goes_back_to_the_host(
    quota, provider, source, new_name, sandbox_root
):
    name = new_name()
    provider.create(name=name, source=source)
    image = image_of(sandbox_root, name)
    sh(provider, name, "dd if=/dev/zero of=big bs=1M count=40 && sync")
    grown = image.stat().st_blocks * 512

    sh(provider, name, "rm big && sync")  # sync commits the journal, which discards the blocks

    assert grown > 40 * 1024 * 1024
    assert wait_until(lambda: image.stat().st_blocks * 512 < grown - 30 * 1024 * 1024)


def test_without_a_quota_the_workspace_is_a_directory_of_sandbox_root(
    settings, provider, source, new_name, sandbox_root
):
    settings.SANDBOX_DISK_MB = 0
    name = new_name()
    provider_without = type(provider).from_settings()
    provider_without.create(name=name, source=source)

    assert not image_of(sandbox_root, name).exists()
    with host_upper(sandbox_root, name) as upper:
        assert upper == sandbox_root / name / "upper" and (upper / "README.md").exists()
    assert "disk unlimited" in provider_without.describe_limits()
    assert provider.disk_mb > 0 and f"disk {provider.disk_mb} MB" in provider.describe_limits()
