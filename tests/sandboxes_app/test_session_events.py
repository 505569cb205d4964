"""GET /api/sandbox/events: lifecycle transitions and provisioning progress, pushed over the bus
as they happen (real PostgreSQL, Redis or the embedded Unix sockets, real sandboxes, a real
worker), replayed from the LifecycleEvent rows on reconnect."""

import os
import threading
import time

import pytest
import requests

from lifecycle.states import LifecycleState as S
from lifecycle.transitions import Seen, transition
from recoup import waits
from sessions_app.models import Session
from tests.recoup.test_web_entry import start_web
from tests.support.api import new_session, start_sandbox
from tests.support.events import EventsClient, parse_sse

pytestmark = pytest.mark.django_db(transaction=True)
EVENTS = "/api/sandbox/events"


@pytest.fixture(autouse=True)
def quick_streams(settings):
    settings.STREAM_KEEPALIVE_SECONDS = 1


@pytest.fixture(params=["redis", "embedded"])
def bus_backend(request, settings, tmp_path) -> str:
    """Both buses. The embedded one's sockets live under DATA_DIR, so whoever publishes (here
    the test process, which provisions in-process) must share it with the stream."""
    if request.param == "embedded":
        settings.REDIS_URL = ""
        settings.DATA_DIR = tmp_path / "data"
    elif not settings.REDIS_URL:
        pytest.fail("the suite runs with REDIS_URL set (scripts/test sets it)")
    return request.param


def move(session_id: str, to: str, reason: str) -> Session:
    """One real transition, as the lifecycle makes them (published once it commits)."""
    session = Session.objects.get(id=session_id)
    moved = transition(
        session_id=session_id, seen=Seen.of(session), to=to, reason=reason, actor="test"
    )
    assert moved is not None
    return moved


def walk_to_hibernated(session_id: str) -> None:
    """Versions 1-4: provisioning, active, hibernating, hibernated."""
    move(session_id, S.PROVISIONING, "create")
    move(session_id, S.ACTIVE, "ready_clone")
    move(session_id, S.HIBERNATING, "idle")
    move(session_id, S.HIBERNATED, "hibernated")


def big_origin(origins) -> str:
    """A repository git takes a moment to clone, printing its progress: 24 MB that no
    compression shrinks, in 48 objects."""
    files = {f"blobs/{n}.bin": os.urandom(512 * 1024) for n in range(48)}
    origins.create("acme", "big", files)
    return "https://github.com/acme/big"


def test_a_client_sees_the_clone_progress_and_the_transition_to_active(owner, origins, bus_backend):
    repo_url = big_origin(origins)
    session_id = new_session(owner)
    stream = EventsClient(owner.client, session_id)
    first = stream.next()
    assert (first.event, first.id) == ("state", None)
    assert first.data == {
        "sessionId": session_id,
        "state": "provisioning",
        "version": 0,
        "provisioning": None,
    }

    polled: list[dict | None] = []
    provisioning = threading.Thread(target=start_sandbox, args=(owner, session_id, repo_url))
    provisioning.start()
    while provisioning.is_alive():
        response = owner.client.get("/api/sandbox/status", {"sessionId": session_id})
        polled.append(response.json()["provisioning"])
        time.sleep(0.02)
    provisioning.join()
    events = stream.until(lambda e: e.event == "transition" and e.data["state"] == "active")
    events += stream.until(lambda e: e.event == "progress" and e.data["phase"] == "active")
    after = owner.client.get("/api/sandbox/status", {"sessionId": session_id}).json()
    stream.close()

    transitions = [e for e in events if e.event == "transition"]
    assert [(e.data["fromState"], e.data["state"], e.data["reason"]) for e in transitions] == [
        ("provisioning", "provisioning", "create"),
        ("provisioning", "active", "ready_clone"),
    ]
    assert [(e.id, e.data["version"]) for e in transitions] == [("1", 1), ("2", 2)]
    assert all(abs(e.data["at"] - time.time() * 1000) < 60_000 for e in transitions)
    progress = [e for e in events if e.event == "progress"]
    assert all(e.id is None and e.data["sessionId"] == session_id for e in progress)
    phases = [e.data["phase"] for e in progress]
    assert phases[0] == "queued" and phases[-2:] == ["starting", "active"]
    assert phases.index("cloning") < phases.index("starting")
    percents = [e.data["percent"] for e in progress if e.data["phase"] == "cloning"]
    assert len(percents) >= 2 and any(0 < p <= 100 for p in percents), percents
    assert percents == sorted(percents) and len(set(percents)) == len(percents)
    # Pushed, not polled: following the stream asked nothing of the database, and held no
    # connection while it waited.
    assert stream.queries == []
    assert stream.held_connection and not any(stream.held_connection)

    assert any(p and p["phase"] == "cloning" and p["percent"] > 0 for p in polled), polled
    assert after["provisioning"] is None and after["status"] == "active"


def test_reconnecting_with_last_event_id_replays_exactly_the_missed_transitions(owner):
    session_id = new_session(owner)
    walk_to_hibernated(session_id)

    by_header = EventsClient(owner.client, session_id, HTTP_LAST_EVENT_ID="2")
    state = by_header.next()
    replayed = [by_header.next(), by_header.next()]
    move(session_id, S.RESTORING, "resume")
    live = by_header.next()
    by_header.close()

    assert (state.event, state.id, state.data["state"], state.data["version"]) == (
        "state",
        "2",
        "hibernated",
        4,
    )
    assert [(e.event, e.id, e.data["state"]) for e in replayed] == [
        ("transition", "3", "hibernating"),
        ("transition", "4", "hibernated"),
    ]
    assert (live.event, live.id, live.data["fromState"], live.data["state"]) == (
        "transition",
        "5",
        "hibernated",
        "restoring",
    )
    assert by_header.queries == []  # the replay was read before the stream went live

    # The query parameter works as the header does; an id ahead of ours is wound back to ours.
    by_query = EventsClient(owner.client, session_id, {"lastEventId": "4"})
    assert (by_query.next().id, by_query.next().id) == ("4", "5")
    by_query.close()
    ahead = EventsClient(owner.client, session_id, HTTP_LAST_EVENT_ID="99")
    first = ahead.next()
    move(session_id, S.HIBERNATED, "resume_abandoned")
    following = ahead.next()
    ahead.close()
    assert (first.event, first.id, first.data["version"]) == ("state", "5", 5)
    assert (following.event, following.id, following.data["state"]) == (
        "transition",
        "6",
        "hibernated",
    )


def test_hibernate_and_resume_arrive_as_they_happen(owner, repo_url, worker):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    stream = EventsClient(owner.client, session_id)
    assert stream.next().data["state"] == "active"

    hibernate = owner.client.post(
        "/api/sandbox/hibernate", {"sessionId": session_id}, format="json"
    )
    assert hibernate.status_code == 202
    slept = stream.until(lambda e: e.event == "transition" and e.data["state"] == "hibernated")
    start_sandbox(owner, session_id, repo_url)
    woke = stream.until(lambda e: e.event == "progress" and e.data["phase"] == "active")
    stream.close()

    assert [(e.data["fromState"], e.data["state"]) for e in slept] == [
        ("active", "hibernating"),
        ("hibernating", "hibernated"),
    ]
    assert [e.id for e in slept] == ["3", "4"]
    assert [(e.event, e.id, e.data.get("state") or e.data["phase"]) for e in woke] == [
        ("transition", "5", "restoring"),
        ("progress", None, "queued"),
        ("progress", None, "starting"),
        ("transition", "6", "active"),
        ("progress", None, "active"),
    ]
    assert woke[-2].data["reason"] == "ready_resume"
    assert stream.queries == []


def test_a_lost_message_costs_latency_never_an_event(owner, settings):
    session_id = new_session(owner)
    move(session_id, S.PROVISIONING, "create")
    stream = EventsClient(owner.client, session_id)
    assert stream.next().data["version"] == 1

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # Redis is unreachable: the publish is lost
    move(session_id, S.ACTIVE, "ready_clone")
    settings.REDIS_URL = os.environ["REDIS_URL"]
    move(session_id, S.HIBERNATING, "idle")
    events = [stream.next(), stream.next()]
    stream.close()

    assert [(e.id, e.data["state"]) for e in events] == [("2", "active"), ("3", "hibernating")]
    assert len(stream.queries) == 1  # the missed row, read once the gap showed
    assert not any(stream.held_connection)


def test_a_stream_ends_after_its_time_and_gives_its_slot_back(owner, settings):
    settings.STREAM_MAX_SECONDS = 1
    settings.WEB_MAX_WAITING = 1
    session_id = new_session(owner)
    stream = EventsClient(owner.client, session_id)
    refused = owner.client.get(EVENTS, {"sessionId": session_id})

    assert stream.ended.wait(10), "the stream outlived STREAM_MAX_SECONDS"
    assert refused.status_code == 503 and refused["Retry-After"] == "2"
    assert refused.json()["status"] == "error"
    assert waits._waiting == 0
    assert stream.next().event == "state"


def test_another_account_gets_404_and_bad_input_a_clear_400(owner, member, stranger, anon):
    session_id = new_session(owner)
    move(session_id, S.PROVISIONING, "create")

    for actor in (stranger, member):  # an organization peer does not own it either
        response = actor.client.get(EVENTS, {"sessionId": session_id})
        assert response.status_code == 404
        assert response.json() == {"status": "error", "error": f"Session {session_id} not found"}
        assert not response.streaming
    # An EventSource accepts only text/event-stream: errors are still the JSON envelope.
    unknown = owner.client.get(EVENTS, {"sessionId": "nope"}, HTTP_ACCEPT="text/event-stream")
    assert unknown.status_code == 404
    assert unknown.json() == {"status": "error", "error": "Session nope not found"}
    assert owner.client.get(EVENTS).json() == {
        "status": "error",
        "error": "sessionId: This field is required.",
    }
    bad_id = owner.client.get(EVENTS, {"sessionId": session_id, "lastEventId": "x"})
    assert bad_id.status_code == 400 and "lastEventId" in bad_id.json()["error"]
    for bad in ("-1", "²", "1" * 19):
        bad_header = owner.client.get(EVENTS, {"sessionId": session_id}, HTTP_LAST_EVENT_ID=bad)
        assert bad_header.status_code == 400, bad
        assert bad_header.json()["error"].startswith("lastEventId: must be the id")
    assert owner.client.head(EVENTS, {"sessionId": session_id}).status_code == 405
    assert anon.get(EVENTS, {"sessionId": session_id}).status_code == 401
    assert waits._waiting == 0
    session = Session.objects.get(id=session_id)
    assert (session.lifecycle_state, session.lifecycle_version) == ("provisioning", 1)


@pytest.mark.slow
def test_through_gunicorn_events_flush_as_they_happen_and_a_hang_up_frees_the_slot(owner, settings):
    web, base = start_web(
        settings, WEB_WORKERS="1", WEB_MAX_WAITING="1", STREAM_KEEPALIVE_SECONDS="1"
    )
    url, headers = f"{base}{EVENTS}", {"x-api-key": owner.raw_key}
    try:
        session_id = new_session(owner)
        params = {"sessionId": session_id}
        with requests.get(url, params=params, headers=headers, stream=True, timeout=30) as live:
            assert live.status_code == 200
            assert live.headers["Content-Type"].startswith("text/event-stream")
            events = parse_sse(live.iter_content(chunk_size=None))
            assert next(events).data["version"] == 0
            transitions = (e for e in events if e.event == "transition")
            delays = []
            for to, reason in [
                (S.PROVISIONING, "create"),
                (S.ACTIVE, "ready_clone"),
                (S.HIBERNATING, "idle"),
                (S.HIBERNATED, "hibernated"),
                (S.RESTORING, "resume"),
                (S.ACTIVE, "ready_resume"),
            ]:
                published = time.monotonic()
                moved = move(session_id, to, reason)
                event = next(transitions)
                delays.append(event.received_at - published)
                assert (event.id, event.data["state"]) == (str(moved.lifecycle_version), to)
            # The one waiting slot is this stream's.
            assert requests.get(url, params=params, headers=headers, timeout=10).status_code == 503
        # The client hung up: the next keep-alive fails, and the slot comes back.
        deadline = time.monotonic() + 15
        while True:
            again = requests.get(url, params=params, headers=headers, stream=True, timeout=10)
            if again.status_code == 200 or time.monotonic() > deadline:
                break
            again.close()
            time.sleep(0.2)
        with again:
            assert again.status_code == 200, again.text
            assert next(parse_sse(again.iter_content(chunk_size=None))).data["version"] == 6
        assert max(delays) < 0.5, delays

        # Across a restart of the web server, Last-Event-ID misses nothing and repeats nothing.
        web.terminate()
        web.wait(timeout=30)
        move(session_id, S.HIBERNATING, "idle")
        move(session_id, S.HIBERNATED, "hibernated")
        web, base = start_web(settings, STREAM_KEEPALIVE_SECONDS="1")
        resumed = {**headers, "Last-Event-ID": "6"}
        with requests.get(
            f"{base}{EVENTS}", params=params, headers=resumed, stream=True, timeout=30
        ) as after:
            events = parse_sse(after.iter_content(chunk_size=None))
            got = [next(events) for _ in range(3)]
        assert [(e.event, e.id) for e in got] == [
            ("state", "6"),
            ("transition", "7"),
            ("transition", "8"),
        ]
    finally:
        web.terminate()
        web.wait(timeout=30)


@pytest.mark.slow
def test_a_graceful_web_stop_ends_open_streams_at_once(owner, settings):
    """Without the stop hook gunicorn waits its whole graceful timeout (30 s) on the stream."""
    web, base = start_web(settings, WEB_WORKERS="1")
    try:
        session_id = new_session(owner)
        with requests.get(
            f"{base}{EVENTS}",
            params={"sessionId": session_id},
            headers={"x-api-key": owner.raw_key},
            stream=True,
            timeout=30,
        ) as live:
            events = parse_sse(live.iter_content(chunk_size=None))
            assert next(events).event == "state"
            stopping = time.monotonic()
            web.terminate()
            web.wait(timeout=30)
            assert time.monotonic() - stopping < 5
            assert list(events) == []  # the stream ended: the client reconnects elsewhere
    finally:
        if web.poll() is None:
            web.kill()
            web.wait(timeout=10)
