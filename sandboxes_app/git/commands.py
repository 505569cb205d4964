"""Running the real `git` on the host: clone, look up the remote branch, fast-forward.

Repositories are named by their public URL (https://github.com/<owner>/<repo>.git), which is
also the `origin` a workspace keeps; host-side git alone reaches them through
SANDBOX_GIT_BASE_URL, by a `url.<base>.insteadOf` rewrite. So neither a mirror's address nor a
host path ever lands in a workspace's git config.

The token a caller passes (recoup.accounts.git_tokens chooses it) reaches git only as an
`http.<base url>/.extraHeader` config entry passed through GIT_CONFIG_COUNT/KEY/VALUE
environment variables: never in argv (visible in /proc), a URL, `.git/config`, a log line or a
sandbox's environment, and only sent to SANDBOX_GIT_BASE_URL. Every URL and path follows `--`
so nothing is parsed as an option.
"""

from __future__ import annotations

import base64
import os
import re
import selectors
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from sandboxes_app.git.progress import CloneProgress, Report
from sandboxes_app.git.urls import PUBLIC_BASE_URL
from sandboxes_app.providers.base import ProviderError

_BRANCH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]{0,200}")
# What git says when a remote repository is missing or refuses us: GitHub answers 401 or 404 for
# a private repository the credentials cannot read, as for one that does not exist.
_UNREADABLE = re.compile(
    r"repository '[^']*' not found|repository not found|could not read (username|password)"
    r"|authentication failed|does not appear to be a git repository|returned error: 40[134]",
    re.IGNORECASE,
)


class GitError(ProviderError):
    """git failed; the message carries git's own (token-free) explanation."""


def check_branch(branch: str) -> str:
    if not _BRANCH.fullmatch(branch) or ".." in branch or branch.endswith((".lock", "/", ".")):
        raise ProviderError(f"Invalid branch name {branch!r}")
    return branch


def git_env(*, token: str | None = None, trust_repo: bool = False) -> dict[str, str]:
    """A clean environment for host-side git: no host config, no prompts, optional token."""
    base = settings.SANDBOX_GIT_BASE_URL
    config = [("protocol.ext.allow", "never"), ("core.hooksPath", "/dev/null")]
    if base != PUBLIC_BASE_URL:
        # Only here is github.com the mirror: what git writes into a workspace keeps the
        # public URL it was given.
        config.append((f"url.{base}/.insteadOf", f"{PUBLIC_BASE_URL}/"))
    if trust_repo:
        # Workspaces belong to the sandbox uid; only ever set for repositories we cloned
        # ourselves and no sandbox has touched yet.
        config.append(("safe.directory", "*"))
    if token:
        credentials = base64.b64encode(f"x-access-token:{token}".encode())
        config.append((f"http.{base}/.extraHeader", f"Authorization: Basic {credentials.decode()}"))
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/nonexistent",
        "LANG": "C.UTF-8",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_COUNT": str(len(config)),
    }
    for i, (key, value) in enumerate(config):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def run_git(
    argv: list[str],
    *,
    token: str | None = None,
    cwd: Path | None = None,
    trust_repo: bool = False,
    remote: str | None = None,
) -> str:
    """Run `argv` (starting with "git" or a wrapper around it); return stdout or raise GitError.

    With `remote`, the repository URL argv talks to, a missing repository and one the token
    cannot read fail with one and the same message, so a refusal never tells that it exists.
    """
    proc = subprocess.run(
        argv,
        cwd=cwd or "/",
        env=git_env(token=token, trust_repo=trust_repo),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=settings.SANDBOX_COMMAND_MAX_TIMEOUT,
    )
    if proc.returncode != 0:
        raise _git_error(argv, proc.stderr.decode(errors="replace").strip(), remote=remote)
    return proc.stdout.decode(errors="replace")


def _git_error(argv: list[str], stderr: str, *, remote: str | None) -> GitError:
    command = _subcommand(argv)
    if remote is not None and _UNREADABLE.search(stderr):
        return GitError(
            f"git {command} failed: repository '{public_text(remote)}' not found, or not "
            "readable with the access this service has for it"
        )
    return GitError(f"git {command} failed: {public_text(stderr)[-500:]}")


def run_git_reporting(argv: list[str], *, token: str | None, remote: str, progress: Report) -> None:
    """`run_git` for a command started with `--progress`: git's stderr is read as it comes and
    its percentages go to `progress` (sandboxes_app.git.progress); the rest of what git says
    makes the error, as in `run_git`."""
    parser = CloneProgress(progress)
    # Optional progress (checking objects, updating files) shows at once, not after 2 s.
    env = {**git_env(token=token), "GIT_PROGRESS_DELAY": "0"}
    timeout = settings.SANDBOX_COMMAND_MAX_TIMEOUT
    deadline = time.monotonic() + timeout
    with (
        subprocess.Popen(
            argv,
            cwd="/",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        ) as proc,
        selectors.DefaultSelector() as selector,
    ):
        selector.register(proc.stderr, selectors.EVENT_READ)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(argv, timeout)
                if not selector.select(left):
                    continue
                chunk = os.read(proc.stderr.fileno(), 65536)
                if not chunk:
                    break  # git and everything it started closed stderr: it is done
                parser.feed(chunk)
        except BaseException:
            proc.kill()  # a clone nobody waits for any more stops here
            raise
        returncode = proc.wait()
    if returncode != 0:
        raise _git_error(argv, parser.text(), remote=remote)


def _subcommand(argv: list[str]) -> str:
    """`clone` of `git clone ...`, `fetch` of `git -C repo fetch ...`, through any wrapper."""
    rest = argv[argv.index("git") + 1 :] if "git" in argv else argv[1:]
    if rest[:1] == ["-C"]:
        rest = rest[2:]
    return rest[0] if rest else ""


def public_text(text: str) -> str:
    """A provider's or git's message as a client may read it: without the mirror's address or
    host paths.

    The message reaches API responses and `lifecycleError`; the client only knows the
    `https://github.com/...` form of its repository, and the host's layout is none of its
    business.
    """
    base = settings.SANDBOX_GIT_BASE_URL
    text = text.replace(base, PUBLIC_BASE_URL)
    if base.startswith("file://"):  # git names a local mirror by its path
        text = text.replace(base.removeprefix("file://"), PUBLIC_BASE_URL)
    # Longest first: SANDBOX_ROOT and the snapshot store usually sit under the data dir.
    for path, name in sorted(
        (
            (str(settings.SANDBOX_ROOT), "<sandboxes>"),
            (str(settings.SNAPSHOT_STORAGE_ROOT), "<snapshots>"),
            (str(settings.DATA_DIR), "<data>"),
        ),
        key=lambda pair: -len(pair[0]),
    ):
        text = text.replace(path, name)
    return text


def git_clone(
    *,
    url: str,
    dest: Path,
    branch: str | None,
    token: str | None = None,
    wrap: Callable[[list[str]], list[str]] | None = None,
    progress: Report | None = None,
) -> None:
    """Clone `url` into the new directory `dest` with `branch` (default: remote HEAD) out;
    `wrap` turns git's argv into the argv that runs it (in a mount namespace, say). With
    `progress`, git's own percentages go to it as `("cloning" | "checkout", percent)`."""
    argv = ["git", "clone", "--progress" if progress else "--quiet", "--no-local"]
    if branch:
        argv += ["--branch", check_branch(branch)]
    argv += ["--", url, str(dest)]
    if wrap:
        argv = wrap(argv)
    if progress is None:
        run_git(argv, token=token, remote=url)
    else:
        run_git_reporting(argv, token=token, remote=url, progress=progress)


def remote_head(*, url: str, branch: str | None, token: str | None = None) -> tuple[str, str]:
    """(branch, commit sha) of the remote's `branch`, or of its default branch."""
    ref = f"refs/heads/{check_branch(branch)}" if branch else "HEAD"
    out = run_git(["git", "ls-remote", "--symref", "--", url, ref], token=token, remote=url)
    name, sha = branch, None
    for line in out.splitlines():
        left, _, right = line.partition("\t")
        if left.startswith("ref: refs/heads/") and right == "HEAD":
            name = left[len("ref: refs/heads/") :]
        elif right == ref:
            sha = left
    if not name or not sha:
        raise GitError(f"The remote has no {'branch ' + branch if branch else 'default branch'}")
    return name, sha


def local_head(*, repo: Path) -> tuple[str, str]:
    """(branch, commit) checked out in a repository we created (a base cache)."""
    branch = run_git(
        ["git", "-C", str(repo), "symbolic-ref", "--short", "-q", "HEAD"], trust_repo=True
    ).strip()
    sha = run_git(["git", "-C", str(repo), "rev-parse", "HEAD"], trust_repo=True).strip()
    return branch, sha


def fast_forward_argvs(*, repo: Path, url: str, branch: str) -> list[list[str]]:
    """The git commands that bring a pristine checkout at `repo` to `url`'s `branch`.

    `checkout -B` rather than `merge --ff-only`: the checkout is untouched, so this is the
    fast-forward when there is one and still right after a force-push or a new default branch.
    """
    tracking = f"refs/remotes/origin/{branch}"
    return [
        [
            "git",
            "-C",
            str(repo),
            "fetch",
            "--quiet",
            "--no-tags",
            # FETCH_HEAD would record the mirror's address (a host path) in the workspace.
            "--no-write-fetch-head",
            "--",
            url,
            f"+refs/heads/{branch}:{tracking}",
        ],
        [
            "git",
            "-C",
            str(repo),
            "checkout",
            "--quiet",
            "-B",
            branch,
            "--track",
            f"origin/{branch}",
        ],
    ]
