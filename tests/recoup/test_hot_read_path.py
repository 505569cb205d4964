"""The hot read path's shared parts: the credential cache and the rate limit's round trips."""

import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import redis.connection
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from recoup.accounts.keys import credential_cache, key_digest
from recoup.accounts.models import ApiKey
from recoup.accounts.services import api_key_issue, api_key_revoke
from recoup.throttling import redis_client

URL = "/api/sessions"
pytestmark = pytest.mark.django_db


def _key_queries(client) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(URL).status_code == 200
    return sum("accounts_apikey" in q["sql"] for q in captured.captured_queries)


# --- The credential cache -------------------------------------------------------------------


def test_a_verified_key_is_not_looked_up_again_within_the_ttl(owner, settings):
    settings.AUTH_CACHE_SECONDS = 5
    assert _key_queries(owner.client) == 2  # the lookup and the first last_used_at write
    assert _key_queries(owner.client) == 0


def test_revoking_through_the_service_takes_effect_at_once(owner, settings):
    settings.AUTH_CACHE_SECONDS = 60
    assert owner.client.get(URL).status_code == 200

    api_key_revoke(prefix_or_id=str(ApiKey.objects.get(account=owner.account).id))

    assert owner.client.get(URL).status_code == 401


def test_revoking_with_the_management_command_takes_effect_at_once(owner, settings):
    settings.AUTH_CACHE_SECONDS = 60
    assert owner.client.get(URL).status_code == 200

    call_command("revoke_api_key", ApiKey.objects.get(account=owner.account).prefix)

    assert owner.client.get(URL).status_code == 401


def test_a_revocation_from_another_process_takes_effect_within_the_ttl(owner, settings):
    # The admin action and another process's command revoke in the database only.
    settings.AUTH_CACHE_SECONDS = 1
    assert owner.client.get(URL).status_code == 200
    ApiKey.objects.filter(account=owner.account).update(revoked_at=timezone.now())

    assert owner.client.get(URL).status_code == 200  # still trusted, within the TTL
    time.sleep(1.2)
    assert owner.client.get(URL).status_code == 401


def test_a_failed_lookup_is_never_cached(owner, settings):
    settings.AUTH_CACHE_SECONDS = 60
    issued = api_key_issue(account=owner.account)
    ApiKey.objects.filter(id=issued.api_key.id).update(revoked_at=timezone.now())
    owner.client.credentials(HTTP_X_API_KEY=issued.raw_key)
    assert owner.client.get(URL).status_code == 401
    assert credential_cache.get(key_digest(issued.raw_key)) is None

    # Un-revoked (as no one would), it works at once: nothing remembered the failure.
    ApiKey.objects.filter(id=issued.api_key.id).update(revoked_at=None)
    assert owner.client.get(URL).status_code == 200


def test_the_cache_holds_the_digest_never_the_raw_key(owner, settings):
    settings.AUTH_CACHE_SECONDS = 60
    assert owner.client.get(URL).status_code == 200

    secret = owner.raw_key.removeprefix("recoup_sk_")
    assert credential_cache.get(key_digest(owner.raw_key)) is not None
    assert not any(secret in name for name in credential_cache._entries)
    assert not any(secret in str(v) for _, v in credential_cache._entries.values())


def test_last_used_at_is_still_written_at_most_once_a_minute(owner, settings):
    settings.AUTH_CACHE_SECONDS = 1
    api_key = ApiKey.objects.get(account=owner.account)
    assert owner.client.get(URL).status_code == 200
    api_key.refresh_from_db()
    first_use = api_key.last_used_at
    assert first_use is not None

    time.sleep(1.2)  # the entry aged out: looked up again, but within the minute
    assert owner.client.get(URL).status_code == 200
    api_key.refresh_from_db()
    assert api_key.last_used_at == first_use

    two_minutes_ago = timezone.now() - timedelta(minutes=2)
    ApiKey.objects.filter(id=api_key.id).update(last_used_at=two_minutes_ago)
    time.sleep(1.2)
    assert owner.client.get(URL).status_code == 200
    api_key.refresh_from_db()
    assert api_key.last_used_at > two_minutes_ago + timedelta(minutes=1)


# --- The rate limit -------------------------------------------------------------------------


@pytest.fixture
def round_trips(monkeypatch) -> list[bytes]:
    """Every request sent to Redis (a pipeline is sent as one), including a new connection's
    handshake."""
    sent: list[bytes] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counting(self, command, check_health=True):
        sent.append(b"".join(command) if isinstance(command, list) else command)
        return send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    return sent


def _assert_limit_holds(actor, limit: int) -> None:
    for _ in range(limit):
        assert actor.client.get(URL).status_code == 200
    refused = actor.client.get(URL)
    assert refused.status_code == 429
    assert refused.json() == {"status": "error", "error": refused.json()["error"]}
    assert 1 <= int(refused["Retry-After"]) <= 24 * 3600


def test_the_limit_holds_at_the_boundary_in_redis(owner, stranger, settings, round_trips):
    # A day's window: a test cannot straddle its boundary unless it runs across midnight UTC.
    assert settings.REDIS_URL, "the test command sets REDIS_URL"
    settings.API_RATE_LIMIT = "5/day"
    _assert_limit_holds(owner, 5)

    assert len(round_trips) == 6  # one per request, for the whole throttle
    keys = redis_client(settings.REDIS_URL).keys(f"recoup:rate:throttle_user_{owner.account.pk}:*")
    assert len(keys) == 1
    assert 0 < redis_client(settings.REDIS_URL).ttl(keys[0]) <= 24 * 3600 + 1
    _assert_limit_holds(stranger, 5)  # a budget of its own


def test_the_limit_holds_in_process_without_redis(owner, stranger, settings, round_trips):
    settings.REDIS_URL = ""
    settings.API_RATE_LIMIT = "3/day"
    _assert_limit_holds(owner, 3)
    _assert_limit_holds(stranger, 3)
    assert round_trips == []


def test_a_busy_account_takes_its_counts_from_redis_in_blocks(owner, settings, round_trips):
    settings.API_RATE_LIMIT = "1000/day"  # blocks of 10

    for _ in range(25):
        assert owner.client.get(URL).status_code == 200

    takes = [sent for sent in round_trips if b"recoup:rate:" in sent]
    assert len(takes) == 3  # 10 + 10 + 5 of the third block
    key = redis_client(settings.REDIS_URL).keys(f"recoup:rate:throttle_user_{owner.account.pk}:*")
    assert int(redis_client(settings.REDIS_URL).get(key[0])) == 30


def test_a_block_that_would_cross_the_limit_is_cut_to_what_fits(owner, settings):
    settings.API_RATE_LIMIT = "205/day"  # blocks of 2: the 103rd take holds one real count
    for _ in range(205):
        assert owner.client.get(URL).status_code == 200

    assert owner.client.get(URL).status_code == 429
    assert owner.client.get(URL).status_code == 429


# Another web process: the same function on its own blocks, against the same Redis counter.
_OTHER_PROCESS = """
import sys, django
django.setup()
from recoup.throttling import window_admits
key, limit, window, ends, tries = sys.argv[1], *map(int, sys.argv[2:])
admits = lambda: window_admits(key, limit=limit, window=window, window_ends_at=ends)
print(sum(admits() for _ in range(tries)))
"""


def test_processes_taking_blocks_at_once_never_admit_more_than_the_limit(settings):
    # Three processes spend 700 tries each on one key whose limit is 1000 (blocks of 10). The
    # counts one process holds unspent when the others run out may be refused: at most 9 each.
    key = f"test-blocks-{time.monotonic_ns()}"
    window = int(time.time() // 3600)
    argv = [key, "1000", str(window), str((window + 1) * 3600), "700"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "recoup.settings"}
    others = [
        subprocess.Popen(
            [sys.executable, "-c", _OTHER_PROCESS, *argv], env=env, stdout=subprocess.PIPE
        )
        for _ in range(3)
    ]
    admitted = [int(other.communicate(timeout=120)[0]) for other in others]

    assert 1000 - 3 * 9 <= sum(admitted) <= 1000
    assert all(other.returncode == 0 for other in others)


def test_a_flood_of_new_keys_does_not_grow_the_process(settings, monkeypatch):
    from recoup import throttling

    monkeypatch.setattr(throttling, "_MAX_HELD_KEYS", 50)
    window = int(time.time() // 3600)
    prefix = f"test-flood-{time.monotonic_ns()}"
    for n in range(500):
        assert throttling.window_admits(
            f"{prefix}-{n}", limit=1000, window=window, window_ends_at=(window + 1) * 3600
        )

    assert len(throttling._blocks._held) <= 50
