"""What `manage.py up` prepares for a first try: the demo account's API key, kept across
restarts, and (`up --demo-repo`) a local git origin, so the README's walkthrough needs no
internet."""

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from recoup.accounts.models import Account
from recoup.accounts.services import api_key_authenticate, api_key_issue

DEMO_KEY_LABEL = "demo (manage.py up)"
DEMO_REPO_URL = "https://github.com/acme/demo"
DEMO_FILES = {
    "README.md": (
        "# demo\n\nA small repository that `manage.py up --demo-repo` serves from the data\n"
        "directory as https://github.com/acme/demo, so a sandbox can be tried offline.\n"
    ),
    "hello.sh": '#!/bin/sh\necho "hello from the sandbox, in $(pwd)"\n',
    "src/app.py": "print('hello')\n",
}
# Only the clone's own identity: no host configuration reaches the demo repository.
_GIT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/nonexistent",
    "LANG": "C.UTF-8",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "recoup demo",
    "GIT_AUTHOR_EMAIL": "demo@recoup.local",
    "GIT_COMMITTER_NAME": "recoup demo",
    "GIT_COMMITTER_EMAIL": "demo@recoup.local",
}


@dataclass(frozen=True)
class DemoKey:
    raw_key: str
    path: Path
    created: bool


def demo_key_ensure(*, account: Account, path: Path) -> DemoKey:
    """The demo key kept at `path` while it still authenticates as `account`; otherwise (first
    start, key revoked or file deleted) a new key, written there readable by its owner only.

    Each start used to issue another key; keeping one means a restart leaves the key the
    walkthrough exported working, and the admin lists one demo key, not one per start.
    """
    if path.exists():
        raw_key = path.read_text().strip()
        kept = api_key_authenticate(raw_key=raw_key)
        if kept is not None and kept.pk == account.pk:
            return DemoKey(raw_key=raw_key, path=path, created=False)
    issued = api_key_issue(account=account, label=DEMO_KEY_LABEL)
    staged = path.with_name(f".{path.name}.tmp")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(issued.raw_key + "\n")
    os.replace(staged, path)
    return DemoKey(raw_key=issued.raw_key, path=path, created=True)


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=_GIT_ENV, check=True, capture_output=True)


def demo_origin_ensure(*, root: Path) -> Path:
    """The bare repository `<root>/acme/demo.git` with one commit of DEMO_FILES, made on the
    first call and kept after (with whatever was pushed to it). `file://<root>` is the
    SANDBOX_GIT_BASE_URL that serves it as DEMO_REPO_URL. Returns its path."""
    bare = root / "acme" / "demo.git"
    if (bare / "HEAD").exists():
        return bare
    bare.parent.mkdir(parents=True, exist_ok=True)
    # Built aside and renamed into place, so a start killed halfway leaves no half repository.
    with tempfile.TemporaryDirectory(dir=bare.parent, prefix=".demo-") as staging:
        work, staged = Path(staging) / "work", Path(staging) / "demo.git"
        _git("init", "-q", "--initial-branch=main", str(work), cwd=Path(staging))
        for name, content in DEMO_FILES.items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(content)
        (work / "hello.sh").chmod(0o755)
        _git("add", "-A", cwd=work)
        _git("commit", "-q", "-m", "A demo repository for recoup", cwd=work)
        _git("init", "-q", "--bare", "--initial-branch=main", str(staged), cwd=Path(staging))
        _git("push", "-q", str(staged), "HEAD:main", cwd=work)
        try:
            staged.rename(bare)
        except OSError:  # another start made it meanwhile
            if not (bare / "HEAD").exists():
                raise
    return bare
