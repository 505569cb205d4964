"""Attacks from inside a sandbox on the host and on other tenants: the kernel keyring, nested
user namespaces and the rest of the syscall filter's deny list, setuid files, and host paths
in what a sandbox can read.

On the code before issue 8, a key added in one sandbox was read in another, `unshare -Ur`
gave full capabilities, a workspace setuid file ran with the sandbox's uid for any host user,
and /proc/1/cmdline and mountinfo named SANDBOX_ROOT and the base's hash.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from django.core.files.storage import storages

from sandboxes_app.providers.base import GitSource
from tests.sandboxes_app.conftest import host_upper


def sh(provider, name: str, script: str):
    return provider.run(name=name, argv=["/bin/sh", "-c", script], timeout_s=20)


def perl(provider, name: str, code: str):
    return provider.run(name=name, argv=["/usr/bin/perl", "-e", code], timeout_s=20)


# x86_64 numbers; each call is made with arguments it would accept without the filter.
# Perl hands syscall() scalars by pointer; literals are read-only, so each is a variable.
_ADD_KEY = (
    'my ($t, $d, $p) = ("user", "recoup-key", "s3cret-%s");'
    'my $r = syscall(248, $t, $d, $p, length $p, -4); print "$r $!";'
)
_READ_KEY = (
    'my ($t, $d) = ("user", "recoup-key"); my $id = syscall(250, 10, -4, $t, $d, 0);'
    'my $buf = "\\0" x 64;'
    'my $n = syscall(250, 11, $id, $buf, 64); print $n > 0 ? substr($buf, 0, $n) : "none $!";'
)


def test_one_tenant_cannot_reach_another_through_the_kernel_keyring(provider, source, new_name):
    first, second = new_name(), new_name()
    provider.create(name=first, source=source)
    provider.create(name=second, source=source)

    added = perl(provider, first, _ADD_KEY % first[-6:])
    read = perl(provider, second, _READ_KEY)

    assert added.stdout.startswith("-1 "), added.stdout
    assert "s3cret" not in read.stdout


def test_a_nested_user_namespace_is_refused(provider, sandbox):
    result = sh(provider, sandbox, "unshare -Ur id -u; echo rc=$?")

    assert "rc=0" not in result.stdout and result.stdout.strip().splitlines()[0] != "0"
    assert "Operation not permitted" in result.stderr


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("unshare(CLONE_NEWUSER)", "syscall(272, 0x10000000)"),
        ("clone(CLONE_NEWNS)", "syscall(56, 0x20000 | 17, 0, 0, 0, 0)"),
        ("userfaultfd(UFFD_USER_MODE_ONLY)", "syscall(323, 1)"),
        ("perf_event_open", "syscall(298, $buf, 0, -1, -1, 0)"),
        ("bpf", "syscall(321, 0, $buf, 128)"),
        ("io_uring_setup", "syscall(425, 8, $buf)"),
        ("keyctl", "syscall(250, 0, -4, 0)"),
        ("mount", "syscall(165, $none, $tmp, $tmpfs, 0, 0)"),
        ("open_by_handle_at", "syscall(304, -100, $buf, 0)"),
        ("kexec_load", "syscall(246, 0, 0, 0, 0)"),
        ("setns", "syscall(308, 0, 0)"),
    ],
)
def test_the_syscall_filter_refuses(provider, sandbox, name, call):
    setup = 'my $buf = "\\0" x 128; my ($none, $tmp, $tmpfs) = ("none", "/tmp", "tmpfs");'
    result = perl(provider, sandbox, f'{setup} my $r = {call}; print "$r ", 0 + $!;')

    assert result.stdout == "-1 1", f"{name}: {result.stdout} {result.stderr}"


def test_every_command_and_the_init_run_under_the_filter(provider, sandbox):
    result = sh(
        provider,
        sandbox,
        "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status;"
        "for p in /proc/[0-9]*; do grep -q '^Seccomp:.2' $p/status 2>/dev/null"
        " || echo unfiltered $(cat $p/comm 2>/dev/null); done",
    )

    assert "Seccomp:\t2" in result.stdout and "NoNewPrivs:\t1" in result.stdout
    # bwrap's PID 1 reaper and the filter's loader are ours and run before the filter; every
    # other process of the sandbox, the init's `sleep` included, runs under it.
    unfiltered = [line for line in result.stdout.splitlines() if line.startswith("unfiltered")]
    assert set(unfiltered) <= {"unfiltered bwrap"}, result.stdout


def test_threads_and_forks_still_work_under_the_filter(provider, sandbox):
    result = sh(provider, sandbox, "(echo child) & wait; git --version >/dev/null && echo git")

    assert result.stdout == "child\ngit\n", result.stderr


def _run_as_host_user(path, *args: str) -> subprocess.CompletedProcess:
    """Run `path` as an unprivileged host user (nobody), as any local account could."""
    try:
        return subprocess.run(
            [path, *args],
            user=65534,
            group=65534,
            extra_groups=[],
            capture_output=True,
            text=True,
        )
    except PermissionError as exc:  # the exec itself was refused
        return subprocess.CompletedProcess([path], 126, "", str(exc))


def test_a_workspace_setuid_file_never_runs_with_raised_ids_on_the_host(
    provider, sandbox, sandbox_root
):
    made = sh(provider, sandbox, "cp /usr/bin/id suid-id && chmod 6755 suid-id && ls -l suid-id")
    assert made.stdout.startswith("-rwsr-sr-x"), made.stderr
    with host_upper(sandbox_root, sandbox) as upper:
        result = _run_as_host_user(str(upper / "suid-id"), "-u")

    assert result.stdout.strip() in ("", "65534"), result.stdout
    assert (sandbox_root.stat().st_mode & 0o777, sandbox_root.stat().st_uid) == (0o700, 0)


def test_a_setuid_file_stays_inert_after_a_snapshot_and_resume(
    provider, sandbox, sandbox_root, new_name, tmp_path
):
    sh(provider, sandbox, "cp /usr/bin/id suid-id && chmod 6755 suid-id")
    snap = provider.snapshot(name=sandbox, storage_key=f"sessions/{sandbox}.tar.zst")
    resumed = new_name()
    provider.resume(name=resumed, snapshot=snap)

    inside = sh(provider, resumed, "./suid-id -u")
    with host_upper(sandbox_root, resumed) as upper:
        outside = _run_as_host_user(str(upper / "suid-id"), "-u")

    assert inside.stdout == "1000\n", inside.stderr  # nosuid inside: the caller's own uid
    assert outside.stdout.strip() in ("", "65534"), outside.stdout


def test_the_workspace_is_mounted_nosuid_and_nodev(provider, sandbox):
    result = sh(provider, sandbox, "grep ' /workspace ' /proc/self/mountinfo")

    options = result.stdout.split()[5].split(",")
    assert "nosuid" in options and "nodev" in options, result.stdout


def test_no_host_path_or_base_hash_is_visible_inside(provider, source, new_name, sandbox_root):
    base = provider.build_base(source=source, storage_key="bases/acme-app.tar.zst")
    name = new_name()
    provider.create(name=name, source=source, base=base)

    seen = sh(
        provider,
        name,
        "cat /proc/self/mountinfo; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo;"
        " done; cat /proc/self/mounts",
    ).stdout

    assert str(sandbox_root) not in seen
    assert base.sha256 not in seen and base.sha256[:12] not in seen
    assert " overlay " in seen  # the workspace is there, under relative layer names


def _init_tree(pid: int) -> list[int]:
    """The init's host pid and every descendant's."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").iterdir():
            todo += [int(child) for child in (task / "children").read_text().split()]
    return found


def test_the_init_holds_no_handle_on_host_storage_or_namespaces(
    provider, source, new_name, sandbox_root
):
    base = provider.build_base(source=source, storage_key="bases/acme-app.tar.zst")
    name = new_name()
    provider.create(name=name, source=source, base=base)
    record = json.loads((sandbox_root / name / "init.json").read_text())

    held = {}
    for pid in _init_tree(record["pid"]):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith(("/", "user:", "mnt:")) and target not in ("/dev/null",):
                held[f"{pid}/{fd.name}"] = target

    assert held == {}


def test_no_mirror_address_is_left_in_a_fast_forwarded_workspace(
    provider, source, origins, new_name
):
    # As the service names it: the public URL, which host-side git maps to the mirror.
    source = GitSource(clone_url="https://github.com/acme/app.git")
    base = provider.build_base(source=source, storage_key="bases/acme-app.tar.zst")
    origins.commit("acme", "app", {"NEW.md": "after the base\n"})
    name = new_name()
    provider.create(name=name, source=source, base=base)

    mirror = origins.base_url.removeprefix("file://")
    found = sh(provider, name, f"cat NEW.md; grep -rl '{mirror}' .git || echo clean")

    assert found.stdout == "after the base\nclean\n", found.stderr


def test_snapshot_objects_and_the_sandbox_root_are_root_only(provider, sandbox, sandbox_root):
    snap = provider.snapshot(name=sandbox, storage_key=f"sessions/{sandbox}.tar.zst")
    stored = Path(storages["snapshots"].path(snap.storage_key))

    assert stored.stat().st_mode & 0o777 == 0o600
    assert stored.parent.stat().st_mode & 0o777 == 0o700
    assert sandbox_root.stat().st_mode & 0o777 == 0o700
