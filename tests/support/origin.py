"""Real git origins for tests: bare repositories laid out as SANDBOX_GIT_BASE_URL expects
(`<base>/<owner>/<repo>.git`), built with the git command line."""

import os
import subprocess
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
    ).stdout


class Origins:
    """A directory of bare repositories; `base_url` is what SANDBOX_GIT_BASE_URL points at."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def base_url(self) -> str:
        return f"file://{self.root}"

    def bare(self, owner: str, name: str) -> Path:
        return self.root / owner / f"{name}.git"

    def create(
        self, owner: str, name: str, files: dict[str, str | bytes], branch: str = "main"
    ) -> Path:
        """A new origin with one commit holding `files`; returns its bare path."""
        bare = self.bare(owner, name)
        bare.parent.mkdir(parents=True, exist_ok=True)
        git("init", "-q", "--bare", f"--initial-branch={branch}", str(bare))
        self.commit(owner, name, files, message="initial", branch=branch)
        return bare

    def commit(
        self,
        owner: str,
        name: str,
        files: dict[str, str | bytes],
        message: str = "change",
        branch: str = "main",
    ) -> str:
        """Push a commit that writes `files` on top of `branch`; returns its sha."""
        bare = self.bare(owner, name)
        work = bare.parent / f".{name}-work"
        if not work.exists():
            git("clone", "-q", str(bare), str(work))
            git("checkout", "-q", "-B", branch, cwd=work)
        for rel, content in files.items():
            path = work / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", message, cwd=work)
        git("push", "-q", "origin", f"HEAD:{branch}", cwd=work)
        return git("rev-parse", "HEAD", cwd=work).strip()
