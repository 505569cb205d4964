from django.urls import path

from sessions_app.views import SessionCollectionView, SessionDetailView

urlpatterns = [
    path("sessions", SessionCollectionView.as_view(), name="sessions"),
    path("sessions/<str:session_id>", SessionDetailView.as_view(), name="session-detail"),
]
