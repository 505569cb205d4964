"""What every long-lived response shares: a waiting slot held exactly for its life."""

import json

import pytest

from recoup import waits
from recoup.errors import ServiceUnavailable, TooManyRequests
from recoup.streams import SSE, _Held, ndjson_line, sse_event, stream_response


def test_a_stream_holds_a_waiting_slot_until_it_is_closed_even_unread(settings):
    settings.WEB_MAX_WAITING = 1
    first = stream_response(iter([b"a"]), content_type=SSE, account_id="a")
    with pytest.raises(ServiceUnavailable) as refused:
        stream_response(iter([b"b"]), content_type=SSE, account_id="a")
    assert refused.value.wait == 2
    first.close()  # never iterated: a response the server did not send
    second = stream_response(iter([b"b"]), content_type=SSE, account_id="a")
    assert b"".join(second.streaming_content) == b"b"
    second.close()
    assert waits._waiting == 0


def test_closing_a_stream_closes_its_source_and_releases_once():
    released = []

    def source():
        try:
            yield b"x"
            yield b"y"
        finally:
            released.append("source")

    held = _Held(source(), release=lambda: released.append("slot"))
    assert next(held) == b"x"
    held.close()
    held.close()
    assert released == ["source", "slot"]


def test_an_event_is_one_json_line_with_its_id():
    chunk = sse_event(event="transition", data={"state": "a\nb"}, id=7)
    assert chunk == b'id: 7\nevent: transition\ndata: {"state":"a\\nb"}\n\n'
    assert json.loads(ndjson_line({"stream": "stdout"})) == {"stream": "stdout"}


def test_one_account_cannot_take_every_waiting_slot_with_streams(settings):
    settings.WEB_MAX_WAITING = 10
    settings.STREAM_MAX_PER_ACCOUNT = 2
    mine = [stream_response(iter([b"a"]), content_type=SSE, account_id="a") for _ in range(2)]
    with pytest.raises(TooManyRequests) as refused:
        stream_response(iter([b"a"]), content_type=SSE, account_id="a")
    assert refused.value.wait == 2
    # Another account still gets a stream, and the refused one took no waiting slot.
    theirs = stream_response(iter([b"b"]), content_type=SSE, account_id="b")
    assert waits._waiting == 3
    mine[0].close()
    again = stream_response(iter([b"a"]), content_type=SSE, account_id="a")
    for response in [*mine[1:], theirs, again]:
        response.close()
    assert waits._waiting == 0
