"""GET /api/sandboxes (seed 004): the legacy account-scoped listing, with its own envelope."""

import logging

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from recoup.accounts.git_tokens import git_token_for_clone
from recoup.accounts.models import Account
from recoup.api import validated
from recoup.errors import Forbidden
from recoup.schema import ERROR_RESPONSES
from sandboxes_app import selectors
from sandboxes_app.providers.base import GitSource, ProviderError, get_provider
from sandboxes_app.serializers import SandboxesQuerySerializer, SandboxesResponseSerializer
from sessions_app.models import Session

logger = logging.getLogger(__name__)


class SandboxesView(APIView):
    error_envelope = "legacy"

    @extend_schema(
        operation_id="listSandboxes",
        summary="List sandboxes",
        description=(
            "The account's sandboxes (session and one-shot), newest first. `account_id` may "
            "name the caller or an account sharing an organization with it; 403 otherwise."
        ),
        parameters=[SandboxesQuerySerializer],
        responses={
            200: OpenApiResponse(SandboxesResponseSerializer, "Sandboxes retrieved successfully"),
            **ERROR_RESPONSES(400, 401, 403, legacy=True),
        },
    )
    def get(self, request: Request) -> Response:
        query = validated(SandboxesQuerySerializer, request.query_params.dict())
        account = request.user
        if "account_id" in query and query["account_id"] != account.id:
            account = (
                selectors.accounts_visible_to(request.user).filter(id=query["account_id"]).first()
            )
            if account is None:
                raise Forbidden("account_id is not an account you have access to")
        sandboxes = selectors.account_sandboxes(account=account, sandbox_id=query.get("sandbox_id"))
        snapshot = selectors.account_latest_snapshot(account=account)
        repo = selectors.account_latest_repo(account=account)
        body = {
            "status": "success",
            "sandboxes": [self._sandbox(sandbox) for sandbox in sandboxes],
            "snapshot_id": snapshot.public_id if snapshot else None,
            "github_repo": f"https://github.com/{repo}" if repo else None,
            "filetree": self._filetree(repo, account=account, viewer=request.user),
        }
        return Response(SandboxesResponseSerializer(body).data)

    @staticmethod
    def _sandbox(sandbox: object) -> dict:
        entry = {
            "sandboxId": sandbox.name,
            "sandboxStatus": selectors.legacy_sandbox_status(sandbox),
            "timeout": selectors.legacy_sandbox_timeout_ms(sandbox),
            "createdAt": sandbox.created_at,
        }
        if sandbox.run_id:
            entry["runId"] = sandbox.run_id
        return entry

    @staticmethod
    def _filetree(repo: str | None, *, account: Account, viewer: Account) -> list[dict] | None:
        if repo is None:
            return None
        from sandboxes_app.git.urls import parse_repo_url

        try:
            ref = parse_repo_url(f"https://github.com/{repo}")
            # The organization whose git access may read it: that of the account's newest
            # session on the repository, and only when the viewer belongs to it as well.
            session = (
                Session.objects.filter(
                    account=account,
                    repo_owner=ref.owner,
                    repo_name=ref.name,
                    organization__memberships__account=viewer,
                )
                .order_by("-created_at")
                .first()
            )
            token = git_token_for_clone(
                organization_id=session.organization_id if session else None, owner=ref.owner
            )
            source = GitSource(clone_url=ref.clone_url, token=token)
            entries = get_provider().file_tree(source=source)
        except ProviderError as exc:
            logger.warning("file tree of %s unavailable: %s", repo, exc)
            return None
        return [
            {
                "path": e.path,
                "type": e.type,
                "sha": e.sha,
                **({"size": e.size} if e.size is not None else {}),
            }
            for e in entries
        ]
