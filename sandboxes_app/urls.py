from django.urls import path

from sandboxes_app.command_views import CommandKillView, CommandLogsView, CommandView
from sandboxes_app.event_views import SandboxEventsView
from sandboxes_app.legacy_views import SandboxesView
from sandboxes_app.oneshot_views import OneshotDestroyView
from sandboxes_app.poll import sandbox_status
from sandboxes_app.views import (
    SandboxActivityView,
    SandboxCommandView,
    SandboxExtendView,
    SandboxHibernateView,
    SandboxReconnectView,
    SandboxView,
)

urlpatterns = [
    path("sandbox", SandboxView.as_view(), name="sandbox"),
    path("sandbox/status", sandbox_status, name="sandbox-status"),
    path("sandbox/reconnect", SandboxReconnectView.as_view(), name="sandbox-reconnect"),
    path("sandbox/commands", SandboxCommandView.as_view(), name="sandbox-commands"),
    path("sandbox/commands/<str:command_id>", CommandView.as_view(), name="sandbox-command"),
    path(
        "sandbox/commands/<str:command_id>/logs",
        CommandLogsView.as_view(),
        name="sandbox-command-logs",
    ),
    path(
        "sandbox/commands/<str:command_id>/kill",
        CommandKillView.as_view(),
        name="sandbox-command-kill",
    ),
    path("sandbox/activity", SandboxActivityView.as_view(), name="sandbox-activity"),
    path("sandbox/extend", SandboxExtendView.as_view(), name="sandbox-extend"),
    path("sandbox/hibernate", SandboxHibernateView.as_view(), name="sandbox-hibernate"),
    path("sandbox/destroy", OneshotDestroyView.as_view(), name="sandbox-destroy"),
    path("sandboxes", SandboxesView.as_view(), name="sandboxes"),
    path("sandbox/events", SandboxEventsView.as_view(), name="sandbox-events"),
]
