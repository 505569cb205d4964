"""Attacks on a sandbox host's internal endpoint, as someone on the hosts' network would try
them: it runs commands as the host's root-held sandbox machinery, so only a call signed by one
of our own processes, recently, over exactly that body, for an interactive method, may pass."""

import http.client
import json
import time
import uuid
from urllib.parse import urlsplit

import pytest
import requests

from recoup.redis_clients import redis_client
from sandboxes_app.hosts.auth import HEADER, host_secret, sign
from sandboxes_app.hosts.dispatch import LIFECYCLE_METHODS, host_dispatch
from sandboxes_app.hosts.services import reply_key
from sandboxes_app.hosts.wire import decode, encode
from sandboxes_app.models import SandboxHost, session_sandbox_name
from sandboxes_app.providers.base import CommandResult, SandboxStatus
from sandboxes_app.tasks import host_call
from tests.support.api import new_session, sh, start_sandbox

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _run_body(name: str, marker: str) -> bytes:
    argv = ["sh", "-c", f"echo pwned > {marker}"]
    return json.dumps(
        {"method": "run", "kwargs": {"name": name, "argv": argv, "timeout_s": 10}}
    ).encode()


def _post(address: str, body: bytes, signature: str | None) -> requests.Response:
    headers = {HEADER: signature} if signature is not None else {}
    return requests.post(f"{address}/call", data=body, headers=headers, timeout=10)


def test_unsigned_forged_stale_and_tampered_calls_are_refused_and_run_nothing(
    pool, owner, repo_url
):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    name = session_sandbox_name(session_id)
    address = SandboxHost.objects.get(placements__sandbox_name=name).address
    secret = host_secret()
    body = _run_body(name, "pwned.txt")
    attempts = {
        "unsigned": None,
        "garbage": "t=1,s=00",
        "other secret": sign(secret=b"guessed", body=body),
        "stale (replayed a minute later)": sign(secret=secret, body=body, now=time.time() - 60),
        "signed for another body": sign(secret=secret, body=_run_body(name, "other.txt")),
    }
    for label, signature in attempts.items():
        assert _post(address, body, signature).status_code == 403, label
    assert sh(owner, session_id, "test -e pwned.txt")["exitCode"] == 1

    # The same call, signed as our processes sign it, does run: the refusals above were real.
    assert _post(address, body, sign(secret=secret, body=body)).status_code == 200
    assert sh(owner, session_id, "cat pwned.txt")["stdout"] == "pwned\n"


def test_a_signed_call_reaches_only_the_interactive_methods(pool, owner, repo_url):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    name = session_sandbox_name(session_id)
    host = SandboxHost.objects.get(placements__sandbox_name=name)
    secret = host_secret()
    for method in ["destroy", "stop", "snapshot", "__init__", "_run", "root", "file_tree"]:
        body = json.dumps({"method": method, "kwargs": {"name": name}}).encode()
        reply = _post(host.address, body, sign(secret=secret, body=body))
        assert reply.status_code == 200
        assert reply.json()["error"]["message"] == f"{method!r} is not a host call", method
    assert sh(owner, session_id, "cat README.md")["stdout"] == "# app\n"  # still there

    # A body announced far past the cap is refused before a byte of it is read.
    parsed = urlsplit(host.address)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    connection.putrequest("POST", "/call")
    connection.putheader("Content-Length", str(64 * 1024 * 1024))
    connection.endheaders()
    assert connection.getresponse().status == 413
    connection.close()


def test_the_lifecycle_door_serves_only_lifecycle_methods(pool, owner, repo_url, settings):
    """The host's Celery queue, as anyone who can reach the broker would use it: an
    interactive or private method sent there is refused by the host and runs nothing."""
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    name = session_sandbox_name(session_id)
    host = SandboxHost.objects.get(placements__sandbox_name=name)
    argv = ["sh", "-c", "echo pwned > queued.txt"]
    client = redis_client(settings.REDIS_URL)
    for method, kwargs in [
        ("run", {"name": name, "argv": argv}),
        ("start_detached", {"name": name, "argv": argv}),
        ("_run", {"name": name, "argv": argv}),
        ("__init__", {}),
    ]:
        call_id = uuid.uuid4().hex
        host_call.apply_async(args=[call_id, method, encode(kwargs)["v"]], queue=host.queue)
        reply = json.loads(client.blpop([reply_key(call_id)], timeout=30)[1])
        assert reply == {
            "error": {"type": "ProviderError", "message": f"{method!r} is not a host call"}
        }
    assert sh(owner, session_id, "test -e queued.txt")["exitCode"] == 1
    # Outside a sandbox host (this process is none) nothing is served at all.
    assert host_dispatch(method="stop", kwargs={"name": name}, allowed=LIFECYCLE_METHODS) == {
        "error": {"type": "ProviderError", "message": "this process is no sandbox host"}
    }


def test_the_wire_builds_only_the_interfaces_own_types():
    result = CommandResult(
        exit_code=0, stdout="é\x00", stderr="", duration_ms=3, timed_out=False, truncated=False
    )
    assert decode(json.loads(json.dumps(encode(result)))) == result
    assert decode(encode(SandboxStatus.RUNNING)) is SandboxStatus.RUNNING
    assert decode(encode({"a": b"\xff\x00"})) == {"a": b"\xff\x00"}
    for hostile in ["Path", "os.system", "subprocess.Popen", "__builtins__", "type"]:
        with pytest.raises(ValueError, match="unknown type"):
            decode({"~": hostile, "v": {"args": ["id"]}})
    with pytest.raises(TypeError):
        encode(object())
