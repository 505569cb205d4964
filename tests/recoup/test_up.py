"""`manage.py up` as a newcomer meets it: the banner's commands work offline as printed
(`--demo-repo`), a restart keeps the demo key, a taken port or a dying child is one clear
error and a non-zero exit."""

import json
import os
import re
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.up import ROOT, Up, destroy_all_sandboxes, embedded_env
from tests.support.worker import wait_for

pytestmark = pytest.mark.slow


def try_it(banner: list[str]) -> str:
    """Run the banner's "try it" commands in bash, exactly as printed; their output."""
    start = next(i for i, line in enumerate(banner) if line.startswith("try it")) + 1
    script = "\n".join(line.removeprefix("  ") for line in banner[start:-1])
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (script, result.stdout, result.stderr)
    return result.stdout


def command_output(said: str) -> str:
    """The stdout of the command the last curl ran (its answer is the last line)."""
    return json.loads(said.splitlines()[-1])["stdout"]


def demo_keys(data: Path) -> int:
    with sqlite3.connect(data / "recoup.sqlite3") as db:
        return db.execute(
            "SELECT count(*) FROM accounts_apikey k JOIN accounts_account a ON a.id = k.account_id"
            " WHERE a.email = 'demo@recoup.local'"
        ).fetchone()[0]


def test_the_demo_repo_walkthrough_runs_offline_as_printed_and_a_restart_keeps_the_key(tmp_path):
    data = tmp_path / "data"
    # Nothing reachable: only --demo-repo's local origin can serve the clone.
    offline = {"SANDBOX_GIT_BASE_URL": "http://127.0.0.1:9"}
    try:
        first = Up(data, "--demo-repo", **offline)
        try:
            assert first.answered_at_banner
            printed = "\n".join(first.banner)
            assert f"API key: {first.key} (saved in {data / 'demo-api-key'})" in printed
            assert stat.S_IMODE((data / "demo-api-key").stat().st_mode) == 0o600
            said = try_it(first.banner)
            hello, commit = command_output(said).splitlines()
            assert hello == "hello from the sandbox, in /workspace"
            assert commit.endswith(" A demo repository for recoup")
        finally:
            assert first.stop().count("recoup_sk_") == 0
        assert first.process.returncode == 0

        second = Up(data, "--demo-repo", "--hibernate-on-exit", **offline)
        try:
            printed = "\n".join(second.banner)
            assert "recoup_sk_" not in printed
            assert f"API key: the one made at the first start, kept in {data}" in printed
            assert second.key == first.key and demo_keys(data) == 1
            again = try_it(second.banner)  # the same repository, made once
            assert command_output(again) == command_output(said)
        finally:
            assert "hibernated 2 sandbox(es)" in second.stop()
        assert second.process.returncode == 0
        assert [p for p in (data / "sandboxes").iterdir() if not p.name.startswith("_")] == []
    finally:
        destroy_all_sandboxes(data)


def readme_walkthrough(*, api: str, organization_id: str) -> str:
    """The README walkthrough's shell block, with this service's address and organization."""
    readme = (ROOT / "README.md").read_text()
    walkthrough = readme[readme.index("## Walkthrough") :]
    block = walkthrough[walkthrough.index("```sh\nexport API=") + len("```sh\n") :]
    block = block[: block.index("```")]
    assert "export API=http://127.0.0.1:8000\n" in block and "export ORG=...  " in block
    return block.replace("export API=http://127.0.0.1:8000", f"export API={api}").replace(
        "export ORG=...", f"export ORG={organization_id}"
    )


def test_the_readme_walkthrough_runs_offline_as_written(tmp_path):
    data = tmp_path / "data"
    try:
        up = Up(
            data, "--demo-repo", "--hibernate-on-exit", SANDBOX_GIT_BASE_URL="http://127.0.0.1:9"
        )
        try:
            (organization_id,) = re.findall(r"\(organizationId (\S+)\)", "\n".join(up.banner))
            script = readme_walkthrough(api=up.base, organization_id=organization_id)
            result = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script],
                cwd=ROOT,
                env=embedded_env(data),
                capture_output=True,
                text=True,
                timeout=300,
            )
            said = result.stdout
            assert result.returncode == 0 and result.stderr == "", (result.stderr, said)
            assert '"error"' not in said, said
            assert "A demo repository for recoup" in said  # the command's git log
            assert '"status":"connected"' in said  # the reconnect probe
            assert '"sandboxStatus":"stopped"' in said  # the one-shot's destroy
        finally:
            stopped = up.stop()
        # The first session, resumed after its hibernation, and the organization's.
        assert "hibernated 2 sandbox(es)" in stopped
    finally:
        destroy_all_sandboxes(data)


def test_a_taken_port_is_one_clear_error_and_a_nonzero_exit(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "manage.py", "up", "--port", str(port)],
            cwd=ROOT,
            env=embedded_env(tmp_path / "data"),
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert result.returncode != 0
    assert result.stderr.strip() == (
        f"CommandError: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert "recoup is up" not in result.stdout


def child_pids(pid: int) -> dict[int, str]:
    found = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
            )
            cmdline = (status.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip()) == pid:
            found[int(status.parent.name)] = cmdline
    return found


def test_a_child_that_dies_stops_the_others_and_exits_nonzero(tmp_path):
    data = tmp_path / "data"
    up = Up(data)
    children = child_pids(up.process.pid)
    (web,) = [pid for pid, cmdline in children.items() if "gunicorn" in cmdline]

    os.kill(web, signal.SIGKILL)
    up.process.communicate(timeout=120)

    assert up.process.returncode == 1
    assert "CommandError: web exited with code -9 (its error is above); stopped everything" in (
        up.log()
    )
    # Worker and beat went with it: nothing is left holding the broker or the sandboxes.
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), timeout=30)
