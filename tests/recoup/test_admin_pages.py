"""Every page of the operator's admin answers for a superuser: each registered model's list,
change page and (where adding by hand makes sense) add page. Models written only by the
service offer no Add button, and their add URL is refused instead of failing with a 500."""

from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import models
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from lifecycle.models import BaseSnapshotBuild, LifecycleEvent
from recoup.accounts.models import Account, ApiKey, Organization
from sandboxes_app.models import Sandbox, SandboxHost, Snapshot
from sessions_app.models import Session

pytestmark = pytest.mark.django_db

# What the service alone writes: adding one by hand has no meaning (and used to be a 500).
WRITTEN_BY_THE_SERVICE = {
    Session,
    Sandbox,
    Snapshot,
    LifecycleEvent,
    BaseSnapshotBuild,
    SandboxHost,
}


@pytest.fixture
def superuser() -> models.Model:
    return get_user_model().objects.create_superuser("root", "root@example.com", "unused")


@pytest.fixture
def operator(superuser) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(superuser)
    return client


@pytest.fixture
def one_of_each(superuser, owner, org) -> dict[type[models.Model], models.Model]:
    """One row of every registered model, linked the way the service links them."""
    session = Session.objects.create(account=owner.account, organization=org, title="t")
    snapshot = Snapshot.objects.create(
        kind=Snapshot.Kind.SESSION,
        storage_key="sessions/t/1.tar.zst",
        size_bytes=10,
        sha256="0" * 64,
        session=session,
        account=owner.account,
        created_at=timezone.now(),
    )
    return {
        get_user_model(): superuser,
        Group: Group.objects.create(name="operators"),
        Account: owner.account,
        Organization: org,
        ApiKey: ApiKey.objects.get(account=owner.account),
        Session: session,
        Sandbox: Sandbox.objects.create(
            name=f"sbx_{session.id}", session=session, account=owner.account, provider="local"
        ),
        Snapshot: snapshot,
        LifecycleEvent: LifecycleEvent.objects.create(
            session=session, to_state="provisioning", version=1, reason="created", actor="worker"
        ),
        SandboxHost: SandboxHost.objects.create(
            name="host-a",
            address="http://10.0.0.2:8100",
            started_at=timezone.now(),
            heartbeat_at=timezone.now(),
        ),
        BaseSnapshotBuild: BaseSnapshotBuild.objects.create(
            scope=f"org:{org.id}",
            organization=org,
            account=owner.account,
            repo_full_name="acme/app",
            clone_url="https://github.com/acme/app.git",
            finished_at=timezone.now() + timedelta(seconds=1),
        ),
    }


def admin_url(model: type[models.Model], page: str, *args: object) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{page}", args=args)


def test_every_registered_admin_page_answers_for_a_superuser(operator, one_of_each):
    assert set(admin.site._registry) == set(one_of_each), "a registered model has no row here"
    failures = []
    for model, obj in one_of_each.items():
        add_url = admin_url(model, "add")
        changelist = operator.get(admin_url(model, "changelist"))
        change = operator.get(admin_url(model, "change", obj.pk))
        add = operator.get(add_url)
        expected_add = 403 if model in WRITTEN_BY_THE_SERVICE else 200
        if (changelist.status_code, change.status_code, add.status_code) != (
            200,
            200,
            expected_add,
        ):
            failures.append((model.__name__, changelist.status_code, change.status_code, add))
        elif (add_url in changelist.content.decode()) != (expected_add == 200):
            failures.append((model.__name__, "the Add button", expected_add == 200))
    assert not failures, failures


def test_the_service_written_models_refuse_an_added_row_and_create_nothing(operator, owner):
    for model in WRITTEN_BY_THE_SERVICE:
        before = model.objects.count()

        response = operator.post(admin_url(model, "add"), {"account": str(owner.account.id)})

        assert response.status_code == 403, model.__name__
        assert model.objects.count() == before


def test_the_admin_says_it_is_recoups_and_names_its_sections(operator):
    page = operator.get(reverse("admin:index")).content.decode()

    assert "<title>Sessions, sandboxes and accounts | recoup admin</title>" in page
    assert "recoup operations" in page and "Django administration" not in page
    for section in ("Accounts", "Sessions", "Sandboxes", "Lifecycle"):
        assert f'title="Models in the {section} application"' in page, section


def test_the_organization_list_shows_the_id_sessions_are_created_with(operator, org):
    page = operator.get(admin_url(Organization, "changelist")).content.decode()

    assert f'<td class="field-id">{org.id}</td>' in page
