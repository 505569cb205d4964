from django.urls import path

from recoup.console import views

app_name = "console"

urlpatterns = [
    path("", views.home, name="home"),
    path("signin", views.sign_in, name="signin"),
    path("signout", views.sign_out, name="signout"),
    path("sessions", views.new_session, name="new-session"),
    path("sessions/<str:session_id>", views.session_page, name="session"),
]
