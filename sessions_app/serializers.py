"""The contract's `Session` schema (seed 003), and the request bodies of the sessions API."""

from rest_framework import serializers

from lifecycle.states import LifecycleState
from recoup.fields import StrictCharField, StrictIntegerField, StrictUUIDField
from sessions_app.models import Session


class SessionSerializer(serializers.ModelSerializer):
    userId = serializers.UUIDField(source="account_id")
    artistId = serializers.UUIDField(source="artist_id", allow_null=True)
    repoOwner = serializers.CharField(source="repo_owner", allow_null=True, required=False)
    repoName = serializers.CharField(source="repo_name", allow_null=True, required=False)
    branch = serializers.CharField(allow_null=True, required=False)
    cloneUrl = serializers.CharField(source="clone_url", allow_null=True, required=False)
    isNewBranch = serializers.BooleanField(source="is_new_branch")
    globalSkillRefs = serializers.ListField(
        source="global_skill_refs", child=serializers.DictField()
    )
    sandboxState = serializers.DictField(source="sandbox_state", allow_null=True, required=False)
    lifecycleState = serializers.ChoiceField(
        source="lifecycle_state", choices=LifecycleState.choices, allow_null=True, required=False
    )
    lifecycleVersion = serializers.IntegerField(source="lifecycle_version")
    lastActivityAt = serializers.DateTimeField(
        source="last_activity_at", allow_null=True, required=False
    )
    sandboxExpiresAt = serializers.DateTimeField(
        source="sandbox_expires_at", allow_null=True, required=False
    )
    hibernateAfter = serializers.DateTimeField(
        source="hibernate_after", allow_null=True, required=False
    )
    lifecycleRunId = serializers.CharField(
        source="lifecycle_run_id", allow_null=True, required=False
    )
    lifecycleError = serializers.CharField(
        source="lifecycle_error", allow_null=True, required=False
    )
    linesAdded = serializers.IntegerField(source="lines_added", allow_null=True, required=False)
    linesRemoved = serializers.IntegerField(source="lines_removed", allow_null=True, required=False)
    snapshotUrl = serializers.CharField(source="snapshot_url", allow_null=True, required=False)
    snapshotCreatedAt = serializers.DateTimeField(
        source="snapshot_created_at", allow_null=True, required=False
    )
    snapshotSizeBytes = serializers.IntegerField(
        source="snapshot_size_bytes", allow_null=True, required=False
    )
    cachedDiff = serializers.DictField(source="cached_diff", allow_null=True, required=False)
    cachedDiffUpdatedAt = serializers.DateTimeField(
        source="cached_diff_updated_at", allow_null=True, required=False
    )
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    class Meta:
        model = Session
        fields = [
            "id",
            "userId",
            "artistId",
            "title",
            "status",
            "repoOwner",
            "repoName",
            "branch",
            "cloneUrl",
            "isNewBranch",
            "globalSkillRefs",
            "sandboxState",
            "lifecycleState",
            "lifecycleVersion",
            "lastActivityAt",
            "sandboxExpiresAt",
            "hibernateAfter",
            "lifecycleRunId",
            "lifecycleError",
            "linesAdded",
            "linesRemoved",
            "snapshotUrl",
            "snapshotCreatedAt",
            "snapshotSizeBytes",
            "cachedDiff",
            "cachedDiffUpdatedAt",
            "createdAt",
            "updatedAt",
        ]
        # The model default makes `status` optional for input; the contract requires it on output.
        extra_kwargs = {"status": {"required": True}}


class SessionEnvelopeSerializer(serializers.Serializer):
    session = SessionSerializer()


class PaginationSerializer(serializers.Serializer):
    limit = serializers.IntegerField()
    offset = serializers.IntegerField()
    hasMore = serializers.BooleanField()


class SessionListSerializer(serializers.Serializer):
    sessions = SessionSerializer(many=True)
    pagination = PaginationSerializer()


class SessionCreateSerializer(serializers.Serializer):
    title = StrictCharField(required=False, allow_blank=True, allow_null=True, max_length=300)
    organizationId = StrictUUIDField(required=False, allow_null=True)
    artistId = StrictUUIDField(required=False, allow_null=True)
    repoUrl = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=200)


class SessionUpdateSerializer(serializers.Serializer):
    title = StrictCharField(required=False, allow_blank=False, max_length=300)
    status = serializers.ChoiceField(required=False, choices=Session.Status.choices)
    # The columns are 32-bit integers on PostgreSQL; a larger value must be a 400, not a 500.
    linesAdded = StrictIntegerField(required=False, min_value=0, max_value=2**31 - 1)
    linesRemoved = StrictIntegerField(required=False, min_value=0, max_value=2**31 - 1)


class SessionListQuerySerializer(serializers.Serializer):
    status = serializers.ChoiceField(required=False, choices=Session.Status.choices)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=50)
    # Bounded so offset + limit stays inside the database's integer range (else a 500).
    offset = serializers.IntegerField(required=False, min_value=0, max_value=2**31 - 1, default=0)
