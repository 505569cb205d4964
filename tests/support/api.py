"""HTTP helpers shared by the sandbox and lifecycle tests."""

from datetime import timedelta

from django.utils import timezone

from sessions_app.models import Session
from tests.support.worker import wait_for


def new_session(actor, **extra) -> str:
    response = actor.client.post("/api/sessions", {"title": "t", **extra}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["session"]["id"]


def start_sandbox(actor, session_id: str, repo_url: str) -> dict:
    response = actor.client.post(
        "/api/sandbox", {"repoUrl": repo_url, "sessionId": session_id}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()


def sh(actor, session_id: str, script: str) -> dict:
    response = actor.client.post(
        "/api/sandbox/commands",
        {"sessionId": session_id, "cmd": "sh", "args": ["-c", script]},
        format="json",
    )
    assert response.status_code == 200, response.content
    return response.json()


def wait_state(session_id: str, state: str, worker=None, timeout: float = 60) -> Session:
    return wait_for(
        lambda: Session.objects.filter(id=session_id, lifecycle_state=state).first(),
        timeout=timeout,
        message=f"{session_id} never reached {state}\n" + (worker.log()[-4000:] if worker else ""),
    )


def make_overdue(session_id: str, *columns: str) -> None:
    """Move due times (`hibernate_after` by default) into the past, as waiting would."""
    past = timezone.now() - timedelta(seconds=1)
    Session.objects.filter(id=session_id).update(
        **{column: past for column in columns or ("hibernate_after",)}
    )


# Files exercising every kind the workspace must keep across hibernation.
MANIFEST_SCRIPT = (
    "find . -path ./.git -prune -o -printf '%p %y %m %l\\n' | sort; "
    "find . -path ./.git -prune -o -type f -print0 | sort -z | xargs -0 sha256sum"
)
TREE_SCRIPT = r"""
set -e
mkdir -p empty/dir deep/a/b/c
printf 'exec' > tool.sh && chmod 755 tool.sh
printf 'private' > secret.txt && chmod 600 secret.txt
ln -s src/main.py link-to-main
ln -s missing dangling
printf 'ü' > 'ünïcode name.txt'
head -c 3000000 /dev/urandom > big.bin
rm scripts/run.sh
echo changed >> README.md
"""


def run(actor, session_id: str, *argv: str, **extra):
    return actor.client.post(
        "/api/sandbox/commands",
        {"sessionId": session_id, "cmd": argv[0], "args": list(argv[1:]), **extra},
        format="json",
    )
