"""The syscall filter every sandboxed process runs under, built with libseccomp.

Modelled on the default profile of Docker/containerd (moby/profiles, seccomp/default.json) for a
container without capabilities: the syscalls that profile refuses to such a container are
refused here with EPERM, and everything this host's libseccomp does not know (syscalls newer
than it) answers ENOSYS, so libc falls back to an older call and no new kernel interface is
reachable before someone has looked at it. Only the native architecture is allowed: a 32-bit
or x32 syscall kills the process (libseccomp's default for a foreign architecture), which closes
the classic "same call, other ABI number" bypass.

The compiled BPF is written once per SANDBOX_ROOT and handed to bubblewrap's `--seccomp FD`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from pathlib import Path

import pyseccomp as seccomp

# Refused with EPERM, grouped by what each group must never allow a sandbox to do.
DENIED = (
    # The kernel keyring is per host uid, not per namespace: a key added in one sandbox could
    # be read in another.
    "add_key",
    "keyctl",
    "request_key",
    # New namespaces (a nested user namespace hands out every capability inside it), joining
    # namespaces, and changing the mount tree or the root.
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # Kernel attack surface no workload needs: BPF programs, perf counters, file handles that
    # bypass path permissions, userfaultfd (a classic exploit primitive), io_uring.
    "bpf",
    "perf_event_open",
    "open_by_handle_at",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "fanotify_init",
    # The machine itself: modules, kexec, reboot, swap, clock, accounting, quotas, host names.
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "settimeofday",
    "clock_settime",
    "acct",
    "quotactl",
    "quotactl_fd",
    "sethostname",
    "setdomainname",
    "syslog",
    "vhangup",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    # Reaching into other processes beyond ptrace's own checks, and NUMA placement.
    "kcmp",
    "pidfd_getfd",
    "process_madvise",
    "get_mempolicy",
    "set_mempolicy",
    "set_mempolicy_home_node",
    "mbind",
    "migrate_pages",
    "move_pages",
    # Obsolete interfaces.
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "nfsservctl",
)

# clone() with any of these creates namespaces; plain fork/thread clones stay allowed.
_CLONE_NEW_FLAGS = (
    0x00000080,  # CLONE_NEWTIME
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
_ALL_NEW_FLAGS = sum(_CLONE_NEW_FLAGS)
_AF_VSOCK = 40  # talks to the hypervisor, not to anything in the sandbox's network namespace
_HIGHEST_SYSCALL = 1024


def build_filter() -> seccomp.SyscallFilter:
    """The filter: allow what libseccomp knows minus DENIED, ENOSYS for the unknown."""
    flt = seccomp.SyscallFilter(defaction=seccomp.ERRNO(errno.ENOSYS))
    arch = seccomp.system_arch()
    denied = set(DENIED) | {"clone", "clone3", "socket"}
    for number in range(_HIGHEST_SYSCALL):
        try:
            name = seccomp.resolve_syscall(arch, number)
        except ValueError:
            continue
        name = name.decode() if isinstance(name, bytes) else name
        if name not in denied:
            flt.add_rule(seccomp.ALLOW, name)
    for name in DENIED:
        flt.add_rule(seccomp.ERRNO(errno.EPERM), name)
    # clone3 (never allowed above) gets the default ENOSYS: it passes its flags in a struct a
    # filter cannot read, and ENOSYS makes libc fall back to clone, whose flags we can check.
    flt.add_rule(seccomp.ALLOW, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, _ALL_NEW_FLAGS, 0))
    for flag in _CLONE_NEW_FLAGS:
        flt.add_rule(
            seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag)
        )
    flt.add_rule(seccomp.ALLOW, "socket", seccomp.Arg(0, seccomp.NE, _AF_VSOCK))
    flt.add_rule(seccomp.ERRNO(errno.EPERM), "socket", seccomp.Arg(0, seccomp.EQ, _AF_VSOCK))
    return flt


def seccomp_bpf_path(*, root: Path) -> Path:
    """The compiled filter under `root` (root-only), written once and replaced atomically.

    The file name carries a hash of the deny list, so a changed list is never served stale.
    """
    digest = hashlib.sha256("\n".join(DENIED).encode()).hexdigest()[:12]
    path = root / f"_seccomp-{digest}.bpf"
    if path.exists():
        return path
    # A name of its own for each writer (mkstemp, 0600): threads of one process that found no
    # filter at once used to share `.seccomp-<pid>.tmp`, and the one renaming second failed.
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".seccomp-", suffix=".tmp")
    with open(fd, "wb") as f:
        build_filter().export_bpf(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def open_seccomp_bpf(*, root: Path) -> int:
    """A fresh read-only fd of the filter for one bubblewrap (which reads it to the end)."""
    return os.open(seccomp_bpf_path(root=root), os.O_RDONLY | os.O_CLOEXEC)
