"""Create, stop, destroy and status across processes' view of the disk; concurrent creates;
the GitHub token's path; the file tree read from git."""

import base64
import dataclasses
import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sandboxes_app.providers.base import GitSource, ProviderError, SandboxStatus
from sandboxes_app.providers.local import LocalProvider
from tests.sandboxes_app.conftest import host_upper


def test_it_clones_the_default_branch(provider, origins, new_name):
    origins.create("acme", "trunked", {"a.txt": "a\n"}, branch="trunk")
    source = GitSource(clone_url=f"{origins.base_url}/acme/trunked.git")
    name = new_name()

    info = provider.create(name=name, source=source)

    assert (info.boot, info.branch, info.base, info.name) == ("clone", "trunk", None, name)
    assert provider.run(name=name, argv=["git", "branch", "--show-current"]).stdout == "trunk\n"
    assert provider.run(name=name, argv=["cat", "a.txt"]).stdout == "a\n"


def test_it_clones_a_requested_branch(provider, origins, source, new_name):
    origins.commit("acme", "app", {"feature.txt": "f\n"}, branch="feature")
    name = new_name()

    info = provider.create(
        name=name, source=GitSource(clone_url=source.clone_url, branch="feature")
    )

    assert info.branch == "feature"
    assert provider.run(name=name, argv=["cat", "feature.txt"]).stdout == "f\n"


def test_status_follows_the_lifecycle(provider, source, new_name, sandbox_root):
    name = new_name()
    assert provider.status(name=name) == SandboxStatus.ABSENT

    provider.create(name=name, source=source)
    assert provider.status(name=name) == SandboxStatus.RUNNING
    # Another process (a fresh provider reads only the disk) sees the same sandbox.
    assert LocalProvider.from_settings().status(name=name) == SandboxStatus.RUNNING

    provider.stop(name=name)
    provider.stop(name=name)
    assert provider.status(name=name) == SandboxStatus.STOPPED
    with host_upper(sandbox_root, name) as upper:
        assert upper.joinpath("README.md").exists()

    provider.destroy(name=name)
    provider.destroy(name=name)
    assert provider.status(name=name) == SandboxStatus.ABSENT
    assert not (sandbox_root / name).exists()


def test_creating_an_existing_sandbox_returns_it_without_recloning(provider, source, new_name):
    name = new_name()
    first = provider.create(name=name, source=source)
    provider.run(name=name, argv=["sh", "-c", "echo mine > local.txt"])
    provider.stop(name=name)

    again = provider.create(name=name, source=source)

    assert again.details["reused"] is True and again.created_at == first.created_at
    assert provider.run(name=name, argv=["cat", "local.txt"]).stdout == "mine\n"


def test_concurrent_creates_of_one_name_make_one_sandbox(provider, source, new_name, sandbox_root):
    name = new_name()

    with ThreadPoolExecutor(max_workers=4) as pool:
        infos = list(pool.map(lambda _: provider.create(name=name, source=source), range(4)))

    assert sorted(info.details["reused"] for info in infos) == [False, True, True, True]
    assert len({info.created_at for info in infos}) == 1
    assert [p.name for p in sandbox_root.iterdir() if not p.name.startswith("_")] == [name]
    assert provider.run(name=name, argv=["git", "status", "--porcelain"]).stdout == ""


def test_invalid_names_are_refused(provider, source):
    for name in ("../evil", "a/b", "", "-x", "_bases", "x" * 80):
        with pytest.raises(ProviderError, match="Invalid sandbox name"):
            provider.create(name=name, source=source)


TOKEN = "ghp_" + "S3cr3tT0ken" * 3


def test_the_token_stays_out_of_the_workspace_and_the_sandbox(
    make_provider, source, new_name, sandbox_root
):
    provider = make_provider()
    name = new_name()

    provider.create(name=name, source=dataclasses.replace(source, token=TOKEN))

    with host_upper(sandbox_root, name) as upper:
        config = upper.joinpath(".git", "config").read_text()
    assert "url = " in config and TOKEN not in config and "extraheader" not in config.lower()
    env = provider.run(name=name, argv=["sh", "-c", "env; cat /proc/*/environ"]).stdout
    assert TOKEN not in env and "GIT_CONFIG" not in env
    for path in (sandbox_root / name).rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert TOKEN.encode() not in path.read_bytes(), path


class _RecordingHandler(BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_the_token_reaches_the_git_host_as_an_auth_header(make_provider, settings):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RecordingHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}"
    settings.SANDBOX_GIT_BASE_URL = base_url
    _RecordingHandler.seen = []
    try:
        with pytest.raises(ProviderError) as failure:
            make_provider().file_tree(
                source=GitSource(clone_url="https://github.com/acme/app.git", token=TOKEN)
            )
    finally:
        server.shutdown()
        server.server_close()

    expected = base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    assert _RecordingHandler.seen and set(_RecordingHandler.seen) == {f"Basic {expected}"}
    assert TOKEN not in str(failure.value) and expected not in str(failure.value)


def test_the_file_tree_comes_from_git(provider, source, origins):
    content = b"#!/bin/sh\necho run\n"

    entries = {entry.path: entry for entry in provider.file_tree(source=source)}

    assert set(entries) == {"README.md", "scripts", "scripts/run.sh", "src", "src/pkg",
                            "src/pkg/main.py"}  # fmt: skip
    run_sh = entries["scripts/run.sh"]
    blob_sha = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
    assert (run_sh.type, run_sh.sha, run_sh.size) == ("blob", blob_sha, len(content))
    assert entries["src"].type == "tree" and entries["src"].size is None

    origins.commit("acme", "app", {"later.txt": "x"})
    assert "later.txt" in {entry.path for entry in provider.file_tree(source=source)}
