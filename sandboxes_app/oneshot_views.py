"""One-shot sandboxes over the API: POST /api/sandbox/destroy, a thin view over
`sandboxes_app.oneshots` (commands by id go through POST /api/sandbox/commands)."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from recoup.api import validated
from recoup.schema import ERROR_RESPONSES
from sandboxes_app import oneshots
from sandboxes_app.selectors import epoch_ms
from sandboxes_app.serializers import OneshotDestroyedSerializer, SandboxIdBodySerializer


class OneshotDestroyView(APIView):
    @extend_schema(
        operation_id="destroyOneshotSandbox",
        summary="Destroy a one-shot sandbox",
        description=(
            "Stops every process of the one-shot sandbox (one created by `POST /api/sandbox` "
            "without `sessionId`) and deletes its disk; its slot in the account's quota is "
            "free at once. Only its owner may: any other id, another account's sandbox or a "
            "session's sandbox alike, answers 404 (a session's sandbox is hibernated or "
            "archived instead). Idempotent: destroying it again answers 200 with the same "
            "`destroyedAt`. A sandbox still being created is destroyed once its clone ends "
            "(this call waits for it); a `POST /api/sandbox` that completes after the destroy "
            "answers 409. Afterwards it stays listed by `GET /api/sandboxes` as `stopped`, "
            "and commands answer 409."
        ),
        request=SandboxIdBodySerializer,
        responses={
            200: OpenApiResponse(OneshotDestroyedSerializer, "The sandbox is destroyed."),
            **ERROR_RESPONSES(
                400,
                401,
                404,
                d404="No one-shot sandbox of this account has this id.",
            ),
        },
    )
    def post(self, request: Request) -> Response:
        data = validated(SandboxIdBodySerializer, request.data)
        sandbox = oneshots.oneshot_get_owned(sandbox_id=data["sandboxId"], account=request.user)
        oneshots.oneshot_sandbox_destroy(
            sandbox=sandbox, actor=f"api:{request.user.pk}", reason="requested"
        )
        body = {
            "sandboxId": sandbox.name,
            "sandboxStatus": "stopped",
            "destroyedAt": epoch_ms(sandbox.destroyed_at),
        }
        return Response(OneshotDestroyedSerializer(body).data)
