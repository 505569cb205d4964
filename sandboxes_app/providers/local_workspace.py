"""Filling a local sandbox's workspace on disk: base caches, ownership, the checked-out branch."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from pathlib import Path

from sandboxes_app.providers.base import SnapshotInfo
from sandboxes_app.providers.local_layout import (
    base_cache_dir,
    file_lock,
    sandbox_ids,
)
from sandboxes_app.snapshots import snapshot_extract


def base_lock(*, root: Path, sha256: str, shared: bool) -> contextlib.AbstractContextManager:
    """Users of a base cache hold it shared; deleting the cache takes it exclusively."""
    return file_lock(root / "_locks" / f"_base-{sha256}.lock", shared=shared)


def ensure_base_cache(*, root: Path, base: SnapshotInfo) -> Path:
    """The extracted, read-only tree of `base`, unpacked (and verified) on first use.

    Extraction goes to a temporary dir renamed into place, so a cache dir is always complete;
    two processes racing both extract, one rename wins and the other's copy is dropped.
    """
    cache = base_cache_dir(root=root, sha256=base.sha256)
    if cache.is_dir():
        own_if_stale(cache)  # extracted before SANDBOX_UID changed
        return cache
    tmp = cache.parent / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    try:
        snapshot_extract(
            storage_key=base.storage_key,
            sha256=base.sha256,
            size_bytes=base.size_bytes,
            dest=tmp,
        )
        own_if_stale(tmp)  # the archive holds the ids of the day it was built
        try:
            os.rename(tmp, cache)
        except OSError:
            if not cache.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return cache


def adopt_as_base_cache(*, root: Path, tree: Path, sha256: str) -> None:
    """Keep a freshly built base's tree as its cache, saving the first extraction."""
    cache = base_cache_dir(root=root, sha256=sha256)
    cache.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.rename(tree, cache)


def own_if_stale(top: Path) -> None:
    """Re-own a tree unpacked from an archive made under other ids (SANDBOX_UID changed).

    The archive's top directory carries the ids of its day, so one stat tells.
    """
    st = top.stat()
    if (st.st_uid, st.st_gid) != sandbox_ids():
        chown_to_sandbox(top)


def chown_to_sandbox(top: Path) -> None:
    """Give every entry under `top` (symlinks themselves, not targets) to the sandbox user."""
    uid, gid = sandbox_ids()
    os.lchown(top, uid, gid)
    stack = [top]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISCHR(st.st_mode):
                    continue  # overlay whiteouts stay as overlayfs made them
                if st.st_uid != uid or st.st_gid != gid:
                    os.lchown(entry.path, uid, gid)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(Path(entry.path))


def head_branch(*, layers: list[Path]) -> str:
    """The branch `.git/HEAD` names in the topmost layer holding it; "HEAD" when detached.

    Read without running git: the workspace may come from a snapshot a sandbox wrote, and
    host-side git would honour its config. Symlinks and special files are not followed.
    """
    for layer in layers:
        git_dir = layer / ".git"
        try:
            st = os.lstat(git_dir)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            return "HEAD"
        try:
            fd = os.open(git_dir / "HEAD", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError:
            return "HEAD"
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return "HEAD"
            head = f.read(512).decode(errors="replace").strip()
        prefix = "ref: refs/heads/"
        return head[len(prefix) :] if head.startswith(prefix) else "HEAD"
    return "HEAD"


def tree_bytes(top: Path) -> int:
    """Bytes allocated on disk under `top` (what `du` reports), hardlinks counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total
