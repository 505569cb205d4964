"""Operators see in the admin, where they look at sandboxes, which limits those run with."""

import pytest

pytestmark = pytest.mark.django_db

SANDBOXES = "/admin/sandboxes_app/sandbox/"


def test_the_sandbox_list_says_the_limits_hold(admin_client, sandbox_root, settings):
    page = admin_client.get(SANDBOXES)

    assert page.status_code == 200
    text = page.content.decode()
    assert "Sandbox limits: enforced (cgroup v" in text
    assert f"disk {settings.SANDBOX_DISK_MB} MB" in text


def test_the_sandbox_list_warns_when_sandboxes_run_unlimited(
    admin_client, sandbox_root, settings, tmp_path
):
    # A cgroup2 "mount" that offers nothing, as on a host without delegation.
    settings.SANDBOX_CGROUP = "v2"
    settings.SANDBOX_CGROUP2_ROOT = tmp_path / "no-cgroup2"
    settings.SANDBOX_LIMITS = "off"

    page = admin_client.get(SANDBOXES)

    assert page.status_code == 200
    assert '<li class="warning">Sandbox limits: off: sandboxes run unlimited' in (
        page.content.decode()
    )
