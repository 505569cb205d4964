"""The bus between our processes, on both backends: Redis pub/sub (REDIS_URL) and the embedded
Unix datagram sockets under DATA_DIR."""

import os
import subprocess
import sys
import threading

import pytest

from recoup import bus
from tests.support.worker import ROOT


@pytest.fixture(params=["redis", "embedded"])
def backend(request, settings, tmp_path) -> str:
    if request.param == "embedded":
        settings.REDIS_URL = ""
        # Longer than a socket path may be: the bus must not care.
        settings.DATA_DIR = tmp_path / ("d" * 120)
    elif not settings.REDIS_URL:
        pytest.fail("the suite runs with REDIS_URL set (scripts/test sets it)")
    return request.param


def test_a_subscriber_gets_what_another_process_publishes(backend, settings):
    env = {
        **os.environ,
        "REDIS_URL": settings.REDIS_URL,
        "RECOUP_DATA_DIR": str(settings.DATA_DIR),
    }
    script = "from recoup import bus; bus.publish('session:abc', {'state': 'active', 'v': 3})"
    with bus.subscribe("session:abc") as subscription:
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, env=env, check=True
        )
        assert subscription.get(timeout=5) == {"state": "active", "v": 3}
        assert subscription.get(timeout=0.05) is None


def test_a_subscriber_hears_only_its_channel_and_every_subscriber_hears_it(backend):
    with bus.subscribe("command:one") as first, bus.subscribe("command:one") as second:
        with bus.subscribe("command:two") as other:
            bus.publish("command:one", {"data": "x"})
            assert first.get(timeout=2) == {"data": "x"}
            assert second.get(timeout=2) == {"data": "x"}
            assert other.get(timeout=0.1) is None


def test_publishing_with_nobody_listening_or_after_a_reader_died_is_harmless(backend, settings):
    bus.publish("session:none", {"a": 1})
    subscription = bus.subscribe("session:gone")
    if backend == "embedded":
        # A reader killed without closing leaves its socket file: the next publish drops it.
        subscription._socket.close()
        bus.publish("session:gone", {"a": 1})
        assert not list(bus._local_dir("session:gone").glob("*.sock"))
    else:
        subscription.close()
        bus.publish("session:gone", {"a": 1})


def test_a_message_too_large_is_dropped_not_sent(backend):
    with bus.subscribe("command:big") as subscription:
        bus.publish("command:big", {"data": "x" * (bus.MAX_MESSAGE_BYTES + 1)})
        bus.publish("command:big", {"data": "small"})
        assert subscription.get(timeout=2) == {"data": "small"}


def test_a_reader_waits_in_one_thread_while_another_publishes(backend):
    with bus.subscribe("session:threads") as subscription:
        got = []
        reader = threading.Thread(target=lambda: got.append(subscription.get(timeout=5)))
        reader.start()
        bus.publish("session:threads", {"n": 1})
        reader.join(timeout=6)
        assert got == [{"n": 1}]
