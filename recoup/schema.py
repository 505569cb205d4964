"""drf-spectacular pieces: one authentication extension per auth class, the error envelopes."""

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ApiKeyAuthScheme(OpenApiAuthenticationExtension):
    target_class = "recoup.accounts.authentication.ApiKeyHeaderAuthentication"
    name = "ApiKeyAuth"

    def get_security_definition(self, auto_schema: object) -> dict:
        return {"type": "apiKey", "in": "header", "name": "x-api-key"}


class BearerAuthScheme(OpenApiAuthenticationExtension):
    target_class = "recoup.accounts.authentication.BearerAuthentication"
    name = "BearerAuth"

    def get_security_definition(self, auto_schema: object) -> dict:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key (`recoup_sk_...`) or an OIDC JWT when OIDC is configured.",
        }


class ConsoleSessionAuthScheme(OpenApiAuthenticationExtension):
    target_class = "recoup.console.auth.ConsoleSessionAuthentication"
    name = "ConsoleSession"

    def get_security_definition(self, auto_schema: object) -> dict:
        return {
            "type": "apiKey",
            "in": "cookie",
            "name": settings.SESSION_COOKIE_NAME,
            "description": "The console's session, after signing in at `/` with an API key. "
            "Unsafe methods also need the CSRF token in `X-CSRFToken` (403 without it).",
        }


class ErrorSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=[("error", "error")], help_text='Always "error".')
    error = serializers.CharField(help_text="Human-readable error message.")

    class Meta:
        ref_name = "Error"


class LegacyErrorSerializer(serializers.Serializer):
    error = serializers.CharField(help_text="Error message describing what went wrong")

    class Meta:
        ref_name = "SandboxErrorResponse"


_DESCRIPTIONS = {
    400: "Invalid request: malformed JSON or a field with a wrong type or value.",
    401: "Unauthorized — invalid or missing API key / Bearer token.",
    403: "Forbidden — the authenticated account does not own this resource.",
    404: "Not found.",
    409: "Conflict with the session's current lifecycle state.",
    413: "Request body larger than API_MAX_BODY_BYTES.",
    429: "Too many requests: over a rate limit or an account quota; see Retry-After.",
    502: "Upstream error — the sandbox provider failed.",
    503: "Another run is still working on this session past SANDBOX_PROVISION_WAIT; see "
    "Retry-After.",
}


def ERROR_RESPONSES(*codes: int, legacy: bool = False, **descriptions: str) -> dict:  # noqa: N802
    """`{code: OpenApiResponse(Error)}` for each code, for an `@extend_schema(responses=...)`."""
    serializer = LegacyErrorSerializer if legacy else ErrorSerializer
    return {
        code: OpenApiResponse(serializer, descriptions.get(f"d{code}", _DESCRIPTIONS[code]))
        for code in codes
    }
