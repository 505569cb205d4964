"""Request and response bodies of the session sandbox endpoints (seeds 000-002, 004)."""

from rest_framework import serializers

from lifecycle.states import LifecycleState
from recoup.fields import StrictBooleanField, StrictCharField, StrictIntegerField
from sandboxes_app.providers.base import MAX_ENV_VALUE, MAX_ENV_VARS, env_problem
from sessions_app.models import PROVISIONING_PHASES

# --- shared ---------------------------------------------------------------------------------


class SandboxLifecycleSerializer(serializers.Serializer):
    serverTime = serializers.IntegerField(help_text="Server's current epoch milliseconds.")
    state = serializers.ChoiceField(choices=LifecycleState.choices, allow_null=True)
    lastActivityAt = serializers.IntegerField(allow_null=True)
    hibernateAfter = serializers.IntegerField(allow_null=True)
    sandboxExpiresAt = serializers.IntegerField(allow_null=True)

    class Meta:
        ref_name = "SandboxLifecycle"


class SessionIdQuerySerializer(serializers.Serializer):
    sessionId = serializers.CharField(
        required=True, max_length=64, help_text="The id of the session."
    )


class SessionIdBodySerializer(serializers.Serializer):
    sessionId = StrictCharField(required=True, max_length=64)


# --- POST /api/sandbox ----------------------------------------------------------------------


class CreateSandboxRequestSerializer(serializers.Serializer):
    repoUrl = StrictCharField(
        required=True,
        allow_blank=True,
        help_text="GitHub repository URL the sandbox should clone (https://github.com/owner/repo).",
    )
    sessionId = StrictCharField(
        required=False,
        max_length=64,
        help_text="Owning session id. When omitted, a one-shot sandbox is created (legacy).",
    )

    class Meta:
        ref_name = "CreateSandboxRequest"


class TimingSerializer(serializers.Serializer):
    readyMs = serializers.IntegerField()


class CreateSandboxResponseSerializer(serializers.Serializer):
    createdAt = serializers.IntegerField(help_text="Epoch ms when the sandbox handle was returned.")
    timeout = serializers.IntegerField(help_text="Sandbox idle timeout in milliseconds.")
    currentBranch = serializers.CharField()
    mode = serializers.ChoiceField(
        choices=[("vercel", "vercel"), ("local", "local")],
        help_text="Sandbox provider: `local` (bubblewrap on this host) or `vercel`.",
    )
    timing = TimingSerializer()
    sandboxId = serializers.CharField(
        required=False,
        help_text=(
            "Present for a one-shot sandbox (no `sessionId`) only: its id, for "
            "`POST /api/sandbox/commands` and `POST /api/sandbox/destroy`, and as `sandboxId` "
            "in `GET /api/sandboxes`. A session's sandbox is addressed by its session."
        ),
    )

    class Meta:
        ref_name = "CreateSandboxResponse"


# --- status / reconnect ---------------------------------------------------------------------


class ProvisioningSerializer(serializers.Serializer):
    phase = serializers.ChoiceField(
        choices=[(phase, phase) for phase in PROVISIONING_PHASES],
        help_text=(
            "`queued` (claimed, the provider has not started), `cloning`, `checkout`, "
            "`from_base` (layered on the organization's base snapshot instead of a clone), "
            "`starting` (the sandbox's init; a resume's extraction), `active`."
        ),
    )
    percent = serializers.IntegerField(
        allow_null=True,
        min_value=0,
        max_value=100,
        help_text="git's own percent while cloning or checking out, never going back; else null.",
    )

    class Meta:
        ref_name = "Provisioning"


class SandboxStatusResponseSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=[("active", "active"), ("no_sandbox", "no_sandbox")])
    hasSnapshot = serializers.BooleanField()
    lifecycleVersion = serializers.IntegerField()
    lifecycle = SandboxLifecycleSerializer()
    provisioning = ProvisioningSerializer(
        required=False,
        allow_null=True,
        help_text=(
            "Additive (not in the published contract): how far the run that provisions or "
            "restores the sandbox is, while `lifecycle.state` is `provisioning` or `restoring` "
            "and a run has claimed it; null otherwise. GET /api/sandbox/events pushes each "
            "change."
        ),
    )

    class Meta:
        ref_name = "SandboxStatusResponse"


class HibernateAcceptedSerializer(SandboxStatusResponseSerializer):
    requestedState = serializers.ChoiceField(
        choices=[("hibernated", "hibernated"), ("archived", "archived")],
        help_text=(
            "The state this request asked for (`archived` when the session is archived). "
            "`lifecycle.state` is the state now: a request that found the sandbox being "
            "provisioned or resumed is recorded and carried out once it is ready."
        ),
    )

    class Meta:
        ref_name = "HibernateAccepted"


class ReconnectResponseSerializer(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=[("connected", "connected"), ("expired", "expired"), ("no_sandbox", "no_sandbox")]
    )
    hasSnapshot = serializers.BooleanField()
    expiresAt = serializers.IntegerField(required=False)
    lifecycle = SandboxLifecycleSerializer()

    class Meta:
        ref_name = "ReconnectResponse"


# --- commands -------------------------------------------------------------------------------


class SessionOrSandboxScope:
    """A mixin for a serializer with `sessionId` and `sandboxId` (a one-shot sandbox): one of
    the two, and sessionId stays required, with the usual error, unless the request names a
    one-shot."""

    def get_fields(self) -> dict:
        fields = super().get_fields()
        data = getattr(self, "initial_data", None)
        if isinstance(data, dict) and "sandboxId" not in data:
            fields["sessionId"].required = True
        return fields

    def validate(self, attrs: dict) -> dict:
        if "sessionId" in attrs and "sandboxId" in attrs:
            raise serializers.ValidationError(
                {"sandboxId": "give either sessionId or sandboxId, not both"}
            )
        return super().validate(attrs)


class CommandRequestSerializer(SessionOrSandboxScope, serializers.Serializer):
    sessionId = StrictCharField(
        required=False,
        max_length=64,
        help_text="The session whose sandbox runs the command. Required unless `sandboxId`.",
    )
    sandboxId = StrictCharField(
        required=False,
        max_length=64,
        help_text=(
            "Instead of `sessionId`: the id `POST /api/sandbox` returned for a one-shot sandbox "
            "(one created without a session). Give one of the two, not both."
        ),
    )
    cmd = StrictCharField(
        required=True,
        max_length=4096,
        help_text="Program to run; use `sh` with args `-c`, script for a shell.",
    )
    args = serializers.ListField(
        child=StrictCharField(allow_blank=True, max_length=131072), required=False, max_length=1024
    )
    cwd = StrictCharField(
        required=False,
        max_length=4096,
        help_text="Working directory inside /workspace (default /workspace).",
    )
    env = serializers.DictField(
        child=StrictCharField(allow_blank=True, max_length=MAX_ENV_VALUE),
        required=False,
        help_text=(
            "Variables set for the command only, over the defaults (PATH, HOME, LANG, USER). "
            f"Names match [A-Za-z_][A-Za-z0-9_]*; at most {MAX_ENV_VARS} variables, "
            f"{MAX_ENV_VALUE} bytes a value, no NUL. They reach only the command, inside the "
            "sandbox."
        ),
    )
    timeoutMs = StrictIntegerField(
        required=False,
        min_value=1,
        help_text=(
            "Kill the command's whole tree after this many milliseconds, at most "
            "SANDBOX_COMMAND_MAX_TIMEOUT. Default SANDBOX_COMMAND_TIMEOUT, or "
            "SANDBOX_COMMAND_MAX_TIMEOUT for a detached command."
        ),
    )
    detached = StrictBooleanField(
        required=False,
        default=False,
        help_text=(
            "Answer 202 with the command's id at once and let it run on: follow it at "
            "`GET /api/sandbox/commands/{commandId}` and its `/logs`, end it with `/kill`."
        ),
    )

    def validate_env(self, value: dict) -> dict:
        problem = env_problem(value)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value


class CommandResponseSerializer(serializers.Serializer):
    exitCode = serializers.IntegerField(
        allow_null=True, help_text="null when the command was killed on timeout"
    )
    stdout = serializers.CharField(allow_blank=True)
    stderr = serializers.CharField(allow_blank=True)
    durationMs = serializers.IntegerField()
    timedOut = serializers.BooleanField()
    truncated = serializers.BooleanField()


# --- one-shot sandboxes ---------------------------------------------------------------------


class SandboxIdBodySerializer(serializers.Serializer):
    sandboxId = StrictCharField(
        required=True,
        max_length=64,
        help_text="The id `POST /api/sandbox` returned for the one-shot sandbox.",
    )


class OneshotDestroyedSerializer(serializers.Serializer):
    sandboxId = serializers.CharField()
    sandboxStatus = serializers.ChoiceField(
        choices=[("stopped", "stopped")],
        help_text="Always `stopped`: its processes and disk are gone.",
    )
    destroyedAt = serializers.IntegerField(
        help_text="Epoch milliseconds when it was destroyed (the first call's time on a repeat)."
    )

    class Meta:
        ref_name = "OneshotDestroyed"


# --- legacy /api/sandboxes ------------------------------------------------------------------


class LegacySandboxSerializer(serializers.Serializer):
    sandboxId = serializers.CharField()
    sandboxStatus = serializers.ChoiceField(
        choices=[(s, s) for s in ("pending", "running", "stopping", "stopped", "failed")]
    )
    timeout = serializers.IntegerField()
    createdAt = serializers.DateTimeField()
    runId = serializers.CharField(required=False)

    class Meta:
        ref_name = "Sandbox"


class FileTreeEntrySerializer(serializers.Serializer):
    path = serializers.CharField()
    type = serializers.ChoiceField(choices=[("blob", "blob"), ("tree", "tree")])
    sha = serializers.CharField()
    size = serializers.IntegerField(required=False)

    class Meta:
        ref_name = "FileTreeEntry"


class SandboxesResponseSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=[("success", "success"), ("error", "error")])
    sandboxes = LegacySandboxSerializer(many=True)
    snapshot_id = serializers.CharField(allow_null=True, required=False)
    github_repo = serializers.CharField(allow_null=True, required=False)
    filetree = FileTreeEntrySerializer(many=True, allow_null=True, required=False)
    error = serializers.CharField(required=False)

    class Meta:
        ref_name = "SandboxesResponse"


class SandboxesQuerySerializer(serializers.Serializer):
    sandbox_id = serializers.CharField(required=False, max_length=64)
    account_id = serializers.UUIDField(required=False)
