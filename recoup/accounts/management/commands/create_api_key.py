from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from recoup.accounts.services import account_get_or_create, api_key_issue, organization_join


class Command(BaseCommand):
    help = (
        "Create an API key (and the account, organization and membership when missing). "
        "The raw key is printed alone on the last line of standard output."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--email", required=True)
        parser.add_argument("--org", help="organization slug to create or join; its id is printed")
        parser.add_argument("--label", default="")
        parser.add_argument("--expires-days", type=int, default=None)

    def handle(
        self,
        *args: object,
        email: str,
        org: str | None,
        label: str,
        expires_days: int | None,
        **options: object,
    ) -> None:
        if expires_days is not None and expires_days < 1:
            raise CommandError("--expires-days must be at least 1")
        expires_at = timezone.now() + timedelta(days=expires_days) if expires_days else None
        with transaction.atomic():
            account = account_get_or_create(email=email)
            organization = organization_join(account=account, slug=org) if org else None
            issued = api_key_issue(account=account, label=label, expires_at=expires_at)
        # The organization's id is what POST /api/sessions takes as organizationId; the API has
        # no other place that shows it.
        self.stdout.write(
            f"Created key {issued.api_key.prefix}… for {account.email} (account {account.id})"
            + (
                f" in organization {organization.slug} (organizationId {organization.id})"
                if organization
                else ""
            )
        )
        self.stdout.write(issued.raw_key)
