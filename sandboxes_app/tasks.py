"""Thin Celery tasks of the sandbox hosts."""

import json

from celery import shared_task
from django.conf import settings

from recoup.redis_clients import redis_client
from sandboxes_app.hosts.dispatch import LIFECYCLE_METHODS, host_dispatch
from sandboxes_app.hosts.services import REPLY_TTL_SECONDS, reply_key


# Acknowledged on receipt, unlike the lifecycle's tasks: its caller waits for the reply and
# fails the run when the host dies, so a redelivery after a host restart would only repeat
# work somebody already gave up on.
@shared_task(name="sandbox_host.call", ignore_result=True, acks_late=False)
def host_call(call_id: str, method: str, kwargs: dict) -> None:
    """A lifecycle call routed to this host's queue; the reply goes to the caller's list."""
    reply = host_dispatch(method=method, kwargs=kwargs, allowed=LIFECYCLE_METHODS)
    client = redis_client(settings.REDIS_URL)
    with client.pipeline() as pipe:
        pipe.rpush(reply_key(call_id), json.dumps(reply))
        pipe.expire(reply_key(call_id), REPLY_TTL_SECONDS)
        pipe.execute()
