"""`repoUrl` rules: the one accepted shape, and everything else refused before git runs."""

from pathlib import Path

import pytest

from sandboxes_app.git.commands import GitError, git_clone
from sandboxes_app.git.urls import InvalidRepoUrl, parse_repo_url
from sandboxes_app.providers.base import GitSource, ProviderError, SandboxStatus

GOOD = [
    ("https://github.com/acme/app", "acme", "app"),
    ("https://github.com/acme/app.git", "acme", "app"),
    ("https://github.com/acme/app/", "acme", "app"),
    ("https://github.com/acme/app.git/", "acme", "app"),
    ("https://github.com/a/b", "a", "b"),
    ("https://github.com/Acme-Corp/My.Repo_1", "Acme-Corp", "My.Repo_1"),
    ("https://github.com/acme/_private", "acme", "_private"),
    ("https://github.com/a1-b2-c3/repo-name", "a1-b2-c3", "repo-name"),
    ("https://github.com/acme/app.js", "acme", "app.js"),
    ("https://github.com/acme/app.git.git", "acme", "app.git"),
    ("https://github.com/" + "o" * 39 + "/app", "o" * 39, "app"),
    ("https://github.com/acme/" + "r" * 100, "acme", "r" * 100),
    ("https://github.com/0/0", "0", "0"),
]

BAD = [
    "",
    "github.com/acme/app",
    "acme/app",
    "http://github.com/acme/app",
    "HTTPS://github.com/acme/app",
    "https://GitHub.com/acme/app",
    "https://gitlab.com/acme/app",
    "https://github.com.evil.com/acme/app",
    "https://github.com:443/acme/app",
    "git@github.com:acme/app.git",
    "ssh://git@github.com/acme/app",
    "file:///etc/passwd",
    "ext::sh -c touch% /tmp/pwned",
    "https://user:pw@github.com/acme/app",
    "https://github.com/acme",
    "https://github.com/acme/app/tree/main",
    "https://github.com/acme//app",
    "https://github.com//app",
    "https://github.com/acme/app?ref=main",
    "https://github.com/acme/app#readme",
    "https://github.com/acme/app%2e%2e",
    "https://github.com/acme/app with space",
    "https://github.com/acme/app\n",
    "https://github.com/acme/app\\x",
    "https://github.com/acme/../app",
    "https://github.com/../etc",
    "https://github.com/acme/..",
    "https://github.com/acme/.",
    "https://github.com/acme/a..b",
    "https://github.com/acme/.github",
    "https://github.com/acme-/app",
    "https://github.com/ac--me/app",
    "https://github.com/acmé/app",
    "https://github.com/" + "o" * 40 + "/app",
    "https://github.com/acme/" + "r" * 101,
    "https://github.com/acme/" + "r" * 190,
]

# Strings that would be options if git ever parsed them as such.
INJECTIONS = [
    "https://github.com/-uexploit/x",
    "https://github.com/acme/-x",
    "https://github.com/acme/--upload-pack=touch",
    "https://github.com/--config=core.sshCommand=touch/x",
]


@pytest.mark.parametrize(("url", "owner", "name"), GOOD)
def test_it_accepts_github_repository_urls(url, owner, name):
    ref = parse_repo_url(url)

    assert (ref.owner, ref.name) == (owner, name)
    assert ref.url == f"https://github.com/{owner}/{name}"


@pytest.mark.parametrize("url", BAD + INJECTIONS)
def test_it_refuses_everything_else(url):
    with pytest.raises(InvalidRepoUrl, match="repoUrl"):
        parse_repo_url(url)


@pytest.mark.parametrize("value", [None, 42, ["https://github.com/acme/app"], b"x"])
def test_it_refuses_non_strings(value):
    with pytest.raises(InvalidRepoUrl, match="must be a string"):
        parse_repo_url(value)


def test_the_clone_url_is_githubs_whatever_mirror_serves_it(settings):
    """The session's cloneUrl and a workspace's origin: never the mirror's address."""
    settings.SANDBOX_GIT_BASE_URL = "file:///srv/origins"

    assert parse_repo_url("https://github.com/acme/app/").clone_url == (
        "https://github.com/acme/app.git"
    )


def test_git_failures_name_neither_the_mirror_nor_host_paths(origins, sandbox_root):
    """git's message reaches 502 bodies and lifecycleError, so it speaks the client's terms."""
    origins.create("acme", "app", {"a.txt": "a\n"})
    taken = sandbox_root / "taken"
    (taken / "something").mkdir(parents=True)

    with pytest.raises(GitError) as missing:
        git_clone(
            url=f"{origins.base_url}/acme/missing.git", dest=sandbox_root / "new", branch=None
        )
    with pytest.raises(GitError) as occupied:
        git_clone(url=f"{origins.base_url}/acme/app.git", dest=taken, branch=None)

    assert "https://github.com/acme/missing.git" in str(missing.value)
    assert "'<sandboxes>/taken' already exists" in str(occupied.value)
    mirror = origins.base_url.removeprefix("file://")
    for message in (str(missing.value), str(occupied.value)):
        assert mirror not in message and str(sandbox_root) not in message


@pytest.mark.parametrize(
    "clone_url",
    [
        "--upload-pack=touch {marker}",
        "-u touch {marker}",
        "--config=core.sshCommand=touch {marker}",
        "ext::sh -c touch% {marker}",
    ],
)
def test_option_like_clone_urls_run_nothing_even_past_the_parser(
    provider, new_name, tmp_path, clone_url
):
    """Defence in depth: were a raw string to reach the provider, git still sees it after `--`,
    as a repository path, and fails without running anything."""
    marker = tmp_path / "pwned"
    name = new_name()

    with pytest.raises(ProviderError):
        provider.create(name=name, source=GitSource(clone_url=clone_url.format(marker=marker)))
    with pytest.raises(ProviderError):
        provider.file_tree(source=GitSource(clone_url=clone_url.format(marker=marker)))

    assert not marker.exists()
    assert provider.status(name=name) == SandboxStatus.ABSENT
    assert not any(Path.cwd().glob("--*"))
