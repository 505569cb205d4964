from django.conf import settings
from rest_framework.throttling import UserRateThrottle


class AccountRateThrottle(UserRateThrottle):
    """Per-account request rate; the rate is read per request so it follows settings."""

    def get_rate(self) -> str:
        return settings.API_RATE_LIMIT
