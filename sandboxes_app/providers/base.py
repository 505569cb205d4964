"""The sandbox provider interface: the only way the endpoints and the lifecycle touch a sandbox.

A provider keeps no state in process memory: the web process, the Celery worker and an
operator's shell must all see the same sandbox, so everything a provider knows about a sandbox
lives on disk (local provider) or with the hosted engine. Every method is safe to call from any
process. Names are chosen by the caller (`sbx-<session id>`), which makes create idempotent.
"""

from __future__ import annotations

import abc
import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

# What any provider accepts as a command's environment: names a POSIX shell can export, values
# without NUL that encode as UTF-8, and bounded sizes (the whole set must fit one exec).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_ENV_VARS = 256
MAX_ENV_NAME = 256
MAX_ENV_VALUE = 32768
MAX_ENV_TOTAL = 262144


def env_problem(env: dict) -> str | None:
    """Why `env` cannot be a command's environment, naming the variable; None when it can."""
    if len(env) > MAX_ENV_VARS:
        return f"at most {MAX_ENV_VARS} variables"
    total = 0
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            return f"{str(name)[:64]!r} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"
        if len(name) > MAX_ENV_NAME:
            return f"{name[:64]}...: names are at most {MAX_ENV_NAME} characters"
        if not isinstance(value, str):
            return f"{name}: the value must be a string"
        if "\0" in value:
            return f"{name}: the value must not contain NUL"
        try:
            size = len(value.encode())
        except UnicodeEncodeError:
            return f"{name}: the value must be valid Unicode (no lone surrogates)"
        if size > MAX_ENV_VALUE:
            return f"{name}: values are at most {MAX_ENV_VALUE} bytes"
        total += len(name) + size + 2
    if total > MAX_ENV_TOTAL:
        return f"at most {MAX_ENV_TOTAL} bytes in all"
    return None


class ProviderError(Exception):
    """The provider could not do what was asked. The message is safe to show a client."""


class SandboxNotFound(ProviderError):
    """No runtime and no workspace exist under that name."""


class SandboxNotRunning(ProviderError):
    """The workspace exists but its runtime is stopped (for example after a host restart)."""


class SnapshotMissing(ProviderError):
    """The snapshot's object is not in storage."""


class SnapshotCorrupt(ProviderError):
    """The stored object does not match its recorded size or sha256, or does not unpack."""


@dataclass(frozen=True)
class GitSource:
    """Where a workspace's repository comes from. `clone_url` is the full URL git clones and
    the workspace's origin (https://github.com/...; host-side git maps it to the mirror).

    `token` is the credential chosen for this clone (recoup.accounts.git_tokens), or None for
    an anonymous one. It never leaves host-side git and never prints.
    """

    clone_url: str
    branch: str | None = None  # None: the origin's default branch
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class SnapshotInfo:
    """A verified snapshot object in the snapshot storage.

    `kind` is "session" (a session's workspace, or only its changes when `base` is set) or
    "base" (a prepared clone other sandboxes layer on). A session snapshot taken of a sandbox
    that sits on a base needs that base to be restored.
    """

    storage_key: str
    sha256: str
    size_bytes: int
    kind: str
    created_at: datetime
    base: SnapshotInfo | None = None


@dataclass(frozen=True)
class SandboxInfo:
    name: str
    branch: str
    created_at: datetime
    base: SnapshotInfo | None = None
    # What the provider did, for the caller's records and for tests and benchmarks:
    # "clone", "base" (copy-on-write over a base, then fast-forward) or "resume".
    boot: str = "clone"
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None when the command was killed on timeout
    stdout: str
    stderr: str
    duration_ms: int
    timed_out: bool
    truncated: bool  # stdout or stderr hit the output cap


@dataclass(frozen=True)
class DetachedHooks:
    """What a detached command's supervisor does besides running the command, with no Django
    settings to read: after each append to its log and once at exit it wakes readers on
    `channel` of the bus that `redis_url` / `data_dir` name (recoup.bus.publish_to), and at
    exit it frees the account's command slot `lease_slot` (sandboxes_app.command_leases)."""

    channel: str
    redis_url: str
    data_dir: str
    account_id: str
    lease_slot: str | None = None


@dataclass(frozen=True)
class DetachedExit:
    """How a detached command ended, as its supervisor recorded it."""

    exit_code: int | None  # None when it was killed or timed out
    finished_at: datetime
    timed_out: bool
    killed: bool  # by a kill request, or with its sandbox
    truncated: bool  # its log reached SANDBOX_COMMAND_LOG_BYTES


@dataclass(frozen=True)
class DetachedStatus:
    """`running` while its supervisor lives; otherwise `exit` is its record, or None when the
    supervisor went away without writing one (killed itself, a host restart, its sandbox
    deleted): the caller records it as killed."""

    running: bool
    exit: DetachedExit | None = None


@dataclass(frozen=True)
class LogRecord:
    """One record of a detached command's log: `stream` is stdout, stderr or truncated (the
    one marker written where the log reached its cap); `end` is the byte offset in the log
    after this record, which a reader resumes from."""

    stream: str
    data: bytes
    end: int


class SandboxStatus(enum.StrEnum):
    RUNNING = "running"  # runtime up, commands can run
    STOPPED = "stopped"  # workspace on disk, runtime gone
    ABSENT = "absent"  # nothing under that name


@dataclass(frozen=True)
class FileTreeEntry:
    path: str
    type: str  # "blob" or "tree"
    sha: str
    size: int | None = None  # blobs only


# How far a create or resume is: `progress(phase, percent)`, called from the thread that runs
# it. Phases, in order: "cloning" (percent: git's own, 0-100, never going back), "checkout"
# (git's percent), "from_base" (layering on a base snapshot instead of cloning; None), and
# "starting" (the sandbox's init, and a resume's extraction; None). The caller's callback must
# be cheap and must not raise.
Progress = Callable[[str, int | None], None]


class SandboxProvider(abc.ABC):
    """One sandbox engine. `name` is what the API reports as `mode`."""

    name: str

    @abc.abstractmethod
    def create(
        self,
        *,
        name: str,
        source: GitSource,
        base: SnapshotInfo | None = None,
        progress: Progress | None = None,
    ) -> SandboxInfo:
        """Start a sandbox holding a checkout of `source`.

        With `base`, the workspace is a copy-on-write layer over the base snapshot, fast-forwarded
        to the origin's current branch: no full clone. If a workspace already exists under
        `name`, it is started (not recloned) and returned. `progress` hears how far it is.
        """

    @abc.abstractmethod
    def resume(
        self, *, name: str, snapshot: SnapshotInfo, progress: Progress | None = None
    ) -> SandboxInfo:
        """Start a sandbox from a session snapshot, verified first; files come back identical.

        Raises SnapshotMissing or SnapshotCorrupt rather than ever starting an empty workspace.
        `progress` hears how far it is.
        """

    @abc.abstractmethod
    def run(
        self,
        *,
        name: str,
        argv: list[str],
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        """Run argv inside the running sandbox (no shell unless argv asks for one).

        `cwd` is relative to, or inside, /workspace. On timeout the command's whole process tree
        is killed. Background processes it leaves behind keep running until the sandbox stops.
        """

    def start_detached(
        self,
        *,
        name: str,
        command_id: str,
        argv: list[str],
        cwd: str | None,
        env: dict[str, str] | None,
        timeout_s: float,
        hooks: DetachedHooks,
    ) -> None:
        """Start argv as `run` would, under a supervisor that outlives the caller: it appends
        the output to the command's log, kills the tree at `timeout_s`, records the exit and
        runs `hooks`. Returns once the command is on its way. `command_id` names it from now
        on, from any process."""
        raise ProviderError(f"The {self.name} provider cannot run detached commands")

    def detached_status(self, *, name: str, command_id: str) -> DetachedStatus:
        raise ProviderError(f"The {self.name} provider cannot run detached commands")

    def detached_log(
        self, *, name: str, command_id: str, offset: int, max_bytes: int = 1 << 20
    ) -> list[LogRecord]:
        """The complete records of the command's log from byte `offset` on (about `max_bytes`
        of them at most); none when it has no more yet, or its log is gone with its sandbox."""
        raise ProviderError(f"The {self.name} provider cannot run detached commands")

    def detached_log_offset_valid(self, *, name: str, command_id: str, offset: int) -> bool:
        """True when `offset` is where a record of the log ends (or 0), so reading resumes
        there; any offset is valid once the log is gone."""
        raise ProviderError(f"The {self.name} provider cannot run detached commands")

    def detached_kill(self, *, name: str, command_id: str) -> bool:
        """Ask the command's supervisor to kill its whole tree (it then records the exit);
        False when the supervisor is gone, after making sure nothing of the command runs."""
        raise ProviderError(f"The {self.name} provider cannot run detached commands")

    @abc.abstractmethod
    def running_commands(self, *, name: str) -> int:
        """How many `run` calls are in flight for the sandbox, from any process."""

    @abc.abstractmethod
    def probe(self, *, name: str, timeout_s: float = 2.0) -> bool:
        """True when a trivial command answers inside the sandbox. Never starts a stopped one."""

    @abc.abstractmethod
    def status(self, *, name: str) -> SandboxStatus: ...

    @abc.abstractmethod
    def snapshot(self, *, name: str, storage_key: str) -> SnapshotInfo:
        """Quiesce the sandbox, write its workspace (only the changes when it sits on a base)
        under `storage_key`, durably, and verify it. The runtime and workspace are left as they
        were: the caller stops and destroys them only after this returns."""

    @abc.abstractmethod
    def build_base(self, *, source: GitSource, storage_key: str) -> SnapshotInfo:
        """Clone `source` into a fresh scratch workspace and store it as a base snapshot."""

    @abc.abstractmethod
    def verify_snapshot(self, *, snapshot: SnapshotInfo) -> None:
        """Raise SnapshotMissing or SnapshotCorrupt unless the stored object matches."""

    @abc.abstractmethod
    def delete_snapshot(self, *, snapshot: SnapshotInfo) -> None:
        """Remove the stored object (and any local cache of it). Missing is not an error."""

    @abc.abstractmethod
    def stop(self, *, name: str) -> None:
        """End every process of the sandbox. The workspace stays on disk. Idempotent."""

    @abc.abstractmethod
    def destroy(self, *, name: str) -> None:
        """Stop the sandbox and delete its workspace. Idempotent."""

    @abc.abstractmethod
    def file_tree(self, *, source: GitSource) -> list[FileTreeEntry]:
        """The recursive tree of the source's default branch, from git itself."""


def get_provider() -> SandboxProvider:
    """The provider chosen by SANDBOX_PROVIDER (default `local`; `pool`: sandbox hosts)."""
    from django.conf import settings

    if settings.SANDBOX_PROVIDER == "local":
        from sandboxes_app.providers.local import LocalProvider

        return LocalProvider.from_settings()
    if settings.SANDBOX_PROVIDER == "pool":
        from sandboxes_app.hosts.client import PoolProvider

        return PoolProvider.from_settings()
    raise ProviderError(f"Unknown SANDBOX_PROVIDER {settings.SANDBOX_PROVIDER!r}")
