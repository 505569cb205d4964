"""Database connections around long waits."""

from django.db import connection


def release_db_connection() -> None:
    """Give this thread's database connection back before a long wait on a sandbox (a command,
    a clone, a snapshot): hundreds of requests may be waiting at once, and the pool's few
    connections are for the requests that are working. The next query takes one again (cheap,
    from the pool). Inside a transaction the connection is kept: it holds the transaction."""
    if not connection.in_atomic_block:
        connection.close()
