"""The sessions API: thin views that validate, call a service or selector, and serialize."""

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from recoup.api import validated
from recoup.schema import ERROR_RESPONSES
from sandboxes_app.git.urls import parse_repo_url
from sessions_app import selectors, services
from sessions_app.serializers import (
    SessionCreateSerializer,
    SessionEnvelopeSerializer,
    SessionListQuerySerializer,
    SessionListSerializer,
    SessionUpdateSerializer,
)

_PATCH_FIELDS = {
    "title": "title",
    "status": "status",
    "linesAdded": "lines_added",
    "linesRemoved": "lines_removed",
}


def _envelope(session: object) -> dict:
    return SessionEnvelopeSerializer({"session": session}).data


class SessionCollectionView(APIView):
    @extend_schema(
        operation_id="listSessions",
        summary="List the caller's sessions, newest first",
        parameters=[SessionListQuerySerializer],
        responses={200: SessionListSerializer, **ERROR_RESPONSES(400, 401)},
    )
    def get(self, request: Request) -> Response:
        query = validated(SessionListQuerySerializer, request.query_params.dict())
        limit, offset = query["limit"], query["offset"]
        sessions = list(
            selectors.session_list(account=request.user, status=query.get("status"))[
                offset : offset + limit + 1
            ]
        )
        body = SessionListSerializer(
            {
                "sessions": sessions[:limit],
                "pagination": {"limit": limit, "offset": offset, "hasMore": len(sessions) > limit},
            }
        ).data
        return Response(body)

    @extend_schema(
        operation_id="createSession",
        summary="Create a session",
        request=SessionCreateSerializer,
        responses={201: SessionEnvelopeSerializer, **ERROR_RESPONSES(400, 401, 403, 404)},
    )
    def post(self, request: Request) -> Response:
        data = validated(SessionCreateSerializer, request.data)
        repo = parse_repo_url(data["repoUrl"]) if data.get("repoUrl") else None
        session = services.session_create(
            account=request.user,
            title=data.get("title"),
            organization_id=data.get("organizationId"),
            artist_id=data.get("artistId"),
            repo=repo,
        )
        return Response(_envelope(session), status=status.HTTP_201_CREATED)


class SessionDetailView(APIView):
    @extend_schema(
        operation_id="getSession",
        summary="Get session by id",
        description="Returns a single agent session by its id.",
        parameters=[
            OpenApiParameter(
                "session_id",
                str,
                OpenApiParameter.PATH,
                description="The id of the session to fetch.",
            )
        ],
        responses={
            200: OpenApiResponse(SessionEnvelopeSerializer, "Session retrieved successfully"),
            **ERROR_RESPONSES(401, 403, 404),
        },
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get_owned(session_id=session_id, account=request.user)
        return Response(_envelope(session))

    @extend_schema(
        operation_id="updateSession",
        summary="Update a session's title, status or diff stats",
        parameters=[OpenApiParameter("session_id", str, OpenApiParameter.PATH)],
        request=SessionUpdateSerializer,
        responses={200: SessionEnvelopeSerializer, **ERROR_RESPONSES(400, 401, 403, 404, 409)},
    )
    def patch(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get_owned(session_id=session_id, account=request.user)
        data = validated(SessionUpdateSerializer, request.data)
        session = services.session_update(
            session=session,
            fields={field: data[key] for key, field in _PATCH_FIELDS.items() if key in data},
            actor=f"api:{request.user.pk}",
        )
        return Response(_envelope(session))
