"""The cgroup v2 backend, for real, on this host's cgroup2 mount.

Hybrid hosts (v1 controllers, plus a cgroup2 mount at /sys/fs/cgroup/unified with none) still
offer v2's core files, cgroup.freeze and cgroup.kill, on every group: the whole-tree kill, the
snapshot freeze and the stop run on v2 here. Limits need the memory, pids and cpu controllers;
the test of those skips, saying so, where this host's cgroup2 mount does not offer them.
"""

import time
from pathlib import Path

import pytest

from sandboxes_app.providers.base import ProviderError
from sandboxes_app.providers.local import LocalProvider
from sandboxes_app.providers.local_cgroups import V2_CONTROLLERS, v2_controllers, v2_writable


def _cgroup2_root() -> Path | None:
    for candidate in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if v2_writable(candidate) and (candidate / "cgroup.subtree_control").exists():
            return candidate
    return None


ROOT = _cgroup2_root()
pytestmark = pytest.mark.skipif(ROOT is None, reason="this host has no writable cgroup2 mount")
COMPLETE = ROOT is not None and set(V2_CONTROLLERS) <= v2_controllers(ROOT)


@pytest.fixture
def v2(settings):
    settings.SANDBOX_CGROUP = "v2"
    settings.SANDBOX_CGROUP2_ROOT = ROOT
    if not COMPLETE:
        settings.SANDBOX_LIMITS = "off"
    return settings


def test_without_its_controllers_the_service_refuses_unless_limits_are_off(sandbox_root, settings):
    settings.SANDBOX_CGROUP = "v2"
    settings.SANDBOX_CGROUP2_ROOT = ROOT
    if COMPLETE:
        assert LocalProvider.from_settings().cgroup_backend.enforced
        return
    with pytest.raises(ProviderError, match="SANDBOX_LIMITS=off") as refused:
        LocalProvider.from_settings()
    assert "does not offer" in str(refused.value)

    settings.SANDBOX_LIMITS = "off"
    assert LocalProvider.from_settings().cgroup_backend.kind == "v2"


def test_readyz_says_when_sandboxes_run_unlimited(v2, anon, sandbox_root):
    response = anon.get("/readyz")

    limits = response.json()["sandboxLimits"]
    if COMPLETE:
        assert limits.startswith("enforced (cgroup v2); disk")
    else:
        assert limits.startswith("off: sandboxes run unlimited")


def test_commands_timeouts_snapshots_and_stop_run_on_v2(v2, make_provider, source, new_name):
    provider = make_provider()
    name = new_name()
    provider.create(name=name, source=source)
    top = provider._cgroups(name).dir()

    inside = provider.run(name=name, argv=["cat", "/proc/self/cgroup"])
    started = time.monotonic()
    killed = provider.run(
        name=name, argv=["sh", "-c", "sleep 30 & setsid sleep 30 & wait"], timeout_s=0.3
    )
    elapsed = time.monotonic() - started
    left = provider.run(name=name, argv=["sh", "-c", "ps -eo comm= | grep -cx sleep"])
    snap = provider.snapshot(name=name, storage_key=f"sessions/{name}.tar.zst")
    thawed = (top / "cgroup.events").read_text()
    init_procs = (top / "init" / "cgroup.procs").read_text().split()
    provider.stop(name=name)

    assert inside.exit_code == 0
    assert killed.timed_out and elapsed < 0.3 + 0.5
    assert left.stdout.strip() == "1"  # the init's sleep; the setsid one died with its run
    assert snap.size_bytes > 0 and "frozen 0" in thawed
    assert init_procs  # the init lives in the sandbox's v2 group
    assert not top.exists()


@pytest.mark.skipif(not COMPLETE, reason=f"the cgroup2 mount at {ROOT} offers no {V2_CONTROLLERS}")
def test_limits_are_written_to_the_sandbox_group(v2, make_provider, source, new_name):
    v2.SANDBOX_CPUS = 0.5
    provider = make_provider()
    name = new_name()
    provider.create(name=name, source=source)
    top = provider._cgroups(name).dir()

    assert (top / "cpu.max").read_text().split() == ["50000", "100000"]
    assert int((top / "memory.max").read_text()) == v2.SANDBOX_MEMORY_MB * 1024 * 1024
    assert int((top / "pids.max").read_text()) == v2.SANDBOX_MAX_PROCESSES
