"""Command semantics in a real sandbox: exit codes, argv without a shell, a clean environment,
cwd confinement, timeouts that kill whole trees, output caps, background processes."""

import threading
import time
import uuid
from pathlib import Path

import pytest

from sandboxes_app.providers.base import (
    ProviderError,
    SandboxNotFound,
    SandboxNotRunning,
    SandboxStatus,
)
from tests.sandboxes_app.conftest import host_upper


@pytest.fixture
def sandbox(provider, source, new_name) -> str:
    name = new_name()
    provider.create(name=name, source=source)
    return name


def host_processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


def test_it_reports_exit_codes(provider, sandbox):
    assert provider.run(name=sandbox, argv=["true"]).exit_code == 0
    assert provider.run(name=sandbox, argv=["sh", "-c", "exit 7"]).exit_code == 7
    missing = provider.run(name=sandbox, argv=["no-such-command"])
    assert missing.exit_code == 127 and "not found" in missing.stderr
    killed = provider.run(name=sandbox, argv=["sh", "-c", "kill -9 $$"])
    assert killed.exit_code == 137 and not killed.timed_out


def test_it_passes_argv_without_a_shell(provider, sandbox):
    result = provider.run(name=sandbox, argv=["echo", "$HOME; id", "`id`", "-n"])

    assert result.stdout == "$HOME; id `id` -n\n"


def test_it_captures_stdout_and_stderr_separately_as_utf8(provider, sandbox):
    script = "printf 'h\\303\\251llo\\n'; printf 'bad \\377 byte' >&2"
    result = provider.run(name=sandbox, argv=["sh", "-c", script])

    assert result.stdout == "héllo\n"
    assert result.stderr == "bad \ufffd byte"
    assert result.duration_ms >= 0 and not result.truncated


def test_the_host_environment_never_leaks_in(provider, sandbox, monkeypatch):
    monkeypatch.setenv("RECOUP_HOST_SECRET", "s3cret")

    result = provider.run(name=sandbox, argv=["env"], env={"MY_VAR": "mine", "LANG": "C"})

    env = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert "RECOUP_HOST_SECRET" not in env and "s3cret" not in result.stdout
    assert env["MY_VAR"] == "mine" and env["LANG"] == "C"
    assert env["HOME"] == "/home/sandbox" and "/usr/bin" in env["PATH"]
    assert set(env) <= {"MY_VAR", "LANG", "HOME", "PATH", "USER", "PWD", "SHLVL", "_", "OLDPWD"}


def test_it_refuses_bad_environment_names(provider, sandbox):
    with pytest.raises(ProviderError):
        provider.run(name=sandbox, argv=["true"], env={"A=B": "x"})


def test_cwd_is_relative_to_the_workspace(provider, sandbox):
    assert provider.run(name=sandbox, argv=["pwd"]).stdout == "/workspace\n"
    assert provider.run(name=sandbox, argv=["pwd"], cwd="src/pkg").stdout == "/workspace/src/pkg\n"
    assert provider.run(name=sandbox, argv=["pwd"], cwd="/workspace/src").stdout == (
        "/workspace/src\n"
    )
    assert provider.run(name=sandbox, argv=["pwd"], cwd="missing").exit_code != 0


@pytest.mark.parametrize(
    "cwd", ["..", "../etc", "/etc", "/", "/workspace/../etc", "src/../../..", "/workspacex", "//"]
)
def test_cwd_outside_the_workspace_is_refused_before_anything_runs(
    provider, sandbox, sandbox_root, cwd
):
    with pytest.raises(ProviderError, match="outside /workspace"):
        provider.run(name=sandbox, argv=["touch", "/workspace/ran"], cwd=cwd)

    with host_upper(sandbox_root, sandbox) as upper:
        assert not (upper / "ran").exists()


def test_a_timeout_kills_the_whole_tree_grandchildren_included(provider, sandbox):
    marker = f"{uuid.uuid4().int % 10**9 + 10**9}"
    # The grandchild detaches into its own session, out of the command's process group.
    script = f"setsid sh -c 'exec sleep {marker}' & sleep {marker}"

    result = provider.run(name=sandbox, argv=["sh", "-c", script], timeout_s=1)

    assert result.timed_out and result.exit_code is None
    assert 900 <= result.duration_ms < 5000
    assert host_processes_with(f"sleep\0{marker}") == []
    assert provider.run(name=sandbox, argv=["pgrep", "-f", marker]).exit_code == 1


def test_timeouts_are_clamped_to_the_maximum(make_provider, settings, source, new_name):
    settings.SANDBOX_COMMAND_MAX_TIMEOUT = 1
    provider = make_provider()
    name = new_name()
    provider.create(name=name, source=source)

    result = provider.run(name=name, argv=["sleep", "30"], timeout_s=3600)

    assert result.timed_out and result.duration_ms < 5000


def test_output_past_the_cap_is_dropped_and_flagged(make_provider, settings, source, new_name):
    settings.SANDBOX_OUTPUT_CAP = 4096
    provider = make_provider()
    name = new_name()
    provider.create(name=name, source=source)

    # 8 MiB on each stream: far more than a pipe buffer, so a reader that stopped reading at
    # the cap would leave the command blocked until the timeout.
    script = "head -c 8388608 /dev/zero | tr '\\0' a; head -c 8388608 /dev/zero | tr '\\0' b >&2"
    result = provider.run(name=name, argv=["sh", "-c", script], timeout_s=20)

    assert result.exit_code == 0 and not result.timed_out
    assert result.truncated
    assert result.stdout == "a" * 4096 and result.stderr == "b" * 4096
    small = provider.run(name=name, argv=["echo", "ok"])
    assert small.stdout == "ok\n" and not small.truncated


def test_background_processes_outlive_their_command_and_die_on_stop(provider, sandbox):
    marker = f"{uuid.uuid4().int % 10**9 + 10**9}"

    started = provider.run(name=sandbox, argv=["sh", "-c", f"sleep {marker} & echo started"])

    assert started.stdout == "started\n" and started.duration_ms < 2000
    later = provider.run(name=sandbox, argv=["pgrep", "-f", f"sleep {marker}"])
    assert later.exit_code == 0
    assert len(host_processes_with(f"sleep\0{marker}")) == 1

    provider.stop(name=sandbox)

    assert host_processes_with(f"sleep\0{marker}") == []
    assert provider.status(name=sandbox) == SandboxStatus.STOPPED


def test_a_dev_server_keeps_serving_between_commands(provider, sandbox):
    server = "cd /tmp && echo served > index.html && nohup python3 -m http.server 8000 >log 2>&1 &"
    provider.run(name=sandbox, argv=["sh", "-c", server])

    fetch = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/').read().decode())"
    for _ in range(50):
        result = provider.run(name=sandbox, argv=["python3", "-c", fetch])
        if result.exit_code == 0:
            break
        time.sleep(0.1)

    assert result.stdout == "served\n\n"


def test_it_counts_commands_in_flight(provider, sandbox, sandbox_root):
    assert provider.running_commands(name=sandbox) == 0
    # A marker left by a process that died mid-run holds no lock and is not counted.
    stale = sandbox_root / sandbox / "runs" / "dead.run"
    stale.write_text("")

    thread = threading.Thread(
        target=provider.run, kwargs={"name": sandbox, "argv": ["sleep", "1.5"]}
    )
    thread.start()
    deadline = time.monotonic() + 5
    while provider.running_commands(name=sandbox) != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    in_flight = provider.running_commands(name=sandbox)
    thread.join()

    assert in_flight == 1
    assert provider.running_commands(name=sandbox) == 0
    assert not stale.exists()


def test_probe_answers_for_a_running_sandbox_and_never_starts_a_stopped_one(provider, sandbox):
    assert provider.probe(name=sandbox) is True

    provider.stop(name=sandbox)

    assert provider.probe(name=sandbox) is False
    assert provider.status(name=sandbox) == SandboxStatus.STOPPED
    assert provider.probe(name="t-never-created") is False


def test_run_tells_stopped_from_absent(provider, sandbox):
    provider.stop(name=sandbox)

    with pytest.raises(SandboxNotRunning):
        provider.run(name=sandbox, argv=["true"])
    with pytest.raises(SandboxNotFound):
        provider.run(name="t-never-created", argv=["true"])


def test_a_file_size_limit_applies(make_provider, settings, source, new_name):
    settings.SANDBOX_MAX_FILE_MB = 1
    provider = make_provider()
    name = new_name()
    provider.create(name=name, source=source)

    result = provider.run(name=name, argv=["sh", "-c", "head -c 2000000 /dev/zero > big"])

    assert result.exit_code != 0
    size = provider.run(name=name, argv=["stat", "-c", "%s", "big"]).stdout.strip()
    assert int(size) <= 1024 * 1024


def test_a_process_limit_applies(make_provider, settings, source, new_name):
    settings.SANDBOX_MAX_PROCESSES = 20
    provider = make_provider()
    name = new_name()
    provider.create(name=name, source=source)

    script = "for i in $(seq 40); do sleep 30 & done; wait"
    result = provider.run(name=name, argv=["sh", "-c", script], timeout_s=3)

    assert "fork" in result.stderr.lower() or "resource" in result.stderr.lower(), result


def test_a_memory_limit_applies(make_provider, settings, source, new_name):
    settings.SANDBOX_MEMORY_MB = 64
    provider = make_provider()
    name = new_name()
    provider.create(name=name, source=source)

    # tail must hold a newline-free stream whole: 256 MB of it cannot fit in 64 MB.
    hog = provider.run(
        name=name, argv=["sh", "-c", "head -c 256M /dev/zero | tail -n 1 | wc -c"], timeout_s=30
    )
    small = provider.run(
        name=name, argv=["sh", "-c", "head -c 16M /dev/zero | tail -n 1 | wc -c"], timeout_s=30
    )

    assert hog.stdout.strip() != str(256 * 1024 * 1024), hog
    assert small.stdout.strip() == str(16 * 1024 * 1024), small


def test_a_cpu_time_limit_applies(make_provider, settings, source, new_name):
    settings.SANDBOX_CPU_SECONDS = 1
    provider = make_provider()
    name = new_name()
    provider.create(name=name, source=source)

    spin = provider.run(name=name, argv=["sh", "-c", "while :; do :; done"], timeout_s=20)

    # The kernel stops it after about a second of CPU (SIGXCPU or SIGKILL), long before
    # the command's own 20 s timeout.
    assert not spin.timed_out and spin.exit_code != 0, spin
    assert spin.duration_ms < 10_000, spin


@pytest.mark.parametrize("timeout_s", [0.001, 0.2])
def test_a_timeout_kills_the_whole_tree_promptly_even_before_the_command_started(
    provider, sandbox, timeout_s
):
    started = time.monotonic()
    result = provider.run(
        name=sandbox, argv=["sh", "-c", "sleep 30 & sleep 30 & wait"], timeout_s=timeout_s
    )
    elapsed = time.monotonic() - started

    assert result.timed_out and result.exit_code is None
    # Measured at about 20 ms past the deadline; the bound leaves room for a loaded machine
    # (the code before this bound took 2 s for a 1 ms timeout).
    assert elapsed < timeout_s + 0.5, elapsed
    left = provider.run(name=sandbox, argv=["sh", "-c", "ps -eo comm= | grep -cx sleep"])
    assert left.stdout.strip() == "1"  # only the init's own sleep


def test_all_processes_of_a_sandbox_share_its_cpu_budget(make_provider, settings, source, new_name):
    settings.SANDBOX_CPUS = 0.5
    provider = make_provider()
    name = new_name()
    provider.create(name=name, source=source)
    cgroups = provider._cgroups(name)
    before = cgroups.cpu_usage_ns()

    started = time.monotonic()
    # Two spinners (plus a short-process loop, which RLIMIT_CPU alone never catches) for 2 s.
    provider.run(
        name=name,
        argv=[
            "sh",
            "-c",
            "for i in 1 2; do (while :; do :; done) & done;"
            " (while :; do /bin/true; done) & sleep 2; kill $(jobs -p)",
        ],
        timeout_s=20,
    )
    wall = time.monotonic() - started
    used = (cgroups.cpu_usage_ns() - before) / 1e9

    # Unlimited, this takes up to both cores for 2 s; the budget is half a core.
    assert used <= 0.5 * wall * 1.2 + 0.1, (used, wall)
