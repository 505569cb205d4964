"""Request and response bodies of the detached command endpoints."""

from rest_framework import serializers

from recoup.fields import StrictCharField
from sandboxes_app.serializers import SessionOrSandboxScope

_SESSION_HELP = "The session whose sandbox runs the command. Required unless `sandboxId`."
_SANDBOX_HELP = "Instead of `sessionId`: the one-shot sandbox that runs the command."


class CommandScopeQuerySerializer(SessionOrSandboxScope, serializers.Serializer):
    sessionId = serializers.CharField(required=False, max_length=64, help_text=_SESSION_HELP)
    sandboxId = serializers.CharField(required=False, max_length=64, help_text=_SANDBOX_HELP)


class CommandScopeBodySerializer(SessionOrSandboxScope, serializers.Serializer):
    sessionId = StrictCharField(required=False, max_length=64, help_text=_SESSION_HELP)
    sandboxId = StrictCharField(required=False, max_length=64, help_text=_SANDBOX_HELP)


class DetachedCommandStartedSerializer(serializers.Serializer):
    commandId = serializers.CharField(help_text="`cmd_` and 32 hex digits.")
    startedAt = serializers.IntegerField(help_text="Epoch milliseconds.")

    class Meta:
        ref_name = "DetachedCommandStarted"


class DetachedCommandSerializer(DetachedCommandStartedSerializer):
    cmd = serializers.CharField()
    args = serializers.ListField(child=serializers.CharField(allow_blank=True))
    exitCode = serializers.IntegerField(
        allow_null=True,
        help_text="null while it runs, and when it was killed or timed out (see the flags).",
    )
    finishedAt = serializers.IntegerField(
        allow_null=True, help_text="Epoch milliseconds; null while it runs."
    )
    timedOut = serializers.BooleanField(help_text="Killed at its timeoutMs.")
    killed = serializers.BooleanField(
        help_text=(
            "Killed by POST .../kill, or with its sandbox (hibernated, destroyed, its host "
            "restarted)."
        )
    )

    class Meta:
        ref_name = "DetachedCommand"
