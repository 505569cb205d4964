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
from dataclasses import dataclass
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
        _kill_tree(group=self.dir("freezer", run_id), freeze=_V1_FREEZE, spare=spare)

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

    def is_frozen(self) -> bool:
        try:
            return (self.dir("freezer") / "freezer.state").read_text().strip() != "THAWED"
        except FileNotFoundError:
            return False

    def kill_all_and_remove(self) -> None:
        """Kill every process of the sandbox and delete its groups. Idempotent."""
        freezer = self.dir("freezer")
        if freezer.exists():
            _kill_tree(group=freezer, freeze=_V1_FREEZE)
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


def _kill_tree(
    *, group: Path, freeze: tuple[str, str, str], spare: int | None = None, timeout_s: float = 5.0
) -> None:
    """Freeze so nothing can fork while we kill, SIGKILL everything, thaw so the kills land.

    `freeze` is the group's freeze file and its frozen and thawed values: v1's freezer.state
    (FROZEN/THAWED) or v2's cgroup.freeze (1/0).
    """
    state, frozen, thawed = group / freeze[0], freeze[1], freeze[2]
    _write(state, frozen)
    for pid in _pids_under(group):
        if pid != spare:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _write(state, thawed)
    deadline = time.monotonic() + timeout_s
    while pids := [p for p in _pids_under(group) if p != spare]:
        if time.monotonic() > deadline:
            raise ProviderError(f"Processes {pids} of the sandbox would not die")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


_V1_FREEZE = ("freezer.state", "FROZEN", "THAWED")
_V2_FREEZE = ("cgroup.freeze", "1", "0")


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


# --- cgroup v2 ---------------------------------------------------------------------------

V2_CONTROLLERS = ("memory", "pids", "cpu")


def v2_controllers(root: Path) -> set[str]:
    """The controllers a cgroup2 mount at `root` offers, or an empty set if it is not one."""
    try:
        return set((root / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


def v2_writable(root: Path) -> bool:
    return (root / "cgroup.procs").exists() and os.access(root, os.W_OK)


class SandboxCgroups2:
    """The cgroups of one sandbox on a cgroup2 mount (`root`).

    Layout: <root>/recoup/<key> holds the limits (memory.max, pids.max, cpu.max); its children
    `init` (the init, the network helper, background processes) and `run-<id>` (one per
    command) hold the processes, so no group both has processes and hands controllers down.
    cgroup.freeze quiesces the sandbox for a snapshot; cgroup.kill ends it in one write.
    `controllers` are the ones the mount offers; limits are set for those only (the caller
    refuses to start when one it needs is missing, unless SANDBOX_LIMITS=off).
    """

    def __init__(self, *, key: str, root: Path, controllers: set[str]) -> None:
        self.key = key
        self.root = root
        self.controllers = controllers & set(V2_CONTROLLERS)

    def dir(self, run_id: str | None = None) -> Path:
        path = self.root / "recoup" / self.key
        return path / f"run-{run_id}" if run_id else path

    def setup(self, *, limits) -> None:
        """Make the sandbox's groups with `limits` (a local_runtime.Limits)."""
        enable = " ".join(f"+{c}" for c in sorted(self.controllers))
        parent = self.root / "recoup"
        parent.mkdir(exist_ok=True)
        for group in (self.root, parent):
            current = set((group / "cgroup.subtree_control").read_text().split())
            if enable and not self.controllers <= current:
                _write(group / "cgroup.subtree_control", enable)
        top = self.dir()
        (top / "init").mkdir(parents=True, exist_ok=True)
        if "memory" in self.controllers:
            _write(top / "memory.max", str(limits.memory_mb * 1024 * 1024))
            if (top / "memory.swap.max").exists():
                _write(top / "memory.swap.max", "0")
        if "pids" in self.controllers:
            _write(top / "pids.max", str(limits.max_processes))
        if "cpu" in self.controllers:
            quota = max(int(limits.cpus * _CFS_PERIOD_US), 1000)
            _write(top / "cpu.max", f"{quota} {_CFS_PERIOD_US}")
        _write(top / "cgroup.freeze", "0")

    def init_procs_files(self) -> list[Path]:
        return [self.dir() / "init" / "cgroup.procs"]

    def create_run(self, run_id: str) -> list[Path]:
        self.dir(run_id).mkdir()
        return [self.dir(run_id) / "cgroup.procs"]

    def release_run(self, run_id: str) -> None:
        with contextlib.suppress(OSError):
            self.dir(run_id).rmdir()

    def kill_run(self, run_id: str, *, spare: int) -> None:
        """Kill every process of the run but `spare` (see SandboxCgroups.kill_run)."""
        _kill_tree(group=self.dir(run_id), freeze=_V2_FREEZE, spare=spare)

    def freeze(self, *, timeout_s: float = 10.0) -> None:
        top = self.dir()
        _write(top / "cgroup.freeze", "1")
        deadline = time.monotonic() + timeout_s
        while "frozen 1" not in (top / "cgroup.events").read_text():
            if time.monotonic() > deadline:
                _write(top / "cgroup.freeze", "0")
                raise ProviderError("Could not freeze the sandbox for a snapshot")
            time.sleep(0.005)

    def thaw(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            _write(self.dir() / "cgroup.freeze", "0")

    def is_frozen(self) -> bool:
        try:
            return (self.dir() / "cgroup.freeze").read_text().strip() == "1"
        except FileNotFoundError:
            return False

    def kill_all_and_remove(self) -> None:
        """Kill every process of the sandbox and delete its groups. Idempotent."""
        top = self.dir()
        if not top.exists():
            return
        if (top / "cgroup.kill").exists():
            _write(top / "cgroup.kill", "1")
        _kill_tree(group=top, freeze=_V2_FREEZE)
        for child in sorted(top.iterdir()):
            if child.is_dir():
                _rmdir_when_empty(child)
        _rmdir_when_empty(top)

    def cpu_usage_ns(self) -> int:
        for line in (self.dir() / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) * 1000
        raise ProviderError("cpu.stat has no usage_usec")


# --- which one ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupBackend:
    """The cgroups this host gives sandboxes: v1 hierarchies, a cgroup2 mount, or none."""

    kind: str | None  # "v1", "v2" or None
    v2_root: Path
    controllers: frozenset[str] = frozenset()  # what the cgroup2 mount offers

    @property
    def enforced(self) -> bool:
        """True when memory, process and CPU limits all hold."""
        return self.kind == "v1" or (
            self.kind == "v2" and set(V2_CONTROLLERS) <= set(self.controllers)
        )

    def describe(self) -> str:
        if self.enforced:
            return f"enforced (cgroup {self.kind})"
        if self.kind == "v2":
            missing = ", ".join(sorted(set(V2_CONTROLLERS) - set(self.controllers)))
            return f"not enforced: the cgroup2 mount at {self.v2_root} does not offer {missing}"
        return "not enforced: no writable cgroup v1 hierarchies or cgroup2 mount"

    def for_sandbox(self, key: str) -> SandboxCgroups | SandboxCgroups2 | None:
        if self.kind == "v1":
            return SandboxCgroups(key=key)
        if self.kind == "v2":
            return SandboxCgroups2(key=key, root=self.v2_root, controllers=set(self.controllers))
        return None


def detect_backend(*, choice: str, v2_root: Path) -> CgroupBackend:
    """`choice` is SANDBOX_CGROUP: "auto" takes complete v1 hierarchies, else a writable
    cgroup2 mount (even one without controllers: its freeze and kill still serve)."""
    v2 = frozenset(v2_controllers(v2_root)) if v2_writable(v2_root) else None
    if choice in ("auto", "v1") and cgroups_available():
        return CgroupBackend(kind="v1", v2_root=v2_root)
    if choice in ("auto", "v2") and v2 is not None:
        return CgroupBackend(kind="v2", v2_root=v2_root, controllers=v2)
    return CgroupBackend(kind=None, v2_root=v2_root)
