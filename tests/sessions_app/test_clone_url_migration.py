"""Sessions stored before issue 8 lose the mirror's host path from their cloneUrl."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("sessions_app", "0002_session_lifecycle_dispatched_at_session_sweep_idle_and_more")]
AFTER = [("sessions_app", "0003_public_clone_urls")]


@pytest.mark.django_db(transaction=True)
def test_old_sessions_get_the_public_clone_url(owner):
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    executor.migrate(BEFORE)
    try:
        check_the_migration(owner)
    finally:
        # Back to the newest schema: the tests after this one in the process expect it.
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(latest)


def check_the_migration(owner) -> None:
    executor = MigrationExecutor(connection)
    old = executor.loader.project_state(BEFORE).apps.get_model("sessions_app", "Session")
    mirrored = old.objects.create(
        account_id=owner.account.id,
        title="old",
        repo_owner="acme",
        repo_name="app",
        clone_url="file:///srv/recoup/mirror/acme/app.git",
    )
    repoless = old.objects.create(account_id=owner.account.id, title="no repo")

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(AFTER)
    new = executor.loader.project_state(AFTER).apps.get_model("sessions_app", "Session")

    assert new.objects.get(id=mirrored.id).clone_url == "https://github.com/acme/app.git"
    assert new.objects.get(id=repoless.id).clone_url is None
