"""Every running sandbox has a host identity of its own, from the configured pool.

On the code before issue 8, every sandbox's commands ran as host uid 1000 (SANDBOX_UID), a
real account on many hosts, with no user namespace: these tests failed there.
"""

import threading
import time
from pathlib import Path

import pytest
from django.conf import settings

from sandboxes_app.providers.base import ProviderError
from sandboxes_app.providers.local import LocalProvider
from sandboxes_app.providers.local_identity import RANGE
from tests.sandboxes_app.conftest import host_upper


def sh(provider, name: str, script: str):
    return provider.run(name=name, argv=["/bin/sh", "-c", script], timeout_s=20)


def _host_ids_of(marker: str) -> tuple[int, int] | None:
    """(uid, gid) on the host of the process whose command line holds `marker`."""
    for proc in Path("/proc").iterdir():
        try:
            if marker.encode() in (proc / "cmdline").read_bytes():
                status = (proc / "status").read_text().splitlines()
                uid = next(line for line in status if line.startswith("Uid:")).split()[1]
                gid = next(line for line in status if line.startswith("Gid:")).split()[1]
                return int(uid), int(gid)
        except (OSError, StopIteration):
            continue
    return None


def _host_ids_while_running(provider, name: str, marker: str) -> tuple[int, int] | None:
    found: list = []
    runner = threading.Thread(
        target=provider.run, kwargs={"name": name, "argv": ["sleep", marker], "timeout_s": 20}
    )
    runner.start()
    deadline = time.monotonic() + 10
    while not found and time.monotonic() < deadline:
        ids = _host_ids_of(f"sleep\0{marker}")
        if ids:
            found.append(ids)
        time.sleep(0.02)
    runner.join()
    return found[0] if found else None


def test_two_sandboxes_run_as_different_host_ids_from_the_pool(provider, source, new_name):
    first, second = new_name(), new_name()
    provider.create(name=first, source=source)
    provider.create(name=second, source=source)

    inside = [
        sh(provider, name, "id -u; id -un; cat /proc/self/uid_map") for name in (first, second)
    ]
    hosts = [
        _host_ids_while_running(provider, name, marker)
        for name, marker in ((first, "1.5001"), (second, "1.5002"))
    ]

    start = settings.SANDBOX_ID_POOL_START
    end = start + settings.SANDBOX_ID_POOL_SLOTS * RANGE
    bases = []
    for result, host in zip(inside, hosts, strict=True):
        uid, name, mapping = result.stdout.splitlines()
        assert (uid, name) == ("1000", "sandbox"), result.stderr
        inside_first, host_base, count = map(int, mapping.split())
        assert (inside_first, count) == (0, RANGE) and start <= host_base < end
        assert host == (host_base + 1000, host_base + 1000)
        bases.append(host_base)
    assert bases[0] != bases[1]


def test_a_resume_into_another_range_keeps_files_and_their_owner(
    provider, source, new_name, sandbox_root
):
    name = new_name()
    provider.create(name=name, source=source)
    sh(provider, name, "echo mine > made.txt && mkdir -p d && echo deep > d/f")
    snap = provider.snapshot(name=name, storage_key=f"sessions/{name}.tar.zst")
    before = sh(provider, name, "cat /proc/self/uid_map").stdout.split()[1]
    provider.destroy(name=name)
    holder = new_name()  # takes the freed range, so the resume lands in another one
    provider.create(name=holder, source=source)
    resumed = new_name()
    provider.resume(name=resumed, snapshot=snap)

    result = sh(provider, resumed, "cat made.txt d/f; stat -c '%u %U' made.txt d/f")
    after = sh(provider, resumed, "cat /proc/self/uid_map").stdout.split()[1]

    assert after != before
    assert result.stdout == "mine\ndeep\n1000 sandbox\n1000 sandbox\n", result.stderr
    with host_upper(sandbox_root, resumed) as upper:
        on_disk = (upper / "made.txt").stat()
    assert (on_disk.st_uid, on_disk.st_gid) == (1000, 1000)


def test_a_base_layer_is_writable_by_each_sandbox_on_it(provider, source, new_name):
    base = provider.build_base(source=source, storage_key="bases/acme-app.tar.zst")
    first, second = new_name(), new_name()
    provider.create(name=first, source=source, base=base)
    provider.create(name=second, source=source, base=base)

    wrote = sh(provider, first, "echo first >> README.md && cat README.md")
    other = sh(provider, second, "cat README.md; stat -c %U README.md")

    assert wrote.stdout == "# app\nfirst\n", wrote.stderr
    assert other.stdout == "# app\nsandbox\n", other.stderr


def test_a_stopped_sandbox_gives_its_range_back(make_provider, source, new_name, settings):
    settings.SANDBOX_ID_POOL_SLOTS = 2
    provider = make_provider()
    first, second, third = new_name(), new_name(), new_name()
    provider.create(name=first, source=source)
    provider.create(name=second, source=source)

    with pytest.raises(ProviderError, match="SANDBOX_ID_POOL_SLOTS"):
        provider.create(name=third, source=source)
    provider.stop(name=first)
    provider.create(name=third, source=source)

    assert sh(provider, third, "id -un").stdout == "sandbox\n"


def test_a_pool_overlapping_a_host_account_refuses_to_start(
    sandbox_root, monkeypatch, settings, tmp_path
):
    # An account table like the host's, plus one account inside the configured pool.
    passwd = tmp_path / "passwd"
    inside_pool = settings.SANDBOX_ID_POOL_START + 5 * RANGE + 7
    passwd.write_text(
        Path("/etc/passwd").read_text() + f"intruder:x:{inside_pool}:100::/home/i:/bin/sh\n"
    )
    monkeypatch.setattr("sandboxes_app.providers.local_identity.ACCOUNT_TABLES", (str(passwd),))
    monkeypatch.setattr("sandboxes_app.providers.local_runtime._ISOLATION_CHECKED", set())

    with pytest.raises(
        ProviderError, match=f"intruder \\({inside_pool}\\) inside the sandbox id pool"
    ):
        LocalProvider.from_settings()
