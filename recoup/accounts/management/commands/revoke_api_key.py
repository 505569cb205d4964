from django.core.management.base import BaseCommand, CommandError, CommandParser

from recoup.accounts.services import api_key_revoke


class Command(BaseCommand):
    help = (
        "Revoke API keys by their display prefix (the 8 characters after recoup_sk_, "
        "with or without recoup_sk_) or by id."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix_or_id")

    def handle(self, *args: object, prefix_or_id: str, **options: object) -> None:
        revoked = api_key_revoke(prefix_or_id=prefix_or_id)
        if revoked == 0:
            raise CommandError(f"No live API key matches {prefix_or_id!r}")
        self.stdout.write(f"Revoked {revoked} key(s)")
