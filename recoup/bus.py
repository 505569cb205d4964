"""Push between our processes: a wake-up that carries a payload, never the record itself.

A publisher (a lifecycle transition, a provisioning step, a command's output) publishes after
its durable write. A reader subscribes first, then reads the durable record (LifecycleEvent
rows, a command's log file), then follows the bus; one that may have missed a message (its
buffer was full, Redis blinked) catches up from the record again. So a lost message costs a
little latency and never data, and the bus needs no delivery guarantee.

With REDIS_URL: Redis pub/sub, which any number of web and worker hosts share. Without it (the
embedded default, one host): Unix datagram sockets, one per subscriber, under
DATA_DIR/bus/<channel hash>/; a publisher sends to each socket it finds there.
"""

import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import socket
import time
from pathlib import Path

import redis
from django.conf import settings

from recoup.redis_clients import redis_client

logger = logging.getLogger("recoup.bus")

# Payloads stay well under a Unix datagram socket's default send buffer (about 208 KB).
MAX_MESSAGE_BYTES = 64 * 1024


def publish(channel: str, message: dict) -> None:
    """Send `message` to the channel's current subscribers; never raises (the record is the
    truth, so a message that cannot go out is logged and dropped)."""
    publish_to(channel, message, redis_url=settings.REDIS_URL, data_dir=settings.DATA_DIR)


def publish_to(channel: str, message: dict, *, redis_url: str, data_dir: str | Path) -> None:
    """`publish` to the bus that REDIS_URL and DATA_DIR name, without reading Django's
    settings: for a process that runs without them (a detached command's supervisor)."""
    payload = json.dumps(message, separators=(",", ":")).encode()
    if len(payload) > MAX_MESSAGE_BYTES:
        logger.warning("bus message on %s dropped: %d bytes", channel, len(payload))
        return
    try:
        if redis_url:
            redis_client(redis_url).publish(_redis_channel(channel), payload)
        else:
            _local_publish(channel, payload, data_dir=data_dir)
    except (OSError, redis.RedisError) as exc:
        logger.warning("bus message on %s dropped: %s", channel, exc)


def subscribe(channel: str) -> "Subscription":
    """A subscription that receives what is published on `channel` from now on (it is in
    place when this returns). Use it as a context manager."""
    if settings.REDIS_URL:
        return _RedisSubscription(channel)
    return _LocalSubscription(channel)


class Subscription:
    def get(self, *, timeout: float) -> dict | None:
        """The next message, or None when `timeout` seconds pass without one (or the bus is
        unreachable for now: the caller catches up from the record either way)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _redis_channel(channel: str) -> str:
    return f"recoup:bus:{channel}"


class _RedisSubscription(Subscription):
    def __init__(self, channel: str) -> None:
        self._channel = _redis_channel(channel)
        self._pubsub = None
        self._connect()

    def _connect(self) -> None:
        try:
            pubsub = redis_client(settings.REDIS_URL).pubsub()
            pubsub.subscribe(self._channel)
            # Wait for Redis to confirm: only then is a publish sure to reach us.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                reply = pubsub.get_message(timeout=1)
                if reply is not None and reply["type"] == "subscribe":
                    self._pubsub = pubsub
                    return
            pubsub.close()
        except (OSError, redis.RedisError) as exc:
            logger.warning("bus subscription to %s failed: %s", self._channel, exc)

    def get(self, *, timeout: float) -> dict | None:
        if self._pubsub is None:
            time.sleep(timeout)
            self._connect()
            return None
        try:
            reply = self._pubsub.get_message(timeout=timeout)
        except (OSError, redis.RedisError) as exc:
            logger.warning("bus subscription to %s lost: %s", self._channel, exc)
            self.close()
            return None
        if reply is None or reply["type"] != "message":
            return None
        return json.loads(reply["data"])

    def close(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(OSError, redis.RedisError):
                self._pubsub.close()
            self._pubsub = None


def _local_dir(channel: str, data_dir: str | Path | None = None) -> Path:
    digest = hashlib.sha256(channel.encode()).hexdigest()[:24]
    return Path(settings.DATA_DIR if data_dir is None else data_dir) / "bus" / digest


@contextlib.contextmanager
def _short_path(directory: Path):
    """`directory` as /proc/self/fd/N: a socket's path must fit in 108 bytes, and
    RECOUP_DATA_DIR may be longer than that leaves room for."""
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _local_publish(channel: str, payload: bytes, *, data_dir: str | Path) -> None:
    directory = _local_dir(channel, data_dir)
    try:
        names = [name for name in os.listdir(directory) if name.endswith(".sock")]
    except FileNotFoundError:
        return  # nobody has ever listened here
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender,
        _short_path(directory) as short,
    ):
        for name in names:
            try:
                sender.sendto(payload, socket.MSG_DONTWAIT, f"{short}/{name}")
            except OSError as exc:
                if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                    # A subscriber that died without closing: nobody reads this socket.
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(directory / name)
                elif exc.errno != errno.EAGAIN:  # a full reader catches up from the record
                    raise


class _LocalSubscription(Subscription):
    def __init__(self, channel: str) -> None:
        directory = _local_dir(channel)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._path = directory / f"{secrets.token_hex(8)}.sock"
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with _short_path(directory) as short:
            self._socket.bind(f"{short}/{self._path.name}")

    def get(self, *, timeout: float) -> dict | None:
        self._socket.settimeout(timeout)
        try:
            payload = self._socket.recv(MAX_MESSAGE_BYTES + 1)
        except (TimeoutError, BlockingIOError):
            return None
        return json.loads(payload)

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()
        self._socket.close()
