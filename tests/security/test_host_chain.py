"""Attacks on the host-side chain that enters a sandbox: nothing a client sends (env, cwd,
args) may reach a process that runs on the host, let alone one that runs as root.

On the code before issue 8, the client's PATH chose the host's `sh` and `LD_PRELOAD` loaded a
workspace library into root processes: each test here created its marker then.
"""

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes_app.providers.base import SandboxNotRunning
from sandboxes_app.providers.local_commands import init_handles
from sandboxes_app.providers.local_layout import process_start_time
from tests.sandboxes_app.conftest import host_upper

# The programs of the chain, past and present; a fake of each one waits in the workspace.
CHAIN = ("sh", "dash", "bash", "prlimit", "nsenter", "setpriv", "bwrap", "env", "unshare")


def _plant_fakes(directory: Path, marker: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in CHAIN:
        fake = directory / name
        fake.write_text(f'#!/bin/sh\ntouch {marker}\nexec /usr/bin/{name} "$@"\n')
        fake.chmod(0o755)


def test_a_client_path_never_picks_a_host_program(provider, sandbox, sandbox_root, host_marker):
    with host_upper(sandbox_root, sandbox) as upper:
        evil = upper / "evil"
        _plant_fakes(evil, host_marker)
        # The attacker names the workspace's host path (learnable from inside on the old code).
        result = provider.run(
            name=sandbox, argv=["echo", "ran"], env={"PATH": f"{evil}:/usr/bin:/bin"}, timeout_s=20
        )

    assert result.stdout == "ran\n", result.stderr
    assert not host_marker.exists()


def test_the_client_path_still_applies_inside_the_sandbox(provider, sandbox, sandbox_root):
    with host_upper(sandbox_root, sandbox) as upper:
        tools = upper / "tools"
        tools.mkdir()
        (tools / "mytool").write_text('#!/bin/sh\necho "mytool as $(id -u) in $PWD"\n')
        (tools / "mytool").chmod(0o755)
        os.chown(tools / "mytool", 1000, 1000)

    result = provider.run(
        name=sandbox,
        argv=["mytool"],
        env={"PATH": "/workspace/tools:/usr/bin:/bin"},
        cwd="tools",
        timeout_s=20,
    )

    assert result.stdout == "mytool as 1000 in /workspace/tools\n", result.stderr


@pytest.fixture(scope="module")
def evil_library(tmp_path_factory) -> bytes:
    """A shared library whose constructor creates the file named by RECOUP_MARKER_PATH
    (baked in at build time), and which also serves as an audit library."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "the attack tests need a C compiler (scripts/bootstrap installs gcc)"
    src = tmp_path_factory.mktemp("evil") / "evil.c"
    src.write_text(
        "#include <fcntl.h>\n#include <unistd.h>\n"
        "unsigned int la_version(unsigned int v) { return v; }\n"
        "__attribute__((constructor)) static void pwn(void) {\n"
        "  int fd = open(MARKER, O_CREAT | O_WRONLY, 0644); if (fd >= 0) close(fd); }\n"
    )
    return src.read_bytes()


def _build_library(source: bytes, *, marker: Path, dest: Path) -> None:
    src = dest.with_suffix(".c")
    src.write_bytes(source)
    subprocess.run(
        ["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(dest), str(src)],
        check=True,
        capture_output=True,
    )


@pytest.mark.parametrize("variable", ["LD_PRELOAD", "LD_AUDIT"])
def test_a_workspace_library_is_never_loaded_on_the_host(
    provider, sandbox, sandbox_root, host_marker, evil_library, variable
):
    with host_upper(sandbox_root, sandbox) as upper:
        library = upper / "evil.so"
        _build_library(evil_library, marker=host_marker, dest=library)

        result = provider.run(
            name=sandbox, argv=["echo", "ran"], env={variable: str(library)}, timeout_s=20
        )

    assert "ran" in result.stdout, result.stderr
    assert not host_marker.exists()


def _host_processes_holding(needle: bytes) -> list[tuple[int, int, str]]:
    """(pid, uid, where) of processes in the host's PID namespace whose environment or
    command line holds `needle`. A sandbox's own processes live in another PID namespace."""
    host_pidns = os.readlink("/proc/self/ns/pid")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.readlink(proc / "ns" / "pid") != host_pidns:
                continue
            uid = proc.stat().st_uid
            for where in ("environ", "cmdline"):
                if needle in (proc / where).read_bytes():
                    found.append((int(proc.name), uid, where))
        except OSError:
            continue
    return found


# Every variable the dynamic loader, libc or a shell honours that we know of.
HONOURED = [
    "PATH",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "LD_DEBUG_OUTPUT",
    "GCONV_PATH",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "MALLOC_CHECK_",
    "GLIBC_TUNABLES",
    "BASH_ENV",
    "ENV",
    "IFS",
    "PS4",
    "SHELLOPTS",
    "CDPATH",
    "TMPDIR",
]


@contextlib.contextmanager
def host_watch(needle: bytes) -> Iterator[list]:
    """Every 50 ms while the block runs, what `_host_processes_holding(needle)` finds, into the
    list it yields."""
    seen: list = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.extend(_host_processes_holding(needle))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


def test_no_host_process_ever_sees_the_client_env_or_args(provider, sandbox):
    """While a command runs, no process of the host (nsenter, prlimit, ...) holds any client
    variable or argument; only the sandbox's own processes do."""
    canary = b"recoup-canary-9f1c"
    env = {name: f"/nonexistent/{canary.decode()}" for name in HONOURED}
    env["SHELLOPTS"] = "xtrace"  # with PS4, runs $(...) in bash on start
    env["PS4"] = f"$(touch /tmp/{canary.decode()})"
    with host_watch(canary) as seen:
        result = provider.run(
            name=sandbox,
            argv=["/bin/sh", "-c", "sleep 1.5; echo done", canary.decode()],
            env=env,
            timeout_s=20,
        )

    assert result.stdout == "done\n", result.stderr
    assert seen == []


def test_the_client_env_reaches_the_command_unchanged(provider, sandbox):
    value = 'it\'s "quoted" $(not run) `nor this` \\ \n and a newline ü'
    result = provider.run(
        name=sandbox,
        argv=["/usr/bin/printenv", "TRICKY", "HOME", "CDPATH"],
        env={"TRICKY": value, "CDPATH": "/tmp"},
        timeout_s=20,
    )

    assert result.stdout == f"{value}\n/home/sandbox\n/tmp\n", result.stderr


def test_a_reused_init_pid_never_takes_a_command_elsewhere(provider, sandbox, sandbox_root):
    """The command enters the init by fds of its namespaces, checked to be the init's after
    they were opened: a host process that got the init's pid number is refused."""
    record = json.loads((sandbox_root / sandbox / "init.json").read_text())
    time.sleep(0.05)  # start times count 10 ms ticks: the stranger must not share the init's
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        assert process_start_time(stranger.pid) != record["start_time"]
        reused = {**record, "pid": stranger.pid}  # its number, the init's start time

        with pytest.raises(SandboxNotRunning):
            with init_handles(reused):
                pass
        with init_handles(record) as handles:
            assert os.readlink(f"/proc/self/fd/{handles['mount']}") == os.readlink(
                f"/proc/{record['pid']}/ns/mnt"
            )
    finally:
        stranger.kill()
        stranger.wait()
