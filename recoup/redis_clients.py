"""One Redis client, and so one connection pool, per process and URL: the rate limit and the bus
share it. Its own module, free of Django and DRF, so a process without them (a detached
command's supervisor) can publish on the bus."""

from functools import cache

import redis


@cache
def redis_client(url: str) -> redis.Redis:
    """The process's client for `url` (redis-py's pool is thread-safe and reconnects in a
    forked child)."""
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
