"""The file tree of a repository's branch, read from git itself without a working copy."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sandboxes_app.git.commands import check_branch, run_git
from sandboxes_app.providers.base import FileTreeEntry
from sandboxes_app.providers.local_layout import file_lock


def file_tree(
    *, url: str, branch: str | None, cache_root: Path, token: str | None = None
) -> list[FileTreeEntry]:
    """`git ls-tree -r -t -l` of the branch tip, fetched shallowly into a cached bare repo.

    Submodules (gitlinks) are left out: they are neither a blob nor a tree of this repository.
    """
    ref = f"refs/heads/{check_branch(branch)}" if branch else "HEAD"
    repo = cache_root / f"{hashlib.sha256(url.encode()).hexdigest()[:24]}.git"
    with file_lock(cache_root / f"{repo.name}.lock"):
        if not (repo / "HEAD").exists():
            run_git(["git", "init", "--quiet", "--bare", "--", str(repo)])
        run_git(
            ["git", "-C", str(repo), "fetch", "--quiet", "--no-tags", "--depth=1"]
            + ["--", url, f"+{ref}:refs/recoup/tree"],
            token=token,
            trust_repo=True,
            remote=url,
        )
        out = run_git(
            ["git", "-C", str(repo), "ls-tree", "-r", "-t", "-l", "-z", "refs/recoup/tree"],
            trust_repo=True,
        )
    entries = []
    for record in out.split("\0"):
        if not record:
            continue
        meta, _, path = record.partition("\t")
        _mode, kind, sha, size = meta.split()
        if kind == "blob":
            entries.append(FileTreeEntry(path=path, type="blob", sha=sha, size=int(size)))
        elif kind == "tree":
            entries.append(FileTreeEntry(path=path, type="tree", sha=sha))
    return entries
