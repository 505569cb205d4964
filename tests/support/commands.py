"""Detached commands over the API, for the tests: start one, wait for it, read its log stream."""

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tests.support.worker import wait_for


def start_detached(actor, session_id: str, script: str, **extra) -> str:
    """`sh -c script` as a detached command of the session's sandbox; its id."""
    response = actor.client.post(
        "/api/sandbox/commands",
        {"sessionId": session_id, "cmd": "sh", "args": ["-c", script], "detached": True, **extra},
        format="json",
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert set(body) == {"commandId", "startedAt"}, body
    return body["commandId"]


def get_command(actor, command_id: str, **scope: str):
    return actor.client.get(f"/api/sandbox/commands/{command_id}", scope)


def wait_finished(actor, session_id: str, command_id: str, timeout: float = 30) -> dict:
    def finished() -> dict | None:
        response = get_command(actor, command_id, sessionId=session_id)
        assert response.status_code == 200, response.content
        body = response.json()
        return body if body["finishedAt"] is not None else None

    return wait_for(finished, timeout=timeout, message=f"{command_id} never finished")


@dataclass
class Event:
    event: str
    data: dict
    id: int | None


def sse_events(chunks: Iterable[bytes]) -> Iterator[Event | None]:
    """Events as they arrive from a server-sent events body (None for a keep-alive)."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            fields = {}
            for line in block.decode().split("\n"):
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(": ")
                fields[name] = value
            if not fields:
                yield None
                continue
            yield Event(
                event=fields["event"],
                data=json.loads(fields["data"]),
                id=int(fields["id"]) if "id" in fields else None,
            )


def log_events(actor, command_id: str, *, headers: dict | None = None, **query) -> list[Event]:
    """The whole log stream of a command (one that ends), keep-alives left out."""
    response = actor.client.get(
        f"/api/sandbox/commands/{command_id}/logs", query, headers=headers or {}
    )
    assert response.status_code == 200, response.content
    try:
        return [event for event in sse_events(response.streaming_content) if event is not None]
    finally:
        response.close()


def text_of(events: list[Event], stream: str) -> str:
    return "".join(event.data["data"] for event in events if event.event == stream)
