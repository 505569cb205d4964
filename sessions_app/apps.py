from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Sessions"
