"""Per-sandbox cgroups (v1): CPU, memory and pids limits, a freezer for snapshots, and one child
cgroup per command so a timeout can kill the command's whole tree, whatever it forked or
setsid'd.

Layout: /sys/fs/cgroup/<controller>/recoup/<key>[/run-<id>] for memory, pids and freezer, and
/sys/fs/cgroup/{cpu,cpuacct}/recoup/<key> (no run groups: the CPU budget is the sandbox's).
The init and background processes stay in the sandbox-level groups or their run groups;
freezing the sandbox-level freezer freezes every descendant.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from sandboxes_app.providers.base import ProviderError

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "freezer", "cpu", "cpuacct")
_CFS_PERIOD_US = 100_000


def cgroups_available() -> bool:
    """True when every controller we use is a writable cgroup v1 hierarchy."""
    return all(
        (CGROUP_ROOT / c / "cgroup.procs").exists() and os.access(CGROUP_ROOT / c, os.W_OK)
        for c in CONTROLLERS
    )


class SandboxCgroups:
    """The cgroups of one sandbox. `key` must be unique per sandbox on the host."""

    def __init__(self, *, key: str) -> None:
        self.key = key

    def dir(self, controller: str, run_id: str | None = None) -> Path:
        path = CGROUP_ROOT / controller / "recoup" / self.key
        return path / f"run-{run_id}" if run_id else path

    def setup(self, *, limits) -> None:
        """Make the sandbox's groups with `limits` (a local_runtime.Limits)."""
        for controller in CONTROLLERS:
            self.dir(controller).mkdir(parents=True, exist_ok=True)
        _write(self.dir("memory") / "memory.limit_in_bytes", str(limits.memory_mb * 1024 * 1024))
        _write(self.dir("pids") / "pids.max", str(limits.max_processes))
        # CFS bandwidth: every process of the sandbox together gets `cpus` CPUs' worth of time.
        _write(self.dir("cpu") / "cpu.cfs_period_us", str(_CFS_PERIOD_US))
        _write(
            self.dir("cpu") / "cpu.cfs_quota_us", str(max(int(limits.cpus * _CFS_PERIOD_US), 1000))
        )
        _write(self.dir("freezer") / "freezer.state", "THAWED")

    def init_procs_files(self) -> list[Path]:
        return [self.dir(c) / "cgroup.procs" for c in CONTROLLERS]

    def create_run(self, run_id: str) -> list[Path]:
        """Make the run's own groups; returns the cgroup.procs files a command must join."""
        for controller in ("pids", "freezer"):
            self.dir(controller, run_id).mkdir()
        return [
            self.dir("memory") / "cgroup.procs",
            self.dir("cpu") / "cgroup.procs",
            self.dir("cpuacct") / "cgroup.procs",
            self.dir("pids", run_id) / "cgroup.procs",
            self.dir("freezer", run_id) / "cgroup.procs",
        ]

    def cpu_usage_ns(self) -> int:
        """CPU time used by the sandbox's processes so far (cpuacct), in nanoseconds."""
        return int((self.dir("cpuacct") / "cpuacct.usage").read_text())

    def release_run(self, run_id: str) -> None:
        """Remove the run's groups unless background processes still live in them."""
        for controller in ("pids", "freezer"):
            with contextlib.suppress(OSError):
                self.dir(controller, run_id).rmdir()

    def kill_run(self, run_id: str, *, spare: int) -> None:
        """Kill every process of the run but `spare`, the host-side nsenter: it reaps its child
        and exits by itself. Killed, its sandboxed child would be left for the host's init to
        reap, and the sandbox's PID namespace could not end until that happens."""
        _kill_tree(freezer=self.dir("freezer", run_id), spare=spare)

    def freeze(self, *, timeout_s: float = 10.0) -> None:
        state = self.dir("freezer") / "freezer.state"
        _write(state, "FROZEN")
        deadline = time.monotonic() + timeout_s
        while state.read_text().strip() != "FROZEN":
            if time.monotonic() > deadline:
                _write(state, "THAWED")
                raise ProviderError("Could not freeze the sandbox for a snapshot")
            time.sleep(0.005)

    def thaw(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            _write(self.dir("freezer") / "freezer.state", "THAWED")

    def kill_all_and_remove(self) -> None:
        """Kill every process of the sandbox and delete its groups. Idempotent."""
        freezer = self.dir("freezer")
        if freezer.exists():
            _kill_tree(freezer=freezer)
        for controller in CONTROLLERS:
            top = self.dir(controller)
            if not top.exists():
                continue
            for child in sorted(top.glob("run-*")):
                _rmdir_when_empty(child)
            _rmdir_when_empty(top)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _pids_under(group: Path) -> list[int]:
    pids = []
    for procs in group.rglob("cgroup.procs"):
        with contextlib.suppress(FileNotFoundError):
            pids.extend(int(p) for p in procs.read_text().split())
    return pids


def _kill_tree(*, freezer: Path, spare: int | None = None, timeout_s: float = 5.0) -> None:
    """Freeze so nothing can fork while we kill, SIGKILL everything, thaw so the kills land."""
    state = freezer / "freezer.state"
    _write(state, "FROZEN")
    for pid in _pids_under(freezer):
        if pid != spare:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _write(state, "THAWED")
    deadline = time.monotonic() + timeout_s
    while pids := [p for p in _pids_under(freezer) if p != spare]:
        if time.monotonic() > deadline:
            raise ProviderError(f"Processes {pids} of the sandbox would not die")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def _rmdir_when_empty(path: Path, *, timeout_s: float = 2.0) -> None:
    # A killed task leaves its cgroup a moment after it stops being listed; retry briefly.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
