"""Every escape we know to try, tried from inside a real bubblewrap sandbox, and refused.

Each test first shows the thing it guards is really there on the host (a file, a listener,
another workspace), so a refusal inside means isolation, not absence.
"""

import os
import shutil
import socket
import socketserver
import threading
from pathlib import Path

import pytest
from django.conf import settings

from sandboxes_app.providers.base import ProviderError
from sandboxes_app.providers.local import LocalProvider
from tests.sandboxes_app.conftest import host_upper


@pytest.fixture
def sandbox(provider, source, new_name) -> str:
    name = new_name()
    provider.create(name=name, source=source)
    return name


def sh(provider: LocalProvider, name: str, script: str):
    return provider.run(name=name, argv=["sh", "-c", script], timeout_s=20)


def test_it_runs_commands_as_an_unprivileged_user_without_capabilities(provider, sandbox):
    result = sh(provider, sandbox, "id -u; id -g; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status")

    lines = result.stdout.split("\n")
    assert lines[0] == "1000" and lines[1] == "1000"
    assert all(line.split()[1] == "0000000000000000" for line in lines[2:5]), result.stdout


def test_commands_run_as_the_configured_ids_which_own_the_workspace(
    provider, source, new_name, sandbox_root, settings
):
    settings.SANDBOX_UID, settings.SANDBOX_GID = 4321, 4322
    name = new_name()
    provider.create(name=name, source=source)

    result = sh(provider, name, "id -u; id -g; id -un; touch made-inside")

    assert result.stdout.split() == ["4321", "4322", "sandbox"], result.stderr
    with host_upper(sandbox_root, name) as upper:
        owners = {(p.lstat().st_uid, p.lstat().st_gid) for p in [upper, *upper.rglob("*")]}
    assert owners == {(4321, 4322)}


def test_a_running_sandbox_keeps_its_ids_and_a_resume_takes_the_new_ones(
    provider, source, new_name, settings
):
    before = settings.SANDBOX_UID
    name = new_name()
    provider.create(name=name, source=source)
    assert sh(provider, name, "echo mine > notes.txt").exit_code == 0
    settings.SANDBOX_UID = settings.SANDBOX_GID = 4321

    assert sh(provider, name, "id -u").stdout.strip() == str(before)
    snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")
    provider.destroy(name=name)
    provider.resume(name=name, snapshot=snapshot)

    result = sh(provider, name, "id -u; cat notes.txt; echo more >> notes.txt && echo written")
    assert result.stdout.split() == ["4321", "mine", "written"], result.stderr


def test_a_base_built_under_other_ids_is_writable_by_the_current_ones(
    provider, source, new_name, settings
):
    base = provider.build_base(source=source, storage_key="bases/app.tar.zst")
    settings.SANDBOX_UID = settings.SANDBOX_GID = 4321
    name = new_name()
    provider.create(name=name, source=source, base=base)

    # README.md and src/pkg/ come from the base's (lower) layer: 0644 files, 0755 directories.
    result = sh(provider, name, "echo more >> README.md && mkdir src/pkg/new && git status -s")

    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == ["M", "README.md"]


def test_it_hides_host_secrets_and_root_home(provider, sandbox):
    assert Path("/etc/shadow").exists()

    shadow = provider.run(name=sandbox, argv=["cat", "/etc/shadow"])
    root_home = provider.run(name=sandbox, argv=["ls", "/root"])
    top = provider.run(name=sandbox, argv=["ls", "/"])

    assert shadow.exit_code != 0 and "root:" not in shadow.stdout
    assert root_home.exit_code != 0
    assert sorted(top.stdout.split()) == sorted(
        ["bin", "dev", "etc", "home", "lib", "lib64", "proc", "sbin", "tmp", "usr", "workspace"]
    )


def test_its_etc_is_minimal_and_names_the_sandbox_user(provider, sandbox):
    result = sh(provider, sandbox, "ls /etc; echo; cat /etc/passwd")

    listed, passwd = result.stdout.split("\n\n")
    assert "shadow" not in listed.split() and "gshadow" not in listed.split()
    assert len(listed.split()) < 20  # not the host's /etc wholesale
    assert "sandbox:x:1000:1000" in passwd
    assert os.path.exists("/etc/hostname") and "hostname" not in listed.split()


def test_it_cannot_see_the_data_dir_or_another_sandbox(provider, source, sandbox, new_name):
    other = new_name()
    provider.create(name=other, source=source)
    with host_upper(settings.SANDBOX_ROOT, other) as other_upper:
        (other_upper / "secret.txt").write_text("other sandbox's file")

        for path in (settings.DATA_DIR, settings.SANDBOX_ROOT, other_upper):
            assert provider.run(name=sandbox, argv=["ls", str(path)]).exit_code != 0, path
        read = provider.run(name=sandbox, argv=["cat", f"{other_upper}/secret.txt"])
        write = sh(provider, sandbox, f"echo pwned > {other_upper}/pwned.txt")
        search = sh(provider, sandbox, "find / -name secret.txt -not -path '/proc/*' 2>/dev/null")

        assert read.exit_code != 0 and "other sandbox's file" not in read.stdout
        assert write.exit_code != 0 and not (other_upper / "pwned.txt").exists()
    assert search.stdout == ""


def test_it_cannot_write_the_system_image(provider, sandbox):
    for script in ("touch /usr/bin/pwned", "echo x >> /etc/passwd", "mkdir /opt"):
        result = sh(provider, sandbox, script)
        assert result.exit_code != 0, script
        assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr
    assert not Path("/usr/bin/pwned").exists()


def test_it_has_its_own_hostname_and_process_table(provider, sandbox):
    result = sh(provider, sandbox, "hostname; ps -e -o pid= | wc -l; kill -0 1 && echo k")

    hostname, count, *_ = result.stdout.split()
    assert hostname == sandbox != socket.gethostname()
    # Its own init and sleeper, the shell, ps and wc: the host's hundreds are invisible.
    assert int(count) < 10
    assert f"{os.getpid()}" not in sh(provider, sandbox, "ls /proc").stdout.split()


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"host service\n")


@pytest.fixture
def host_listener() -> int:
    """A service on the host's 127.0.0.1, like PostgreSQL or Redis."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_it_cannot_reach_host_loopback_services(provider, sandbox, host_listener):
    with socket.create_connection(("127.0.0.1", host_listener), timeout=2) as conn:
        assert conn.recv(100) == b"host service\n"

    for port in (host_listener, 5432, 6379):
        script = f"exec 3<>/dev/tcp/127.0.0.1/{port} && cat <&3"
        result = provider.run(name=sandbox, argv=["bash", "-c", script], timeout_s=5)
        assert result.exit_code != 0, port
        assert "host service" not in result.stdout
        assert not result.timed_out


def test_it_has_no_network_interface_but_loopback(provider, sandbox):
    result = sh(provider, sandbox, "cat /proc/net/dev | tail -n +3 | cut -d: -f1")

    assert result.stdout.split() == ["lo"]


def test_setuid_binaries_do_not_elevate(provider, sandbox):
    assert os.stat("/usr/bin/su").st_mode & 0o4000

    result = sh(
        provider, sandbox, "su -c id root </dev/null; cat /proc/self/status | grep NoNewPrivs"
    )

    assert "uid=0" not in result.stdout
    assert "NoNewPrivs:\t1" in result.stdout


def test_it_refuses_to_start_without_bubblewrap(sandbox_root, monkeypatch, tmp_path):
    # The provider looks for its tools in its own fixed PATH only; here, one without bwrap.
    monkeypatch.setattr("sandboxes_app.providers.local_runtime.HOST_PATH", str(tmp_path))
    monkeypatch.setattr("sandboxes_app.providers.local_runtime._ISOLATION_CHECKED", set())

    with pytest.raises(ProviderError, match="apt-get install bubblewrap"):
        LocalProvider.from_settings()


def _cmdline(path: Path) -> list[bytes]:
    try:
        return path.read_bytes().split(b"\0")
    except OSError:  # the process exited meanwhile
        return []


@pytest.mark.skipif(shutil.which("slirp4netns") is None, reason="apt-get install slirp4netns")
def test_with_the_network_on_host_loopback_stays_unreachable(
    make_provider, settings, source, new_name, host_listener
):
    settings.SANDBOX_NETWORK = "on"
    provider = make_provider()
    name = new_name()
    provider.create(name=name, source=source)

    interfaces = sh(provider, name, "tail -n +3 /proc/net/dev | cut -d: -f1").stdout.split()
    assert interfaces == ["lo", "tap0"]
    script = f"exec 3<>/dev/tcp/127.0.0.1/{host_listener} && cat <&3"
    result = provider.run(name=name, argv=["bash", "-c", script], timeout_s=5)
    assert result.exit_code != 0 and "host service" not in result.stdout
    # slirp4netns's gateway would forward to the host's loopback unless told not to. The check
    # reads its command line: this workplace sends no traffic to private-range addresses.
    slirps = [
        argv
        for argv in map(_cmdline, Path("/proc").glob("[0-9]*/cmdline"))
        if argv and argv[0].endswith(b"slirp4netns")
    ]
    assert slirps and all(b"--disable-host-loopback" in argv for argv in slirps)

    provider.stop(name=name)
    assert not any(
        f"{name}" in p.read_text(errors="replace")
        for p in Path("/proc").glob("[0-9]*/cmdline")
        if p.exists() and "slirp4netns" in p.read_text(errors="replace")
    )


def test_the_no_isolation_escape_warns_at_every_start(
    make_provider, settings, source, new_name, caplog
):
    settings.SANDBOX_ISOLATION = "none"
    provider = make_provider()
    name = new_name()

    with caplog.at_level("WARNING", logger="sandboxes_app.providers.local"):
        provider.create(name=name, source=source)
        provider.stop(name=name)
        provider.create(name=name, source=source)

    warnings = [r for r in caplog.records if "WITHOUT isolation" in r.getMessage()]
    assert len(warnings) == 2
    assert provider.run(name=name, argv=["cat", "README.md"]).stdout == "# app\n"
