"""No host path crosses the boundary through git (issue 8, item 5): the session's `cloneUrl`
and the workspace's `origin` are the repository's github.com URL, never the mirror's address
on the host, whether the sandbox was cloned or layered on a base and fast-forwarded."""

import pytest

from lifecycle.bases import base_build_run
from lifecycle.models import BaseSnapshotBuild
from tests.support.api import new_session, sh, start_sandbox

pytestmark = pytest.mark.django_db(transaction=True)
PUBLIC = "https://github.com/acme/app.git"


def remotes(actor, session_id: str) -> str:
    return sh(actor, session_id, "git remote -v; git config --get-regexp '^(remote|branch)\\.'")[
        "stdout"
    ]


def test_a_cloned_workspace_and_its_session_name_the_public_url(owner, repo_url, origins):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)

    listed = remotes(owner, session_id)
    session = owner.client.get(f"/api/sessions/{session_id}")

    assert listed.splitlines()[:2] == [f"origin\t{PUBLIC} (fetch)", f"origin\t{PUBLIC} (push)"]
    assert session.json()["session"]["cloneUrl"] == PUBLIC
    for text in (listed, session.content.decode()):
        assert str(origins.root) not in text and "file://" not in text


def test_a_workspace_layered_on_a_base_names_the_public_url(owner, member, org, repo_url, origins):
    first = new_session(owner, organizationId=str(org.id))
    start_sandbox(owner, first, repo_url)
    build = BaseSnapshotBuild.objects.get(scope=f"org:{org.id}")
    assert base_build_run(build_id=build.id).status == BaseSnapshotBuild.Status.SUCCEEDED
    origins.commit("acme", "app", {"NEW.md": "after the base\n"})

    second = new_session(member, organizationId=str(org.id))
    booted = start_sandbox(member, second, repo_url)
    listed = remotes(member, second)

    assert (
        member.client.get(f"/api/sessions/{second}").json()["session"]["sandboxState"]["boot"]
        == "base"
    ), booted
    assert sh(member, second, "cat NEW.md")["stdout"] == "after the base\n"
    assert listed.splitlines()[:2] == [f"origin\t{PUBLIC} (fetch)", f"origin\t{PUBLIC} (push)"]
    assert str(origins.root) not in listed and "file://" not in listed
