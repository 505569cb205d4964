"""The local provider: one bubblewrap sandbox per session on this host, state kept on disk.

See local_layout (what lives where), local_runtime (the init and commands), local_cgroups
(limits, freezing, killing trees) and sandboxes_app.snapshots (stored objects). Every method
that changes a sandbox holds its flock, so the web process, the Celery worker and a shell can
all act on the same sandbox; `run` takes no lock, so commands run concurrently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

from sandboxes_app.git.commands import (
    fast_forward_argvs,
    git_clone,
    local_head,
    remote_head,
    run_git,
)
from sandboxes_app.git.tree import file_tree
from sandboxes_app.providers.base import (
    CommandResult,
    DetachedHooks,
    DetachedStatus,
    FileTreeEntry,
    GitSource,
    LogRecord,
    Progress,
    ProviderError,
    SandboxInfo,
    SandboxNotFound,
    SandboxNotRunning,
    SandboxProvider,
    SandboxStatus,
    SnapshotInfo,
    env_problem,
)
from sandboxes_app.providers.local_cgroups import (
    CgroupBackend,
    SandboxCgroups,
    SandboxCgroups2,
    detect_backend,
)
from sandboxes_app.providers.local_commands import (
    Command,
    command_argv,
    command_script,
    execute,
    init_handles,
    kill_tree,
    resolve_cwd,
    run_marker,
)
from sandboxes_app.providers.local_detached import (
    DetachedFiles,
    detached_status,
    log_boundary,
    log_read,
    signal_supervisor,
    start_supervisor,
)
from sandboxes_app.providers.local_identity import (
    claim_identity,
    idmap_map,
    idmapped_tree,
    release_identity,
    runtime_map,
    user_namespaces,
)
from sandboxes_app.providers.local_layout import (
    SandboxPaths,
    check_name,
    file_lock,
    live_init,
    read_json,
    sandbox_ids,
    snapshot_from_dict,
    snapshot_to_dict,
    write_json,
)
from sandboxes_app.providers.local_runtime import (
    HOME,
    HOST_ENV,
    SANDBOX_PATH,
    WORKSPACE,
    InitMounts,
    Limits,
    check_isolation,
    ensure_layers,
    host_tool,
    in_overlay_namespace,
    memfd_with,
    start_init,
    start_placeholder,
    stop_init,
)
from sandboxes_app.providers.local_seccomp import open_seccomp_bpf
from sandboxes_app.providers.local_volume import (
    attach,
    create_image,
    in_disk_namespace,
    mount_volume,
    mounted,
    volume_support_problem,
)
from sandboxes_app.providers.local_workspace import (
    adopt_as_base_cache,
    base_lock,
    chown_to_sandbox,
    ensure_base_cache,
    head_branch,
    own_if_stale,
)
from sandboxes_app.snapshots import snapshot_delete, snapshot_extract, snapshot_verify
from sandboxes_app.snapshots import snapshot_write as store_tree

logger = logging.getLogger(__name__)

_PROBE = ["pwd"]


class LocalProvider(SandboxProvider):
    """Sandboxes as bubblewrap namespaces on this host, workspaces under SANDBOX_ROOT."""

    name = "local"

    def __init__(
        self,
        *,
        root: Path,
        isolation: str,
        network: bool,
        limits: Limits,
        command_timeout: float,
        max_command_timeout: float,
        output_cap: int,
        disk_mb: int = 0,
        log_cap: int = 4 * 1024 * 1024,
    ) -> None:
        self.root = Path(root)
        self.isolation = isolation
        self.network = network
        self.limits = limits
        # A sandbox without isolation works in a host directory: there is no disk of its own.
        self.disk_mb = disk_mb if isolation != "none" else 0
        self.command_timeout = command_timeout
        self.max_command_timeout = max_command_timeout
        self.output_cap = output_cap
        self.log_cap = log_cap
        self.cgroup_backend: CgroupBackend = detect_backend(
            choice=settings.SANDBOX_CGROUP, v2_root=settings.SANDBOX_CGROUP2_ROOT
        )
        self._own_root()  # before anything (a lock, a resume's extraction) creates it 0755
        # Different SANDBOX_ROOTs on one host (parallel test runs) must not share cgroups.
        self._cgroup_prefix = hashlib.sha256(str(self.root).encode()).hexdigest()[:8]

    @classmethod
    def from_settings(cls) -> LocalProvider:
        """The provider configured by settings; raises ProviderError naming the fix when this
        host cannot isolate sandboxes."""
        network = settings.SANDBOX_NETWORK == "on"
        if settings.SANDBOX_ISOLATION == "bwrap":
            check_isolation(network=network)
        provider = cls(
            root=settings.SANDBOX_ROOT,
            isolation=settings.SANDBOX_ISOLATION,
            network=network,
            limits=Limits(
                cpus=settings.SANDBOX_CPUS,
                memory_mb=settings.SANDBOX_MEMORY_MB,
                max_processes=settings.SANDBOX_MAX_PROCESSES,
                max_file_mb=settings.SANDBOX_MAX_FILE_MB,
                cpu_seconds=settings.SANDBOX_CPU_SECONDS,
            ),
            command_timeout=settings.SANDBOX_COMMAND_TIMEOUT,
            max_command_timeout=settings.SANDBOX_COMMAND_MAX_TIMEOUT,
            output_cap=settings.SANDBOX_OUTPUT_CAP,
            disk_mb=settings.SANDBOX_DISK_MB,
            log_cap=settings.SANDBOX_COMMAND_LOG_BYTES,
        )
        if settings.SANDBOX_ISOLATION == "bwrap":
            provider.check_limits()
        return provider

    def check_limits(self) -> None:
        """Refuse to run sandboxes whose limits would not hold, unless SANDBOX_LIMITS=off (then
        a disk quota this host cannot give is dropped: sandboxes write to SANDBOX_ROOT)."""
        disk_problem = volume_support_problem() if self.disk_mb else None
        if settings.SANDBOX_LIMITS == "off":
            if disk_problem is not None:
                self.disk_mb = 0
            return
        if not self.cgroup_backend.enforced:
            raise ProviderError(
                f"Sandbox limits are {self.cgroup_backend.describe()}. Delegate the memory, "
                "pids and cpu controllers to this service on a cgroup2 mount (systemd: "
                "Delegate=yes; Docker: privileged, with the host's cgroup namespace), or set "
                "SANDBOX_LIMITS=off to run sandboxes without limits"
            )
        if disk_problem is not None:
            raise ProviderError(
                f"The sandbox disk quota (SANDBOX_DISK_MB) cannot hold: {disk_problem}; or set "
                "SANDBOX_DISK_MB=0 (or SANDBOX_LIMITS=off) to let sandboxes fill SANDBOX_ROOT"
            )

    def describe_limits(self) -> str:
        """For operators (/readyz, the admin): which limits sandboxes run with."""
        disk = f"disk {self.disk_mb} MB" if self.disk_mb else "disk unlimited"
        if self.cgroup_backend.enforced:
            return f"{self.cgroup_backend.describe()}; {disk}"
        return f"off: sandboxes run unlimited ({self.cgroup_backend.describe()}; {disk})"

    # -- lifecycle -------------------------------------------------------------------------

    def create(
        self,
        *,
        name: str,
        source: GitSource,
        base: SnapshotInfo | None = None,
        progress: Progress | None = None,
    ) -> SandboxInfo:
        report = progress or _unheard
        paths = self._paths(name)
        # `disk` keeps a new sandbox's filesystem up from its filling to its init's start, so it
        # is mounted once, not torn down and set up again in between.
        with file_lock(paths.lock), contextlib.ExitStack() as disk:
            meta = read_json(paths.meta)
            reused = meta is not None
            if meta is None:
                self._discard_partial(paths)
                meta = self._prepare(
                    paths=paths, source=source, base=base, disk=disk, progress=progress
                )
            report("starting", None)
            if live_init(paths) is None:
                self._start(paths=paths, meta=meta)
        return _info(meta, reused=reused)

    def resume(
        self, *, name: str, snapshot: SnapshotInfo, progress: Progress | None = None
    ) -> SandboxInfo:
        paths = self._paths(name)
        with file_lock(paths.lock):
            (progress or _unheard)("starting", None)
            meta = read_json(paths.meta)
            if meta is not None:
                if meta.get("snapshot_sha256") != snapshot.sha256:
                    raise ProviderError(f"Sandbox {name} already exists")
                if live_init(paths) is None:
                    self._start(paths=paths, meta=meta)
                return _info(meta, reused=True)
            self._discard_partial(paths)
            self._own_root()
            paths.dir.mkdir()
            with contextlib.ExitStack() as disk:  # up from the extraction to the init's start
                try:
                    self._new_disk(paths)
                    upper = disk.enter_context(self._layers(paths)) / "upper"
                    upper.mkdir()
                    layers = [upper]
                    if snapshot.base is not None:
                        layers.append(ensure_base_cache(root=self.root, base=snapshot.base))
                    snapshot_extract(
                        storage_key=snapshot.storage_key,
                        sha256=snapshot.sha256,
                        size_bytes=snapshot.size_bytes,
                        dest=upper,
                    )
                    own_if_stale(upper)
                    meta = self._meta(
                        paths=paths,
                        branch=head_branch(layers=layers),
                        base=snapshot.base,
                        boot="resume",
                    )
                    meta["snapshot_sha256"] = snapshot.sha256
                    write_json(paths.meta, meta)
                except BaseException:
                    shutil.rmtree(paths.dir, ignore_errors=True)
                    raise
                self._start(paths=paths, meta=meta)
        return _info(meta, reused=False)

    def stop(self, *, name: str) -> None:
        paths = self._paths(name)
        with file_lock(paths.lock):
            self._stop(paths)

    def destroy(self, *, name: str) -> None:
        paths = self._paths(name)
        with file_lock(paths.lock):
            self._stop(paths)
            if paths.dir.exists():
                shutil.rmtree(paths.dir)

    def thaw_all(self) -> int:
        """Thaw every sandbox of this root: for when nothing of the service runs any more (a
        snapshot killed mid-way leaves its sandbox frozen). Returns how many were thawed."""
        thawed = 0
        for path in self.root.iterdir() if self.root.exists() else []:
            if path.name.startswith("_") or not path.is_dir():
                continue
            cgroups = self._cgroups(path.name)
            if cgroups is not None and cgroups.is_frozen():
                cgroups.thaw()
                thawed += 1
        return thawed

    def status(self, *, name: str) -> SandboxStatus:
        paths = self._paths(name)
        if live_init(paths) is not None:
            return SandboxStatus.RUNNING
        if paths.meta.exists():
            return SandboxStatus.STOPPED
        return SandboxStatus.ABSENT

    # -- commands --------------------------------------------------------------------------

    def run(
        self,
        *,
        name: str,
        argv: list[str],
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        return self._run(name=name, argv=argv, cwd=cwd, env=env, timeout_s=timeout_s, track=True)

    def running_commands(self, *, name: str) -> int:
        paths = self._paths(name)
        count = 0
        for marker in paths.runs.glob("*.run") if paths.runs.exists() else []:
            try:
                fd = os.open(marker, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                count += 1  # its run still holds the lock
            else:
                with contextlib.suppress(FileNotFoundError):
                    marker.unlink()  # left by a process that died mid-run
            finally:
                os.close(fd)
        return count

    def probe(self, *, name: str, timeout_s: float = 2.0) -> bool:
        try:
            result = self._run(
                name=name, argv=_PROBE, cwd=None, env=None, timeout_s=timeout_s, track=False
            )
        except ProviderError:
            return False
        return result.exit_code == 0 and result.stdout.strip() in (WORKSPACE, self._probe_cwd(name))

    # -- snapshots -------------------------------------------------------------------------

    def snapshot(self, *, name: str, storage_key: str) -> SnapshotInfo:
        paths = self._paths(name)
        with file_lock(paths.lock):
            meta = read_json(paths.meta)
            if meta is None:
                raise SandboxNotFound(f"No sandbox named {name}")
            cgroups = self._cgroups(name) if live_init(paths) is not None else None
            # Frozen, nothing in the sandbox writes while tar reads. overlayfs keeps no data of
            # its own, so the upper dir read from the host is exactly what the sandbox sees.
            if cgroups is not None:
                cgroups.freeze()
            try:
                with self._layers(paths) as layers:
                    sha256, size = store_tree(
                        source=layers / "upper", storage_key=storage_key, verify=False
                    )
            finally:
                if cgroups is not None:
                    cgroups.thaw()
        # Read back only once thawed: the stored object no longer changes, and a checkpoint
        # of a running sandbox stalls its commands for the write alone (the read of a remote
        # object costs as much again). Nothing trusts the snapshot before this returns.
        snapshot_verify(storage_key=storage_key, sha256=sha256, size_bytes=size)
        return SnapshotInfo(
            storage_key=storage_key,
            sha256=sha256,
            size_bytes=size,
            kind="session",
            created_at=datetime.now(UTC),
            base=snapshot_from_dict(meta["base"]),
        )

    def build_base(self, *, source: GitSource, storage_key: str) -> SnapshotInfo:
        scratch = self.root / "_scratch" / uuid.uuid4().hex
        scratch.mkdir(parents=True)
        try:
            tree = scratch / "tree"
            git_clone(url=source.clone_url, dest=tree, branch=source.branch, token=source.token)
            chown_to_sandbox(tree)
            sha256, size = store_tree(source=tree, storage_key=storage_key)
            adopt_as_base_cache(root=self.root, tree=tree, sha256=sha256)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return SnapshotInfo(
            storage_key=storage_key,
            sha256=sha256,
            size_bytes=size,
            kind="base",
            created_at=datetime.now(UTC),
        )

    def verify_snapshot(self, *, snapshot: SnapshotInfo) -> None:
        snapshot_verify(
            storage_key=snapshot.storage_key, sha256=snapshot.sha256, size_bytes=snapshot.size_bytes
        )

    def delete_snapshot(self, *, snapshot: SnapshotInfo) -> None:
        snapshot_delete(storage_key=snapshot.storage_key)
        if snapshot.kind != "base":
            return
        # The cache goes only when no sandbox, running or stopped, still layers on it: a stopped
        # one needs it to start again, and its object is now gone.
        with base_lock(root=self.root, sha256=snapshot.sha256, shared=False):
            if not self._base_in_use(snapshot.sha256):
                shutil.rmtree(self.root / "_bases" / snapshot.sha256, ignore_errors=True)

    def file_tree(self, *, source: GitSource) -> list[FileTreeEntry]:
        return file_tree(
            url=source.clone_url,
            branch=source.branch,
            cache_root=self.root / "_trees",
            token=source.token,
        )

    # -- internals -------------------------------------------------------------------------

    def _paths(self, name: str) -> SandboxPaths:
        return SandboxPaths(root=self.root, name=check_name(name))

    def _new_disk(self, paths: SandboxPaths) -> None:
        """The sandbox's own disk of SANDBOX_DISK_MB, when there is a quota."""
        if self.disk_mb:
            create_image(paths.image, size_mb=self.disk_mb)

    @contextlib.contextmanager
    def _layers(self, paths: SandboxPaths) -> Iterator[Path]:
        """Where the overlay's layers (lower/, upper/, work/) are, for host-side work while the
        block runs: the root of the sandbox's disk, or the sandbox dir when it has none (no
        quota, or made before there was one)."""
        if not paths.image.exists():
            yield paths.dir
            return
        with mounted(paths.image) as root:
            yield root

    def _own_root(self) -> None:
        """SANDBOX_ROOT is root's alone (0700): no host user can reach a workspace in it."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.root.stat().st_mode & 0o777 != 0o700:
            os.chmod(self.root, 0o700)

    def _cgroups(self, name: str) -> SandboxCgroups | SandboxCgroups2 | None:
        return self.cgroup_backend.for_sandbox(f"{self._cgroup_prefix}-{name}")

    def _meta(self, *, paths: SandboxPaths, branch: str, base: SnapshotInfo | None, boot: str):
        return {
            "name": paths.name,
            "branch": branch,
            "created_at": datetime.now(UTC).isoformat(),
            "base": snapshot_to_dict(base),
            "boot": boot,
        }

    def _discard_partial(self, paths: SandboxPaths) -> None:
        """Remove what a create or resume that died half-way left (no meta.json yet)."""
        if paths.dir.exists():
            stop_init(record=live_init(paths), cgroups=self._cgroups(paths.name))
            shutil.rmtree(paths.dir)

    def _prepare(
        self,
        *,
        paths: SandboxPaths,
        source: GitSource,
        base: SnapshotInfo | None,
        disk: contextlib.ExitStack,
        progress: Progress | None,
    ):
        """Fill a new sandbox's workspace; its disk stays mounted until `disk` closes."""
        report = progress or _unheard
        self._own_root()
        paths.dir.mkdir(parents=True)
        try:
            self._new_disk(paths)
            layers = disk.enter_context(self._layers(paths))
            if base is None:
                report("cloning", 0)
                self._clone(paths=paths, source=source, progress=progress)
                chown_to_sandbox(layers / "upper")
                branch = head_branch(layers=[layers / "upper"])
                meta = self._meta(paths=paths, branch=branch, base=None, boot="clone")
            else:
                report("from_base", None)
                branch, moved = self._layer_on_base(
                    paths=paths, layers=layers, source=source, base=base
                )
                meta = self._meta(paths=paths, branch=branch, base=base, boot="base")
                meta["fast_forwarded"] = moved
            write_json(paths.meta, meta)
            return meta
        except BaseException:
            shutil.rmtree(paths.dir, ignore_errors=True)
            raise

    def _clone(self, *, paths: SandboxPaths, source: GitSource, progress: Progress | None) -> None:
        """Clone into the upper layer; straight onto the sandbox's disk when it has one, so a
        repository larger than the quota fails here and not later in the sandbox."""
        if not paths.image.exists():
            git_clone(
                url=source.clone_url,
                dest=paths.upper,
                branch=source.branch,
                token=source.token,
                progress=progress,
            )
            return
        paths.merged.mkdir(exist_ok=True)
        with attach(paths.image) as device:
            git_clone(
                url=source.clone_url,
                dest=paths.merged / "upper",
                branch=source.branch,
                token=source.token,
                wrap=functools.partial(in_disk_namespace, device=device, target=paths.merged),
                progress=progress,
            )

    def _layer_on_base(
        self, *, paths: SandboxPaths, layers: Path, source: GitSource, base: SnapshotInfo
    ):
        """An empty upper layer over the base, moved to the origin's current branch tip.

        Git runs as root in a throwaway mount namespace with the overlay mounted, only on the
        pristine base content we cloned ourselves; what it writes lands in the upper dir and
        is handed to the sandbox user once the overlay is gone again.
        """
        if self.isolation == "none":
            raise ProviderError("SANDBOX_ISOLATION=none cannot layer a sandbox on a base")
        with base_lock(root=self.root, sha256=base.sha256, shared=True):
            lower = ensure_base_cache(root=self.root, base=base)
            ensure_layers(layers=layers, merged=paths.merged)
            chown_to_sandbox(layers / "upper")
            branch, remote_sha = remote_head(
                url=source.clone_url, branch=source.branch, token=source.token
            )
            if local_head(repo=lower) == (branch, remote_sha):
                return branch, False
            for argv in fast_forward_argvs(repo=paths.merged, url=source.clone_url, branch=branch):
                run_git(
                    in_overlay_namespace(paths=paths, layers=layers, lower=lower, argv=argv),
                    trust_repo=True,
                    token=source.token,
                )
            chown_to_sandbox(layers / "upper")
        return branch, True

    def _start(self, *, paths: SandboxPaths, meta: dict) -> None:
        cgroups = self._cgroups(paths.name)
        paths.runs.mkdir(exist_ok=True)
        if self.isolation == "none":
            logger.warning(
                "Sandbox %s starts WITHOUT isolation (SANDBOX_ISOLATION=none): commands run "
                "as this service's user on the host",
                paths.name,
            )
            if cgroups is not None:
                # No init joins them, but each command's limits and timeout kill still do.
                cgroups.setup(limits=self.limits)
            write_json(paths.init, start_placeholder())
            return
        self._own_root()
        base = snapshot_from_dict(meta["base"])
        uid, gid = sandbox_ids()
        identity = claim_identity(root=self.root, name=paths.name)
        # The plain mount of the disk stays until the init holds the filesystem itself.
        with self._layers(paths) as layers, contextlib.ExitStack() as fds:
            try:
                ensure_layers(layers=layers, merged=paths.merged)
                record = self._start_init(
                    paths=paths, base=base, identity=identity, uid=uid, gid=gid, fds=fds
                )
            except BaseException:
                release_identity(root=self.root, name=paths.name, slot=identity.slot)
                raise
        record.update(slot=identity.slot, host_base=identity.host_base)
        write_json(paths.init, record)

    def _start_init(self, *, paths, base, identity, uid: int, gid: int, fds) -> dict:
        """The init in the identity's user namespace, over idmapped layers (fds: closed by
        the caller once the init holds what it needs)."""
        tools = {"unshare": host_tool("unshare"), "sleep": host_tool("sleep"), "env": HOST_ENV}

        def keep(fd: int) -> int:
            fds.callback(os.close, fd)
            return fd

        namespaces = user_namespaces(id_maps=[runtime_map(identity), idmap_map(identity)], **tools)
        userns_fd, idmap_fd = (keep(fd) for fd in namespaces)
        base_fd = None
        if base is not None:
            with base_lock(root=self.root, sha256=base.sha256, shared=True):
                cache = ensure_base_cache(root=self.root, base=base)
                base_fd = keep(idmapped_tree(cache, userns_fd=idmap_fd, read_only=True))
        if paths.image.exists():
            with attach(paths.image) as device:
                layers_fd = keep(mount_volume(device, userns_fd=idmap_fd))
        else:
            layers_fd = keep(idmapped_tree(paths.dir, userns_fd=idmap_fd))
        mounts = InitMounts(userns_fd=userns_fd, dir_fd=layers_fd, base_fd=base_fd)
        return start_init(
            paths=paths,
            mounts=mounts,
            cgroups=self._cgroups(paths.name),
            limits=self.limits,
            network=self.network,
            uid=uid,
            gid=gid,
            seccomp_fd=keep(open_seccomp_bpf(root=self.root)),
        )

    def _stop(self, paths: SandboxPaths) -> None:
        stop_init(record=live_init(paths), cgroups=self._cgroups(paths.name))
        # The slot goes back only once nothing of the sandbox runs under its ids.
        release_identity(
            root=self.root, name=paths.name, slot=(read_json(paths.init) or {}).get("slot")
        )
        with contextlib.suppress(FileNotFoundError):
            paths.init.unlink()

    def _base_in_use(self, sha256: str) -> bool:
        for meta_path in self.root.glob("*/meta.json"):
            base = (read_json(meta_path) or {}).get("base")
            while base:
                if base["sha256"] == sha256:
                    return True
                base = base.get("base")
        return False

    def _run(self, *, name, argv, cwd, env, timeout_s, track: bool) -> CommandResult:
        run_id = uuid.uuid4().hex[:16]
        with (
            self._chain(
                name=name, argv=argv, cwd=cwd, env=env, timeout_s=timeout_s, run_id=run_id
            ) as chain,
            contextlib.ExitStack() as stack,
        ):
            if chain.cgroups is not None:
                stack.callback(chain.cgroups.release_run, run_id)
            if track:
                stack.enter_context(run_marker(chain.paths))
            return execute(
                argv=chain.argv,
                script_fd=chain.script_fd,
                pass_fds=chain.pass_fds,
                command=chain.command,
                kill_tree=functools.partial(kill_tree, cgroups=chain.cgroups, run_id=run_id),
            )

    @contextlib.contextmanager
    def _chain(self, *, name, argv, cwd, env, timeout_s, run_id: str) -> Iterator[_Chain]:
        """Everything one run of the host chain needs, held for the block: the sandbox and the
        command checked, its script memfd, the seccomp filter's and the init's fds, and the
        run's cgroups, made for `run_id` (the caller releases them)."""
        paths = self._paths(name)
        record = live_init(paths)
        if record is None:
            if paths.meta.exists():
                raise SandboxNotRunning(f"Sandbox {name} is stopped")
            raise SandboxNotFound(f"No sandbox named {name}")
        if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
            raise ProviderError("argv must be a non-empty list of strings without NUL")
        workspace_cwd = resolve_cwd(cwd)
        isolated = self.isolation != "none"
        command = Command(
            argv=list(argv),
            # SANDBOX_ISOLATION=none runs on the host, in the workspace's host path.
            cwd=workspace_cwd if isolated else str(paths.upper) + workspace_cwd[len(WORKSPACE) :],
            env=self._command_env(env, home=HOME if isolated else str(paths.upper)),
            timeout_s=self._timeout(timeout_s),
            output_cap=self.output_cap,
        )
        cgroups = self._cgroups(name)
        with contextlib.ExitStack() as stack:
            script_fd = stack.enter_context(memfd_with(command_script(command), name="command"))
            seccomp_fd = open_seccomp_bpf(root=self.root) if isolated else None
            if seccomp_fd is not None:
                stack.callback(os.close, seccomp_fd)
            handles = stack.enter_context(init_handles(record)) if isolated else None
            pass_fds = (*(handles or {}).values(), *([seccomp_fd] if isolated else []))
            procs = cgroups.create_run(run_id) if cgroups else []
            yield _Chain(
                paths=paths,
                record=record,
                command=command,
                cgroups=cgroups,
                argv=command_argv(
                    record=record if isolated else None,
                    handles=handles,
                    limits=self.limits,
                    procs=procs,
                    seccomp_fd=seccomp_fd,
                ),
                script_fd=script_fd,
                pass_fds=pass_fds,
            )

    # -- detached commands -----------------------------------------------------------------

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
        files = self._files(name, command_id)
        with self._chain(
            name=name, argv=argv, cwd=cwd, env=env, timeout_s=timeout_s, run_id=files.run_id
        ) as chain:
            backend = self.cgroup_backend
            spec = {
                "argv": chain.argv,
                "script_fd": chain.script_fd,
                "pass_fds": list(chain.pass_fds),
                "timeout_s": chain.command.timeout_s,
                "log_cap": self.log_cap,
                "run_id": files.run_id,
                "cgroups": None
                if chain.cgroups is None
                else {
                    "kind": backend.kind,
                    "v2_root": str(backend.v2_root),
                    "controllers": sorted(backend.controllers),
                    "key": chain.cgroups.key,
                },
                "init": {"pid": chain.record["pid"], "start_time": chain.record["start_time"]},
                "hooks": dataclasses.asdict(hooks),
            }
            try:
                start_supervisor(
                    files=files, spec=spec, pass_fds=(chain.script_fd, *chain.pass_fds)
                )
            except BaseException:
                if chain.cgroups is not None:
                    chain.cgroups.release_run(files.run_id)
                raise

    def detached_status(self, *, name: str, command_id: str) -> DetachedStatus:
        return detached_status(self._files(name, command_id))

    def detached_log(
        self, *, name: str, command_id: str, offset: int, max_bytes: int = 1 << 20
    ) -> list[LogRecord]:
        return log_read(self._files(name, command_id).log, offset=offset, max_bytes=max_bytes)

    def detached_log_offset_valid(self, *, name: str, command_id: str, offset: int) -> bool:
        return log_boundary(self._files(name, command_id).log, offset=offset)

    def detached_kill(self, *, name: str, command_id: str) -> bool:
        files = self._files(name, command_id)
        if signal_supervisor(files):
            return True
        # Its supervisor is gone: whatever of the command still runs goes now, so a command
        # recorded killed is. No process is pid 0: nothing is spared.
        cgroups = self._cgroups(name)
        if cgroups is not None:
            with contextlib.suppress(OSError, ProviderError):
                cgroups.kill_run(files.run_id, spare=0)
            cgroups.release_run(files.run_id)
        return False

    def _files(self, name: str, command_id: str) -> DetachedFiles:
        return DetachedFiles(runs=self._paths(name).runs, command_id=command_id)

    def _probe_cwd(self, name: str) -> str:
        return str(self._paths(name).upper) if self.isolation == "none" else WORKSPACE

    def _timeout(self, timeout_s: float | None) -> float:
        timeout = self.command_timeout if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ProviderError("timeout_s must be positive")
        return min(timeout, self.max_command_timeout)

    def _command_env(self, extra: dict[str, str] | None, *, home: str) -> dict[str, str]:
        """Our defaults under the client's variables; they only ever reach the final shell."""
        problem = env_problem(extra or {})
        if problem is not None:
            raise ProviderError(f"env: {problem}")
        return {
            "PATH": SANDBOX_PATH,
            "HOME": home,
            "LANG": "C.UTF-8",
            "USER": "sandbox",
            **(extra or {}),
        }


def _unheard(phase: str, percent: int | None) -> None:
    """The progress of a create or resume nobody asked to hear."""


@dataclass(frozen=True)
class _Chain:
    """One run of the host chain, ready to start: what LocalProvider._chain holds open."""

    paths: SandboxPaths
    record: dict
    command: Command
    cgroups: SandboxCgroups | SandboxCgroups2 | None
    argv: list[str]
    script_fd: int
    pass_fds: tuple[int, ...]


def _info(meta: dict, *, reused: bool) -> SandboxInfo:
    details = {"reused": reused}
    if "fast_forwarded" in meta:
        details["fast_forwarded"] = meta["fast_forwarded"]
    return SandboxInfo(
        name=meta["name"],
        branch=meta["branch"],
        created_at=datetime.fromisoformat(meta["created_at"]),
        base=snapshot_from_dict(meta["base"]),
        boot=meta["boot"],
        details=details,
    )
