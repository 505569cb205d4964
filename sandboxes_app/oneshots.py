"""One-shot sandboxes: the legacy path, a sandbox bound to an account and no session.

The id `POST /api/sandbox` answers (`sbx_` + 64 random bits) is how its owner runs commands in
it and destroys it; its expiry destroys it otherwise (`lifecycle.sweeps`). It has no lifecycle
of its own: `status` says pending, running or failed while it lives, and `destroyed_at` that
its runtime and disk are gone.

Every lookup is scoped to the caller's account, so another account's sandbox answers exactly
as a missing one does.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from recoup.accounts.git_tokens import git_token_for_clone
from recoup.accounts.models import Account
from recoup.db import release_db_connection
from recoup.errors import Conflict, NotFound, UpstreamError
from recoup.waits import waiting_slot
from sandboxes_app.git.commands import public_text
from sandboxes_app.git.urls import RepoRef
from sandboxes_app.models import Sandbox, oneshot_sandbox_name
from sandboxes_app.providers.base import CommandResult, GitSource, ProviderError, get_provider
from sandboxes_app.quotas import command_slot, sandbox_quota_check
from sandboxes_app.services import Ready

logger = logging.getLogger("recoup.sandboxes")


def oneshot_sandbox_create(*, account: Account, repo: RepoRef) -> Ready:
    """Create a sandbox bound to the account only, destroyed when its timeout passes."""
    provider = get_provider()
    name = oneshot_sandbox_name()
    with transaction.atomic():
        sandbox_quota_check(account_id=account.id, organization_id=None)
        sandbox = Sandbox.objects.create(
            name=name,
            account=account,
            provider=provider.name,
            repo_full_name=repo.full_name,
            expires_at=timezone.now() + timedelta(seconds=settings.SANDBOX_TIMEOUT),
        )
    try:
        # No organization: only owners GITHUB_TOKEN_OWNERS allows get the service's token.
        token = git_token_for_clone(organization_id=None, owner=repo.owner)
        release_db_connection()  # a clone may take minutes
        info = provider.create(name=name, source=GitSource(clone_url=repo.clone_url, token=token))
    except ProviderError as exc:
        provider.destroy(name=name)
        # Nothing of it is left: recorded destroyed, so it holds no quota slot until expiry.
        now = timezone.now()
        Sandbox.objects.filter(id=sandbox.id, destroyed_at__isnull=True).update(
            status=Sandbox.Status.FAILED, stopped_at=now, destroyed_at=now
        )
        raise UpstreamError(f"The sandbox provider failed: {public_text(str(exc))}") from exc
    started = Sandbox.objects.filter(
        id=sandbox.id, status=Sandbox.Status.PENDING, destroyed_at__isnull=True
    ).update(status=Sandbox.Status.RUNNING, branch=info.branch, boot=info.boot)
    if not started:
        # Destroyed (by its owner, an operator or the sweep) while the clone ran: the teardown
        # may have run before this runtime existed, so take it down here too.
        provider.destroy(name=name)
        raise Conflict(f"Sandbox {name} was destroyed while it was being created")
    sandbox.refresh_from_db()
    return Ready(sandbox=sandbox, branch=info.branch, mode=provider.name, ready_at=timezone.now())


def oneshot_get_owned(*, sandbox_id: str, account: Account) -> Sandbox:
    """The account's one-shot sandbox named `sandbox_id` (destroyed or not); 404 otherwise, the
    same for another account's sandbox, a session's sandbox and a name that never existed."""
    sandbox = None
    if "\x00" not in sandbox_id:  # PostgreSQL refuses a NUL in a query; no name holds one
        sandbox = (
            Sandbox.objects.filter(name=sandbox_id, account=account, session__isnull=True)
            .order_by("-created_at", "-id")
            .first()
        )
    if sandbox is None:
        raise NotFound(f"One-shot sandbox {sandbox_id} not found")
    return sandbox


def oneshot_require_running(sandbox: Sandbox) -> None:
    """409 unless the sandbox can run a command now."""
    if sandbox.destroyed_at is not None:
        raise Conflict(f"Sandbox {sandbox.name} was destroyed; POST /api/sandbox to create another")
    if sandbox.expires_at is not None and sandbox.expires_at <= timezone.now():
        raise Conflict(f"Sandbox {sandbox.name} has expired and is being destroyed")
    if sandbox.status != Sandbox.Status.RUNNING:
        raise Conflict(f"Sandbox {sandbox.name} is {sandbox.status}, not running")


def oneshot_command_run(
    *,
    sandbox: Sandbox,
    argv: list[str],
    cwd: str | None,
    env: dict[str, str] | None,
    timeout_s: float | None,
) -> CommandResult:
    """Run a command in a running one-shot sandbox, holding one of its account's command slots
    (429 when none is free, before any effect). One-shot sandboxes have no idle clock."""
    oneshot_require_running(sandbox)
    with command_slot(account_id=sandbox.account_id, organization_id=None, timeout_s=timeout_s):
        release_db_connection()
        try:
            with waiting_slot():
                return get_provider().run(
                    name=sandbox.name, argv=argv, cwd=cwd, env=env, timeout_s=timeout_s
                )
        except ProviderError as exc:
            # Destroyed while we were starting the command: say so, not "the provider failed".
            sandbox.refresh_from_db()
            oneshot_require_running(sandbox)
            raise UpstreamError(f"The sandbox provider failed: {public_text(str(exc))}") from exc


def oneshot_sandbox_destroy(*, sandbox: Sandbox, actor: str, reason: str) -> bool:
    """Stop the one-shot sandbox's processes, delete its disk, then record it destroyed.

    True when this call recorded the destruction; False when it already was (idempotent).
    The provider's teardown is idempotent and serialized per sandbox by its lock (it waits for
    a create in progress), so concurrent callers may all run it; the compare-and-set on
    `destroyed_at` lets exactly one record it. Torn down first, recorded second: a crash in
    between leaves a live row without a runtime, which the next destroy or the expiry sweep
    finishes, never a destroyed row whose processes still run.
    """
    if sandbox.session_id is not None:
        raise ValueError(f"{sandbox.name} belongs to a session; hibernate or archive it instead")
    if sandbox.destroyed_at is not None:
        return False
    provider = get_provider()
    # Its detached commands die with it: stopped first, their exits are recorded before their
    # records go with the sandbox's directory.
    provider.stop(name=sandbox.name)
    from sandboxes_app.commands import commands_settle  # it imports this module

    commands_settle(sandbox_name=sandbox.name)
    provider.destroy(name=sandbox.name)
    recorded = Sandbox.objects.filter(id=sandbox.id, session__isnull=True).mark_destroyed() == 1
    if recorded:
        logger.info("oneshot destroyed sandbox=%s reason=%s actor=%s", sandbox.name, reason, actor)
    sandbox.refresh_from_db()
    return recorded
